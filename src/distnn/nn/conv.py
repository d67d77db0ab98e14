"""Convolution layers: Conv2D (NCHW, im2col + GEMM kernels in ``distnn.kernels.conv``;
grouped and depthwise ones in ``distnn.kernels.grouped``)."""
from __future__ import annotations

import numpy as np

from ..kernels import conv as K
from .base import Layer, check_input


def as_pair(value, arg: str, owner: str, minimum: int = 1) -> tuple[int, int]:
    """An int or a pair of ints (each >= minimum) as a pair; errors name owner and arg."""
    pair = (value, value) if isinstance(value, (int, np.integer)) else tuple(value) \
        if isinstance(value, (tuple, list)) else None
    if (pair is None or len(pair) != 2
            or not all(isinstance(v, (int, np.integer)) and v >= minimum for v in pair)):
        raise ValueError(f"{owner}: {arg} must be an int >= {minimum} or a pair of them, "
                         f"got {value!r}")
    return int(pair[0]), int(pair[1])


class Conv2D(Layer):
    """2-D convolution (cross-correlation, like PyTorch and Keras) over NCHW input.

    Args:
        filters: number of output channels F.
        kernel_size: int or (kh, kw).
        strides: int or (sh, sw).
        padding: int or (ph, pw) zeros on each side; "valid" (= 0); or "same", which gives
            ceil(in / stride) outputs with any odd extra padding at the bottom/right (TF).
        dilation: int or (dh, dw) spacing between kernel taps.
        use_bias: add a per-filter bias ``b`` (F,).
        groups: split the C input channels and F filters into this many groups, filter
            group k reading only channel group k (PyTorch's and ONNX's ``groups``); both C
            and F must be multiples of it. groups == C is a depthwise convolution.
        weights_initializer / bias_initializer: names from ``distnn.nn.init`` (fan_in is
            C/groups*kh*kw, fan_out F/groups*kh*kw, as PyTorch's).

    Shape: per sample (C, H, W) -> (F, OH, OW); ``w`` is (F, C/groups, kh, kw) (PyTorch
    layout).

    Example:
        Conv2D(32, 3, padding="same", use_bias=False)
        Conv2D(96, 3, padding="same", groups=96)  # depthwise over 96 channels
    """

    def __init__(self, filters: int, kernel_size, strides=1, padding=0, dilation=1,
                 use_bias: bool = True, weights_initializer="he_uniform",
                 bias_initializer="zeros", name: str | None = None, groups: int = 1):
        super().__init__(name)
        if not isinstance(filters, (int, np.integer)) or filters < 1:
            raise ValueError(f"Conv2D: filters must be a positive integer, got {filters!r}")
        self.filters = int(filters)
        self.kernel_size = as_pair(kernel_size, "kernel_size", "Conv2D")
        self.strides = as_pair(strides, "strides", "Conv2D")
        self.dilation = as_pair(dilation, "dilation", "Conv2D")
        if isinstance(padding, str):
            if padding.lower() not in ("same", "valid"):
                raise ValueError(f"Conv2D: padding must be an int, a pair, 'valid' or 'same', "
                                 f"got {padding!r}")
            padding = padding.lower()
            self.padding = padding if padding == "same" else (0, 0)
        else:
            self.padding = as_pair(padding, "padding", "Conv2D", minimum=0)
        if (not isinstance(groups, (int, np.integer)) or isinstance(groups, bool)
                or groups < 1):
            raise ValueError(f"Conv2D: groups must be a positive integer, got {groups!r}")
        if self.filters % groups:
            raise ValueError(f"Conv2D: groups={groups} must divide the filters "
                             f"({self.filters}); use a divisor of it")
        self.groups = int(groups)
        self.use_bias = bool(use_bias)
        self.weights_initializer = weights_initializer
        self.bias_initializer = bias_initializer
        self._pads = (0, 0, 0, 0)
        self._ws: dict = {}
        self._cache = None

    def _build(self, input_shape, rng):
        c, h, w = image_input(self, input_shape)
        if c % self.groups:
            raise ValueError(f"Conv2D layer {self.name!r}: groups={self.groups} must divide "
                             f"both the input channels ({c}) and the filters "
                             f"({self.filters}); use a divisor of both")
        (kh, kw), (sh, sw), (dh, dw) = self.kernel_size, self.strides, self.dilation
        if self.padding == "same":
            self._pads = K.same_padding(h, kh, sh, dh) + K.same_padding(w, kw, sw, dw)
        else:
            ph, pw = self.padding
            self._pads = (ph, ph, pw, pw)
        pt, pb, pl, pr = self._pads
        oh = K.conv_output_size(h, kh, sh, pt, pb, dh)
        ow = K.conv_output_size(w, kw, sw, pl, pr, dw)
        if oh < 1 or ow < 1:
            raise ValueError(f"Conv2D layer {self.name!r}: input {input_shape} is smaller than "
                             f"its {kh}x{kw} kernel (dilation {self.dilation}, padding "
                             f"{self.padding}); use padding='same' or a smaller kernel")
        g = self.groups
        fan_in, fan_out = c // g * kh * kw, self.filters // g * kh * kw
        self.add_param("w", (self.filters, c // g, kh, kw), self.weights_initializer, rng,
                       fan_in=fan_in, fan_out=fan_out)
        if self.use_bias:
            self.add_param("b", (self.filters,), self.bias_initializer, rng,
                           fan_in=fan_in, fan_out=fan_out)
        return (self.filters, oh, ow)

    def forward(self, x, training=False):
        check_input(self, x)
        if self.groups == 1:
            y, self._cache = K.conv2d_forward(x, self.params["w"], self.params.get("b"),
                                              self.strides, self._pads, self.dilation,
                                              ws=self._ws)
        else:
            y, self._cache = K.conv2d_forward(x, self.params["w"], self.params.get("b"),
                                              self.strides, self._pads, self.dilation,
                                              groups=self.groups)
        return y

    def backward(self, dy):
        if self._cache is None:
            raise RuntimeError(f"Conv2D layer {self.name!r}: backward called before forward")
        cache, self._cache = self._cache, None  # the kernel reuses the columns for dx
        dx, _, _ = K.conv2d_backward(dy, cache, self.params["w"], dw_out=self.grads["w"],
                                     db_out=self.grads.get("b"), need_dx=self.need_dx,
                                     need_db=self.use_bias, ws=self._ws)
        return dx

    def describe(self):
        kh, kw = self.kernel_size
        parts = [f"{self.filters}", f"{kh}x{kw}"]
        if self.strides != (1, 1):
            parts.append(f"strides={fmt_pair(self.strides)}")
        if self.padding == "same":
            parts.append("padding=same")
        elif self.padding != (0, 0):
            parts.append(f"padding={fmt_pair(self.padding)}")
        if self.dilation != (1, 1):
            parts.append(f"dilation={fmt_pair(self.dilation)}")
        if self.groups != 1:
            parts.append(f"groups={self.groups}")
        if not self.use_bias:
            parts.append("use_bias=False")
        return ", ".join(parts)

    # -- declarations (nn/base.py) -------------------------------------------------------
    onnx_ops = ("Conv",)

    def onnx_node(self, g, x):
        pt, pb, pl, pr = self._pads
        inputs = [x, g.const(self, "w", self.params["w"])]
        if self.use_bias:
            inputs.append(g.const(self, "b", self.params["b"]))
        return g.node("Conv", inputs, self, kernel_shape=list(self.kernel_size),
                      strides=list(self.strides), dilations=list(self.dilation),
                      pads=[pt, pl, pb, pr],
                      **({"group": self.groups} if self.groups != 1 else {}))

    def torch_module(self):
        from torch import nn

        from .torch_export import tensor
        f, cg, kh, kw = self.params["w"].shape
        pt, pb, pl, pr = self._pads
        even = pt == pb and pl == pr
        conv = nn.Conv2d(cg * self.groups, f, (kh, kw), stride=self.strides,
                         dilation=self.dilation, padding=(pt, pl) if even else 0,
                         bias=self.use_bias, groups=self.groups)
        conv.weight.data = tensor(self.params["w"])
        if self.use_bias:
            conv.bias.data = tensor(self.params["b"])
        # distnn's "same" with an even kernel pads more at the bottom/right
        return conv if even else nn.Sequential(nn.ZeroPad2d((pl, pr, pt, pb)), conv)

    @classmethod
    def from_onnx(cls, g, node, attrs):
        """Also returns ``"pads"`` (top, bottom, left, right) where the file's pads differ
        before and after: the reader checks them against the built layer's "same" pads."""
        w, b = g.const(node, 1), g.const(node, 2)
        if w.ndim != 4:
            g.refuse(node, f"a {w.ndim - 2}-D convolution; distnn's is 2-D")
        auto = g.auto_pad(attrs)
        if auto == "SAME_LOWER":
            g.refuse(node, "auto_pad SAME_LOWER; distnn's 'same' pads at the bottom/right")
        pads = [int(p) for p in attrs.get("pads", (0, 0, 0, 0))]
        padding = ("same" if auto == "SAME_UPPER" else 0 if auto == "VALID"
                   else (pads[0], pads[1]) if pads[:2] == pads[2:] else "same")
        layer = cls(w.shape[0], tuple(w.shape[2:]), strides=tuple(attrs.get("strides", (1, 1))),
                    padding=padding, dilation=tuple(attrs.get("dilations", (1, 1))),
                    use_bias=b is not None, groups=int(attrs.get("group", 1)))
        arrays = {"w": w, **({"b": b} if b is not None else {})}
        if padding == "same" and auto == "NOTSET":
            arrays["pads"] = (pads[0], pads[2], pads[1], pads[3])
        return layer, arrays


def image_input(layer, input_shape) -> tuple[int, int, int]:
    """(C, H, W) of a per-sample image shape; a ValueError naming the layer otherwise."""
    if len(input_shape) != 3:
        raise ValueError(f"{type(layer).__name__} layer {layer.name!r} needs per-sample input "
                         f"(C, H, W) but got {input_shape}; reshape the data to NCHW")
    return tuple(input_shape)


def fmt_pair(pair: tuple[int, int]) -> str:
    return str(pair[0]) if pair[0] == pair[1] else f"{pair[0]}x{pair[1]}"
