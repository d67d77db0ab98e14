"""Core layers: Dense, Flatten, Dropout."""
from __future__ import annotations

import numpy as np

from .. import kernels as K
from .base import Layer, check_features, check_input


class Dense(Layer):
    """Fully-connected layer over the last axis: y = x @ w + b.

    Args:
        units: number of outputs.
        use_bias: add a bias vector.
        weights_initializer / bias_initializer: names from ``distnn.nn.init``.

    Shape: (N, in_features) -> (N, units), or over the last axis of any rank,
    (N, ..., in_features) -> (N, ..., units) (a transformer's tokens); ``w`` is
    (in_features, units).

    Example:
        Dense(128, use_bias=False)
    """

    def __init__(self, units: int, use_bias: bool = True, weights_initializer="glorot_uniform",
                 bias_initializer="zeros", name: str | None = None):
        super().__init__(name)
        if int(units) <= 0:
            raise ValueError(f"Dense: units must be a positive integer, got {units!r}")
        self.units = int(units)
        self.use_bias = use_bias
        self.weights_initializer = weights_initializer
        self.bias_initializer = bias_initializer

    def _build(self, input_shape, rng):
        if len(input_shape) < 1:
            raise ValueError(f"Dense layer {self.name!r} needs per-sample input with a "
                             f"feature axis but got shape {input_shape}")
        fan_in = input_shape[-1]
        self.add_param("w", (fan_in, self.units), self.weights_initializer, rng,
                       fan_in=fan_in, fan_out=self.units)
        if self.use_bias:
            self.add_param("b", (self.units,), self.bias_initializer, rng,
                           fan_in=fan_in, fan_out=self.units)
        return input_shape[:-1] + (self.units,)

    def forward(self, x, training=False):
        if x.ndim == 2:
            check_input(self, x)
        else:
            check_features(self, x)
        lead = x.shape[:-1]
        if x.ndim > 2:  # the tokens of all samples as rows of one matrix product
            x = x.reshape(-1, x.shape[-1])
        self._x = x
        y = K.matmul(x, self.params["w"])
        if self.use_bias:
            y += self.params["b"]
        return y.reshape(lead + (self.units,)) if len(lead) > 1 else y

    def backward(self, dy):
        lead = dy.shape[:-1]
        if dy.ndim > 2:
            dy = dy.reshape(-1, self.units)
        K.matmul(self._x.T, dy, out=self.grads["w"])
        if self.use_bias:
            np.sum(dy, axis=0, out=self.grads["b"])
        if not self.need_dx:
            return None
        dx = K.matmul(dy, self.params["w"].T)
        return dx.reshape(lead + (dx.shape[-1],)) if len(lead) > 1 else dx

    def describe(self):
        return f"units={self.units}" + ("" if self.use_bias else ", use_bias=False")

    # -- declarations (nn/base.py) -------------------------------------------------------
    onnx_ops = ("Gemm", "MatMul")

    def onnx_node(self, g, x):
        w = self.params["w"]
        if len(self.input_shape) == 1:  # (in, units) is Gemm's B without transposition
            b = self.params["b"] if self.use_bias else np.zeros(self.units, np.float32)
            return g.node("Gemm", [x, g.const(self, "w", w), g.const(self, "b", b)], self)
        y = g.node("MatMul", [x, g.const(self, "w", w)], self)  # over the last axis
        if not self.use_bias:
            return y
        return g.node("Add", [y, g.const(self, "b", self.params["b"])], self)

    def torch_module(self):
        from torch import nn

        from .torch_export import tensor
        w = self.params["w"]
        lin = nn.Linear(w.shape[0], w.shape[1], bias=self.use_bias)
        lin.weight.data = tensor(w.T)
        if self.use_bias:
            lin.bias.data = tensor(self.params["b"])
        return lin

    @classmethod
    def from_onnx(cls, g, node, attrs):
        """Gemm (transB and alpha/beta folded in), or MatMul by a constant matrix (the reader
        adds a following Add's constant as the bias)."""
        if node.op_type == "MatMul":
            w = g.const(node, 1)
            if w.ndim != 2:
                g.refuse(node, f"a {w.ndim}-D right operand; distnn's Dense multiplies by a "
                         "matrix")
            return cls(w.shape[1], use_bias=False), {"w": w}
        if attrs.get("transA", 0):
            g.refuse(node, "transA=1; distnn's Dense takes (batch, features)")
        w = g.const(node, 1).astype(np.float64) * attrs.get("alpha", 1.0)
        w = w.T if attrs.get("transB", 0) else w
        b = g.const(node, 2)
        arrays = {"w": w}
        if b is not None:
            arrays["b"] = np.broadcast_to(b * attrs.get("beta", 1.0), (w.shape[1],))
        return cls(w.shape[1], use_bias=b is not None), arrays


