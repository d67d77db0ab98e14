"""Pooling layers over NCHW input: MaxPool2D, AvgPool2D, GlobalAvgPool2D."""
from __future__ import annotations

from ..kernels import pooling as K
from .base import Layer, check_input
from .conv import as_pair, fmt_pair, image_input


class _Pool2D(Layer):
    _kind = ""

    def __init__(self, pool_size=2, strides=None, padding=0, name: str | None = None):
        super().__init__(name)
        owner = type(self).__name__
        self.pool_size = as_pair(pool_size, "pool_size", owner)
        self.strides = self.pool_size if strides is None else as_pair(strides, "strides", owner)
        if isinstance(padding, str) and padding.lower() == "valid":
            padding = 0
        self.padding = as_pair(padding, "padding", owner, minimum=0)
        if any(2 * p > k for p, k in zip(self.padding, self.pool_size)):
            raise ValueError(f"{owner}: padding {self.padding} must be at most half of "
                             f"pool_size {self.pool_size} (as in PyTorch)")
        self._cache = None

    def _build(self, input_shape, rng):
        c, h, w = image_input(self, input_shape)
        try:
            _, _, oh, ow = K.pool_output_shape((1, c, h, w), self.pool_size, self.strides,
                                               self.padding)
        except ValueError as exc:
            raise ValueError(f"{type(self).__name__} layer {self.name!r}: {exc}") from None
        return (c, oh, ow)

    def describe(self):
        parts = [fmt_pair(self.pool_size)]
        if self.strides != self.pool_size:
            parts.append(f"strides={fmt_pair(self.strides)}")
        if self.padding != (0, 0):
            parts.append(f"padding={fmt_pair(self.padding)}")
        return ", ".join(parts)

    _kernels = ""  # kernels/pooling.py's <name>_forward and <name>_backward

    def forward(self, x, training=False):
        check_input(self, x)
        y, self._cache = getattr(K, f"{self._kernels}_forward")(x, self.pool_size,
                                                                self.strides, self.padding)
        return y

    def backward(self, dy):
        if not self.need_dx:
            return None
        return getattr(K, f"{self._kernels}_backward")(dy, self._cache)

    # -- declarations (nn/base.py), shared by the two pools ------------------------------
    _onnx_extra: dict = {}

    def onnx_node(self, g, x):
        ph, pw = self.padding
        return g.node(self.onnx_ops[0], [x], self, kernel_shape=list(self.pool_size),
                      strides=list(self.strides), pads=[ph, pw, ph, pw], **self._onnx_extra)

    @classmethod
    def from_onnx(cls, g, node, attrs):
        if attrs.get("ceil_mode", 0):
            g.refuse(node, "ceil_mode=1; distnn's pools round down")
        if any(d != 1 for d in attrs.get("dilations", (1, 1))):
            g.refuse(node, "dilated pooling")
        if g.auto_pad(attrs) not in ("NOTSET", "VALID"):
            g.refuse(node, f"auto_pad {g.auto_pad(attrs)}; give explicit pads")
        pads = list(attrs.get("pads", [0] * 4))
        if pads[:2] != pads[2:]:
            g.refuse(node, f"pads {pads} differ before and after; distnn pads symmetrically")
        if cls._onnx_extra and any(pads) and not attrs.get("count_include_pad", 0):
            g.refuse(node, "count_include_pad=0 with padding; distnn's AvgPool2D counts the "
                     "padded zeros (PyTorch's default)")
        kernel = tuple(attrs["kernel_shape"])
        return cls(kernel, strides=tuple(attrs.get("strides", kernel)),
                   padding=tuple(int(p) for p in pads[:2])), {}


class MaxPool2D(_Pool2D):
    """Max over pool_size windows; the gradient of a window goes to its first maximum.

    Args:
        pool_size: int or (kh, kw).
        strides: int or pair; default pool_size.
        padding: int or (ph, pw) of -inf on each side, at most half the window.

    Shape: (C, H, W) -> (C, OH, OW), OH = floor((H + 2*ph - kh) / sh) + 1.

    Example:
        MaxPool2D(3, strides=2, padding=1)
    """

    _kernels = "maxpool2d"
    onnx_ops = ("MaxPool",)

    def torch_module(self):
        from torch import nn
        return nn.MaxPool2d(self.pool_size, self.strides, self.padding)


class AvgPool2D(_Pool2D):
    """Mean over pool_size windows; padded zeros count (PyTorch count_include_pad=True).

    Args:
        pool_size: int or (kh, kw).
        strides: int or pair; default pool_size.
        padding: int or (ph, pw) of zeros on each side, at most half the window.

    Shape: (C, H, W) -> (C, OH, OW), OH = floor((H + 2*ph - kh) / sh) + 1.

    Example:
        AvgPool2D(2)
    """

    _kernels = "avgpool2d"
    onnx_ops = ("AveragePool",)
    _onnx_extra = {"count_include_pad": 1}

    def torch_module(self):
        from torch import nn
        return nn.AvgPool2d(self.pool_size, self.strides, self.padding, count_include_pad=True)


class GlobalAvgPool2D(Layer):
    """Mean over H and W of each channel.

    Shape: (C, H, W) -> (C,).

    Example:
        [..., GlobalAvgPool2D(), Dense(10)]
    """

    def _build(self, input_shape, rng):
        if len(input_shape) != 3:
            raise ValueError(f"GlobalAvgPool2D layer {self.name!r} needs per-sample input "
                             f"(C, H, W) but got {input_shape}")
        return (input_shape[0],)

    def forward(self, x, training=False):
        check_input(self, x)
        self._x_shape = x.shape
        return K.global_avgpool2d_forward(x)

    def backward(self, dy):
        if not self.need_dx:
            return None
        return K.global_avgpool2d_backward(dy, self._x_shape)

    onnx_ops = ("GlobalAveragePool", "ReduceMean")

    def onnx_node(self, g, x):
        return g.node("Flatten", [g.node("GlobalAveragePool", [x], self)], self, axis=1)

    def torch_module(self):
        from torch import nn
        return nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten())

    @classmethod
    def from_onnx(cls, g, node, attrs):
        if node.op_type == "ReduceMean":
            axes = attrs.get("axes")
            if axes is None and len(node.input) > 1:
                axes = g.const(node, 1).tolist()
            if sorted(int(a) % 4 for a in (axes or ())) != [2, 3]:
                g.refuse(node, f"a mean over axes {axes}; distnn averages over H and W only")
        return cls(), {}
