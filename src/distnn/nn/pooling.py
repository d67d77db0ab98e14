"""Pooling layers over NCHW input: MaxPool2D, AvgPool2D, GlobalAvgPool2D."""
from __future__ import annotations

from ..kernels import pooling as K
from .base import Layer, check_input
from .conv import as_pair, fmt_pair


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
        if len(input_shape) != 3:
            raise ValueError(f"{type(self).__name__} layer {self.name!r} needs per-sample input "
                             f"(C, H, W) but got {input_shape}")
        c, h, w = input_shape
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

    def forward(self, x, training=False):
        check_input(self, x)
        y, self._cache = K.maxpool2d_forward(x, self.pool_size, self.strides, self.padding)
        return y

    def backward(self, dy):
        if not self.need_dx:
            return None
        return K.maxpool2d_backward(dy, self._cache)


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

    def forward(self, x, training=False):
        check_input(self, x)
        y, self._cache = K.avgpool2d_forward(x, self.pool_size, self.strides, self.padding)
        return y

    def backward(self, dy):
        if not self.need_dx:
            return None
        return K.avgpool2d_backward(dy, self._cache)


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