class Flatten(Layer):
    """Reshape (N, *shape) to (N, prod(shape))."""

    def _build(self, input_shape, rng):
        return (int(np.prod(input_shape)),)

    def forward(self, x, training=False):
        check_input(self, x)
        return x.reshape(x.shape[0], self.output_shape[0])

    def backward(self, dy):
        return dy.reshape((dy.shape[0],) + self.input_shape) if self.need_dx else None

    onnx_ops = ("Flatten", "Reshape")

    def onnx_node(self, g, x):
        return g.node("Flatten", [x], self, axis=1)

    def torch_module(self):
        from torch import nn
        return nn.Flatten()

    @classmethod
    def from_onnx(cls, g, node, attrs):
        if node.op_type == "Reshape":
            shape = g.const(node, 1).tolist()
            if len(shape) != 2:
                g.refuse(node, f"a reshape to {shape}; distnn reshapes only to (batch, "
                         "features)")
        elif int(attrs.get("axis", 1)) != 1:
            g.refuse(node, f"axis={attrs['axis']}; distnn flattens all but the batch axis")
        return cls(), {}


class Dropout(Layer):
    """Inverted dropout: in training zero each element with probability ``rate`` and scale
    the rest by 1/(1-rate); identity in evaluation. Masks are independent per sample.

    Args:
        rate: drop probability in [0, 1).
        seed: seed of the layer's own generator; by default one is spawned from the build
            generator. ``rng`` may be given instead.
    """

    def __init__(self, rate: float = 0.5, seed: int | None = None,
                 rng: np.random.Generator | None = None, name: str | None = None):
        super().__init__(name)
        if not 0.0 <= rate < 1.0:
            raise ValueError(f"Dropout: rate must be in [0, 1), got {rate!r}")
        self.rate = float(rate)
        self.rng = rng if rng is not None else (
            np.random.default_rng(seed) if seed is not None else None)

    def _build(self, input_shape, rng):
        if self.rng is None:
            self.rng = rng.spawn(1)[0]
        return input_shape

    def forward(self, x, training=False):
        check_features(self, x)  # elementwise: sequences of any length
        if not training or self.rate == 0.0:
            self._mask = None
            return x
        keep = 1.0 - self.rate
        mask = self.rng.random(x.shape, dtype=x.dtype if x.dtype == np.float64 else np.float32)
        self._mask = np.where(mask < keep, x.dtype.type(1.0 / keep), x.dtype.type(0.0))
        return x * self._mask

    def backward(self, dy):
        if not self.need_dx:
            return None
        return dy if self._mask is None else dy * self._mask

    def describe(self):
        return f"rate={self.rate}"

    onnx_ops = ("Dropout",)

    def onnx_node(self, g, x):
        return x  # inference: the identity

    def torch_module(self):
        from torch import nn
        return nn.Dropout(self.rate)

    @classmethod
    def from_onnx(cls, g, node, attrs):
        ratio = g.const(node, 1) if len(node.input) > 1 and node.input[1] else None
        return cls(float(attrs.get("ratio", 0.5) if ratio is None else ratio)), {}
