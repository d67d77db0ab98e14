"""Activation layers: ReLU, ReLU6, LeakyReLU, Sigmoid, Tanh, Softmax, GELU, SiLU."""
from __future__ import annotations

import math

import numpy as np

from ..kernels.backend import compiled
from ..kernels.transformer_ops import gelu_tanh_backward, gelu_tanh_forward
from .base import Layer, check_features


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


class _OneOp(Layer):
    """An activation that is one ONNX op (``onnx_ops[0]``) and one torch module of the
    class's own name, neither with arguments: their declarations (nn/base.py)."""

    def onnx_node(self, g, x):
        return g.node(self.onnx_ops[0], [x], self)

    def torch_module(self):
        from torch import nn
        return getattr(nn, type(self).__name__)()

    @classmethod
    def from_onnx(cls, g, node, attrs):
        return cls(), {}


class ReLU(_OneOp):
    """max(x, 0).

    After a layer that took it into its own pass (``fused_relu``, linked by nn/fusion.py
    when the container is built) the chain calls ``pass_on`` with that layer's already
    rectified output instead of ``forward``; backward then passes dy on (the layer before
    applies the mask).
    ``reuse_buffers`` (default False): as ``BatchNormalization``'s, for the output and dx.
    """

    reuse_buffers = False

    def __init__(self, name: str | None = None):
        super().__init__(name)
        self._passed = False  # the last forward passed a fused partner's output on
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
        check_features(self, x)
        self._passed = False
        fast = _fast_for(x)
        y = self._buf("y", x) if training else np.empty_like(x)
        if fast is not None:
            fast.relu_forward(x, y)
        else:
            np.maximum(x, 0, out=y)
        self._y = y
        return y

    def pass_on(self, y):
        """Forward where y is already max(x, 0) (the output of the layer fused with this
        one): y itself, kept as the mask."""
        self._passed = True
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


class ReLU6(Layer):
    """min(max(x, 0), 6): MobileNet's bounded ReLU (PyTorch's ``nn.ReLU6``; ONNX ``Clip``
    to [0, 6]). The gradient is 0 at and outside the kinks, as PyTorch's.

    Shape: any; y has x's shape and dtype.

    Example:
        [Conv2D(32, 1, use_bias=False), BatchNormalization(), ReLU6()]
    """

    def forward(self, x, training=False):
        check_features(self, x)
        self._pass = (x > 0) & (x < 6)
        return np.clip(x, 0, 6).astype(x.dtype, copy=False)

    def backward(self, dy):
        if not self.need_dx:
            return None
        return dy * self._pass

    onnx_ops = ("Clip",)

    def onnx_node(self, g, x):
        lo = g.const(self, "min", np.zeros((), np.float32))
        hi = g.const(self, "max", np.full((), 6, np.float32))
        return g.node("Clip", [x, lo, hi], self)

    def torch_module(self):
        from torch import nn
        return nn.ReLU6()

    @classmethod
    def from_onnx(cls, g, node, attrs):
        lo = g.const(node, 1) if len(node.input) > 1 else attrs.get("min")
        hi = g.const(node, 2) if len(node.input) > 2 else attrs.get("max")
        lo, hi = (None if v is None else np.asarray(v, np.float64).reshape(-1) for v in (lo, hi))
        if lo is None or hi is None or lo.size != 1 or hi.size != 1 or lo[0] != 0 \
                or hi[0] != 6:
            g.refuse(node, f"Clip to [{lo}, {hi}]; distnn reads only Clip to [0, 6] "
                           "(ReLU6)")
        return cls(), {}


class LeakyReLU(Layer):
    """x if x > 0 else alpha * x."""

    def __init__(self, alpha: float = 0.01, name: str | None = None):
        super().__init__(name)
        self.alpha = float(alpha)

    def forward(self, x, training=False):
        check_features(self, x)
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


class Sigmoid(_OneOp):
    """1 / (1 + exp(-x)), computed without overflow."""

    def forward(self, x, training=False):
        check_features(self, x)
        self._y = _sigmoid(x)
        return self._y

    def backward(self, dy):
        if not self.need_dx:
            return None
        return dy * self._y * (1 - self._y)

    onnx_ops = ("Sigmoid",)


class Tanh(_OneOp):
    """tanh(x)."""

    def forward(self, x, training=False):
        check_features(self, x)
        self._y = np.tanh(x)
        return self._y

    def backward(self, dy):
        if not self.need_dx:
            return None
        return dy * (1 - self._y * self._y)

    onnx_ops = ("Tanh",)


class Softmax(Layer):
    """Softmax over the last axis. For training with cross-entropy prefer logits and the
    fused loss (``CategoricalCrossEntropy(from_logits=True)``)."""

    def forward(self, x, training=False):
        check_features(self, x)
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


def _sigmoid(x):
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e)).astype(x.dtype, copy=False)


# erfc(z) for z >= 0 (NumPy has no erf) as t * exp(-z*z + f(t)), t = 2 / (2 + z): f is
# smooth on t in (0, 1] and its Chebyshev series, fitted once here on math.erfc, reaches
# 1e-14 relative error with 24 terms (float64) and 3e-7 absolute with 12 (float32).
# Beyond z = 26 erfc is below 1e-295 and the clamp costs nothing.
_ERFC_ZMAX = 26.0
_ERFC_TMIN = 2.0 / (2.0 + _ERFC_ZMAX)


