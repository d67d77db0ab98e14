"""Normalization layers: BatchNormalization (with the hook SyncBatchNorm uses)."""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..kernels import batchnorm as K
from .base import Layer, check_input

StatReducer = Callable[[np.ndarray], np.ndarray]


class BatchNormalization(Layer):
    """Batch normalization over axis 1: per channel over (N, H, W) for (C, H, W) samples,
    per feature over N for (F,) samples.

    Training normalizes with the batch mean and biased variance and updates the running
    statistics Keras-style, ``running = momentum * running + (1 - momentum) * batch``, with
    the unbiased batch variance (as PyTorch does). Evaluation uses the running statistics.

    Args:
        momentum: weight of the old running statistics, in [0, 1].
        epsilon: added to the variance.
        gamma_initializer / beta_initializer: names from ``distnn.nn.init``.

    Attributes:
        buffers["running_mean"], buffers["running_var"]: (C,) running statistics.
        stat_reducer: None (plain batch norm) or a function that sums a float64 vector over
            all ranks; set by the distributed layer to make this a SyncBatchNorm. Training
            forward then reduces the packed per-channel [sum(x), sum(x*x), count] with one
            call, and backward the packed [sum(dy), sum(dy*xhat)] with one call; ``grads``
            stay local (they are averaged with the other gradients).

    Shape: any (C, ...) per sample, unchanged.

    Example:
        [Conv2D(16, 3, padding="same", use_bias=False), BatchNormalization(), ReLU()]
    """

    def __init__(self, momentum: float = 0.9, epsilon: float = 1e-5,
                 gamma_initializer="ones", beta_initializer="zeros", name: str | None = None):
        super().__init__(name)
        if not 0.0 <= momentum <= 1.0:
            raise ValueError(f"BatchNormalization: momentum must be in [0, 1], got {momentum!r} "
                             "(Keras convention: the weight of the old running value)")
        if not epsilon > 0:
            raise ValueError(f"BatchNormalization: epsilon must be > 0, got {epsilon!r}")
        self.momentum = float(momentum)
        self.epsilon = float(epsilon)
        self.gamma_initializer = gamma_initializer
        self.beta_initializer = beta_initializer
        self.stat_reducer: StatReducer | None = None
        self._cache = None

    def _build(self, input_shape, rng):
        if len(input_shape) < 1:
            raise ValueError(f"BatchNormalization layer {self.name!r} needs per-sample input "
                             f"with a channel axis, got {input_shape}")
        c = input_shape[0]
        self.add_param("gamma", (c,), self.gamma_initializer, rng, fan_in=c, fan_out=c)
        self.add_param("beta", (c,), self.beta_initializer, rng, fan_in=c, fan_out=c)
        self.buffers["running_mean"] = np.zeros(c, self.dtype)
        self.buffers["running_var"] = np.ones(c, self.dtype)
        return input_shape

    def forward(self, x, training=False):
        check_input(self, x)
        gamma, beta = self.params["gamma"], self.params["beta"]
        if not training:
            mean = self.buffers["running_mean"].copy()
            var = self.buffers["running_var"].copy()
            self._cache = (False, x, mean, var)
            return K.bn_inference(x, mean, var, gamma, beta, self.epsilon)
        if self.stat_reducer is None:
            y, xhat, mean, var, invstd = K.bn_forward_train(x, gamma, beta, self.epsilon)
            count = K.channel_count(x)
        else:
            mean, var, count = K.bn_stats_from_sums(self.stat_reducer(K.bn_sums(x)))
            y, xhat, invstd = K.bn_normalize(x, mean, var, gamma, beta, self.epsilon)
        self._update_running(mean, var, count)
        self._cache = (True, xhat, invstd, count)
        return y

    def _update_running(self, mean, var, count):
        if count == 0:  # an empty (global) batch has no statistics
            return
        m = self.momentum
        unbiased = np.asarray(var, np.float64) * (count / (count - 1) if count > 1 else 1.0)
        for key, batch in (("running_mean", mean), ("running_var", unbiased)):
            run = self.buffers[key]  # updated in place: it may be a view others hold
            run *= m
            run += (1.0 - m) * np.asarray(batch, np.float64)

    def backward(self, dy):
        if self._cache is None:
            raise RuntimeError(f"BatchNormalization layer {self.name!r}: backward called "
                               "before forward")
        gamma = self.params["gamma"]
        if not self._cache[0]:
            _, x, mean, var = self._cache
            xhat, _ = K.bn_xhat(x, mean, var, self.epsilon)
            sum_dy, sum_dy_xhat = K.bn_grad_sums(dy, xhat)
            self.grads["beta"][...] = sum_dy
            self.grads["gamma"][...] = sum_dy_xhat
            if not self.need_dx:
                return None
            return K.bn_backward_dx_inference(dy, gamma, var, self.epsilon)
        _, xhat, invstd, count = self._cache
        sum_dy, sum_dy_xhat = K.bn_grad_sums(dy, xhat)
        self.grads["beta"][...] = sum_dy
        self.grads["gamma"][...] = sum_dy_xhat
        if not self.need_dx:
            return None
        if self.stat_reducer is not None:
            c = sum_dy.size
            packed = np.empty(2 * c, np.float64)
            packed[:c], packed[c:] = sum_dy, sum_dy_xhat
            packed = self.stat_reducer(packed)
            sum_dy, sum_dy_xhat = packed[:c], packed[c:]
        return K.bn_backward_dx(dy, xhat, gamma, invstd, sum_dy, sum_dy_xhat, count)

    def describe(self):
        parts = []
        if self.momentum != 0.9:
            parts.append(f"momentum={self.momentum}")
        if self.epsilon != 1e-5:
            parts.append(f"epsilon={self.epsilon}")
        if self.stat_reducer is not None:
            parts.append("sync")
        return ", ".join(parts)
