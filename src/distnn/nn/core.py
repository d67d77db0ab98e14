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

    def onnx_node(self, g, x):
        w = self.params["w"]
        if len(self.input_shape) == 1:  # (in, units) is Gemm's B without transposition
            b = self.params["b"] if self.use_bias else np.zeros(self.units, w.dtype)
            return g.node("Gemm", [x, g.const(self, "w", w), g.const(self, "b", b)], self)
        y = g.node("MatMul", [x, g.const(self, "w", w)], self)
        if not self.use_bias:
            return y
        return g.node("Add", [y, g.const(self, "b", self.params["b"])], self)

    def torch_module(self):
        import torch
        w = self.params["w"]
        lin = torch.nn.Linear(w.shape[0], w.shape[1], bias=self.use_bias)
        lin.weight.data = torch.tensor(w.T)
        if self.use_bias:
            lin.bias.data = torch.tensor(self.params["b"])
        return lin

    def describe(self):
        return f"units={self.units}" + ("" if self.use_bias else ", use_bias=False")


class Flatten(Layer):
    """Reshape (N, *shape) to (N, prod(shape))."""

    def _build(self, input_shape, rng):
        return (int(np.prod(input_shape)),)

    def forward(self, x, training=False):
        check_input(self, x)
        return x.reshape(x.shape[0], self.output_shape[0])

    def backward(self, dy):
        return dy.reshape((dy.shape[0],) + self.input_shape) if self.need_dx else None


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