def _erfc_series(n: int = 24) -> np.ndarray:
    u = np.cos(np.pi * (np.arange(n) + 0.5) / n)
    t = _ERFC_TMIN + (u + 1) / 2 * (1 - _ERFC_TMIN)
    z = 2 / t - 2
    f = [math.log(math.erfc(zk) / tk) + zk * zk for zk, tk in zip(z, t)]
    return np.polynomial.chebyshev.chebfit(u, f, n - 1)


_ERFC_SERIES = _erfc_series()


def _erfc_nonneg(z: np.ndarray) -> np.ndarray:
    """erfc(z) for z >= 0 (a new array; z is consumed), Clenshaw's recurrence in place."""
    dt = z.dtype.type
    coef = _ERFC_SERIES[:24 if z.dtype == np.float64 else 12]
    np.minimum(z, dt(_ERFC_ZMAX), out=z)
    t = 2 / (2 + z)
    u = (t - dt(_ERFC_TMIN)) * dt(2 / (1 - _ERFC_TMIN)) - dt(1)
    b1, b2, tmp = np.zeros_like(u), np.zeros_like(u), np.empty_like(u)
    for c in coef[:0:-1]:  # b_k = 2u b_(k+1) - b_(k+2) + c_k
        np.multiply(u, b1, out=tmp)
        tmp *= 2
        tmp -= b2
        tmp += dt(c)
        b2, b1, tmp = b1, tmp, b2
    np.multiply(u, b1, out=tmp)
    tmp -= b2
    tmp += dt(coef[0])
    z *= z
    tmp -= z
    np.exp(tmp, out=tmp)
    tmp *= t
    return tmp


def normal_cdf(x: np.ndarray) -> np.ndarray:
    """Phi(x) = erfc(-x / sqrt(2)) / 2, accurate in both tails."""
    half = _erfc_nonneg(np.abs(x) * x.dtype.type(math.sqrt(0.5)))
    half *= 0.5
    return np.where(x < 0, half, 1 - half)


_TANH_C = math.sqrt(2 / math.pi)


class GELU(Layer):
    """Gaussian error linear unit: x * Phi(x) (``torch.nn.GELU``).

    Args:
        approximate: "none" (Phi exact: 1e-14 relative in float64; NumPy has no erf, so
            this costs tens of array passes) or "tanh" (GPT-2's
            0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x**3))), a few passes).

    Shape: any, unchanged.
    """

    def __init__(self, approximate: str = "none", name: str | None = None):
        super().__init__(name)
        if approximate not in ("none", "tanh"):
            raise ValueError(f"GELU: approximate must be 'none' or 'tanh', got {approximate!r}")
        self.approximate = approximate

    def forward(self, x, training=False):
        check_features(self, x)
        self._x = x
        if self.approximate == "tanh":  # one fused pass with the compiled kernels
            return gelu_tanh_forward(x)
        self._cdf = normal_cdf(x)
        return x * self._cdf

    def backward(self, dy):
        if not self.need_dx:
            return None
        x = self._x
        if self.approximate == "tanh":
            return gelu_tanh_backward(x, dy)
        pdf = np.exp(-0.5 * x * x) * x.dtype.type(1 / math.sqrt(2 * math.pi))
        return dy * (self._cdf + x * pdf)

    def onnx_node(self, g, x):
        # opset 17 has no Gelu (opset 20): the same arithmetic in Erf / Tanh
        def c(key, value):
            return g.const(self, key, np.array(value))
        if self.approximate == "tanh":
            cube = g.node("Mul", [g.node("Mul", [x, x], self), x], self)
            inner = g.node("Add", [x, g.node("Mul", [cube, c("k", 0.044715)], self)], self)
            th = g.node("Tanh", [g.node("Mul", [inner, c("sqrt_2_over_pi", _TANH_C)], self)],
                        self)
        else:
            th = g.node("Erf", [g.node("Mul", [x, c("sqrt_half", math.sqrt(0.5))], self)],
                        self)
        one_plus = g.node("Add", [th, c("one", 1.0)], self)
        return g.node("Mul", [g.node("Mul", [x, one_plus], self), c("half", 0.5)], self)

    def torch_module(self):
        import torch
        return torch.nn.GELU(approximate=self.approximate)

    def describe(self):
        return "" if self.approximate == "none" else f"approximate={self.approximate!r}"


class SiLU(Layer):
    """x * sigmoid(x), also called swish (``torch.nn.SiLU``)."""

    def forward(self, x, training=False):
        check_features(self, x)
        self._x, self._s = x, _sigmoid(x)
        return x * self._s

    def backward(self, dy):
        if not self.need_dx:
            return None
        s = self._s
        return dy * (s * (1 + self._x * (1 - s)))

    def onnx_node(self, g, x):
        return g.node("Mul", [x, g.node("Sigmoid", [x], self)], self)

    def torch_module(self):
        import torch
        return torch.nn.SiLU()


ACTIVATIONS = {"relu": ReLU, "relu6": ReLU6, "leaky_relu": LeakyReLU, "sigmoid": Sigmoid,
               "tanh": Tanh, "softmax": Softmax, "gelu": GELU, "silu": SiLU}
