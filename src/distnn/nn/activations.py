"""Activation layers: ReLU, LeakyReLU, Sigmoid, Tanh, Softmax."""
from __future__ import annotations

import numpy as np

from ..kernels.backend import compiled
from .base import Layer, check_input


def _fast_for(*arrays):
    """The compiled kernels when selected and every array is C-contiguous float of one
    dtype and shape."""
    fast = compiled()
    a0 = arrays[0]
    if fast is None or a0.dtype.kind != "f" or a0.size == 0:
        return None
    if all(a.flags.c_contiguous and a.dtype == a0.dtype and a.shape == a0.shape
           for a in arrays):
        return fast
    return None


class ReLU(Layer):
    """max(x, 0).

    After a ``BatchNormalization`` that is linked to it (``fused_relu``, set when the
    container is built) the pair runs as one pass: this layer then passes the already
    rectified array on, and its backward passes dy on (the batch norm applies the mask).
    ``reuse_buffers`` (default False): as ``BatchNormalization``'s, for the output and dx.
    """

    reuse_buffers = False

    def __init__(self, name: str | None = None):
        super().__init__(name)
        self._rectified = None  # set by a fused batch norm to the array it just returned
        self._passed = False
        self._bufs: dict[str, np.ndarray] = {}

    def _buf(self, key, like):
        """A kept array for key when it fits like (and buffers are reused), else a new one."""
        buf = self._bufs.get(key) if self.reuse_buffers else None
        if buf is None or buf.shape != like.shape or buf.dtype != like.dtype:
            buf = np.empty_like(like)
            if self.reuse_buffers:
                self._bufs[key] = buf
        return buf

    def forward(self, x, training=False):
        check_input(self, x)
        rectified, self._rectified = self._rectified, None
        self._passed = x is rectified
        if self._passed:
            self._y = x
            return x
        fast = _fast_for(x)
        y = self._buf("y", x) if training else np.empty_like(x)
        if fast is not None:
            fast.relu_forward(x, y)
        else:
            np.maximum(x, 0, out=y)
        self._y = y
        return y

    def backward(self, dy):
        if not self.need_dx:
            return None
        if self._passed:
            return dy
        fast = _fast_for(dy, self._y)
        if fast is not None:
            dx = self._buf("dx", dy)
            fast.relu_backward(dy, self._y, dx)
            return dx
        # multiplying by the boolean mask is ~10x faster than np.where here
        return dy * (self._y > 0)


    onnx_ops = ("Relu",)

    def onnx_node(self, g, x):
        return g.node("Relu", [x], self)

    def torch_module(self):
        from torch import nn
        return nn.ReLU()

    @classmethod
    def from_onnx(cls, g, node, attrs):
        return cls(), {}


class LeakyReLU(Layer):
    """x if x > 0 else alpha * x."""

    def __init__(self, alpha: float = 0.01, name: str | None = None):
        super().__init__(name)
        self.alpha = float(alpha)

    def forward(self, x, training=False):
        check_input(self, x)
        self._pos = x > 0
        return x * np.where(self._pos, x.dtype.type(1), x.dtype.type(self.alpha))

    def backward(self, dy):
        if not self.need_dx:
            return None
        return dy * np.where(self._pos, dy.dtype.type(1), dy.dtype.type(self.alpha))

    def describe(self):
        return f"alpha={self.alpha}"

    onnx_ops = ("LeakyRelu",)

    def onnx_node(self, g, x):
        return g.node("LeakyRelu", [x], self, alpha=self.alpha)

    def torch_module(self):
        from torch import nn
        return nn.LeakyReLU(self.alpha)

    @classmethod
    def from_onnx(cls, g, node, attrs):
        return cls(attrs.get("alpha", 0.01)), {}


class Sigmoid(Layer):
    """1 / (1 + exp(-x)), computed without overflow."""

    def forward(self, x, training=False):
        check_input(self, x)
        e = np.exp(-np.abs(x))
        self._y = np.where(x >= 0, 1 / (1 + e), e / (1 + e)).astype(x.dtype, copy=False)
        return self._y

    def backward(self, dy):
        if not self.need_dx:
            return None
        return dy * self._y * (1 - self._y)

    onnx_ops = ("Sigmoid",)

    def onnx_node(self, g, x):
        return g.node("Sigmoid", [x], self)

    def torch_module(self):
        from torch import nn
        return nn.Sigmoid()

    @classmethod
    def from_onnx(cls, g, node, attrs):
        return cls(), {}


class Tanh(Layer):
    """tanh(x)."""

    def forward(self, x, training=False):
        check_input(self, x)
        self._y = np.tanh(x)
        return self._y

    def backward(self, dy):
        if not self.need_dx:
            return None
        return dy * (1 - self._y * self._y)

    onnx_ops = ("Tanh",)

    def onnx_node(self, g, x):
        return g.node("Tanh", [x], self)

    def torch_module(self):
        from torch import nn
        return nn.Tanh()

    @classmethod
    def from_onnx(cls, g, node, attrs):
        return cls(), {}


class Softmax(Layer):
    """Softmax over the last axis. For training with cross-entropy prefer logits and the
    fused loss (``CategoricalCrossEntropy(from_logits=True)``)."""

    def forward(self, x, training=False):
        check_input(self, x)
        z = x - x.max(axis=-1, keepdims=True)
        np.exp(z, out=z)
        z /= z.sum(axis=-1, keepdims=True)
        self._y = z
        return z

    def backward(self, dy):
        if not self.need_dx:
            return None
        y = self._y
        return y * (dy - np.sum(dy * y, axis=-1, keepdims=True))

    onnx_ops = ("Softmax",)

    def onnx_node(self, g, x):
        return g.node("Softmax", [x], self, axis=-1)

    def torch_module(self):
        from torch import nn
        return nn.Softmax(dim=-1)

    @classmethod
    def from_onnx(cls, g, node, attrs):
        if int(attrs.get("axis", -1)) not in (-1, 1):
            g.refuse(node, f"axis={attrs['axis']}; distnn's Softmax is over the last axis")
        return cls(), {}


ACTIVATIONS = {"relu": ReLU, "leaky_relu": LeakyReLU, "sigmoid": Sigmoid, "tanh": Tanh,
               "softmax": Softmax}
