"""Normalization layers: BatchNormalization (with the hook SyncBatchNorm uses),
GroupNormalization, and the per-token LayerNormalization and RMSNorm of transformers."""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..kernels import batchnorm as K
from ..kernels.transformer_ops import layer_norm_backward, layer_norm_forward
from .base import Layer, check_features, check_input

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
        fused_relu: the ``ReLU`` layer right after this one in a Sequential or block
            branch (linked by nn/fusion.py when the container is built), else None. The
            pair then runs as one pass forward (this layer returns max(bn(x), 0) and the
            chain has the ReLU pass it on) and one backward (the ReLU mask is read from
            this layer's output); parameters, names, checkpoints and results are those of
            the two layers apart. ``set_bn_relu_fusion(model, False)`` undoes the link.
        reuse_buffers: (class attribute, default False) in training, write the output, the
            normalized input (where it is kept: the NumPy path and SyncBatchNorm; the
            compiled path keeps x and recomputes it in backward) and dx into arrays kept
            from the previous step instead of new ones; a training forward's output is
            then valid until the next training forward of this layer, which is all a model
            step needs. Evaluation always returns new
            arrays. Off by default: measured (benchmarks/bn_relu.py, resnet20 and vgg11bn,
            1 thread) 1-1.5 ms per step slower, though it removes the few page faults left
            (0-85 per step): a fresh array reuses memory freed moments before, still in
            cache, where a kept one was last touched a step ago.

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
        self.fused_relu: Layer | None = None
        self._cache = None
        self._bufs: dict[str, np.ndarray] = {}

    reuse_buffers = False
    relu_fusion = "bn_relu"  # the planner's name for this layer + the ReLU after it

    def fuse_relu(self, relu: Layer | None) -> None:
        """Take the ReLU after this layer into its pass (None: run apart)."""
        self.fused_relu = relu

    @property
    def rectified(self) -> bool:
        """Whether the output is already max(., 0): the fused ReLU is applied here."""
        return self.fused_relu is not None

    def _buf(self, key: str) -> np.ndarray | None:
        return self._bufs.get(key) if self.reuse_buffers else None

    def _keep(self, key: str, a: np.ndarray) -> np.ndarray:
        if self.reuse_buffers:
            self._bufs[key] = a
        return a

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
        relu = self.fused_relu is not None
        if not training:
            mean = self.buffers["running_mean"].copy()
            var = self.buffers["running_var"].copy()
            if relu:
                y = K.bn_relu_inference(x, mean, var, gamma, beta, self.epsilon)
            else:
                y = K.bn_inference(x, mean, var, gamma, beta, self.epsilon)
            self._cache = (False, x, mean, var, y if relu else None)
            return y
        source = None  # (x, mean) when the kernel kept no xhat
        if self.stat_reducer is None:
            # xhat is not written on the compiled path: backward recomputes it from x
            # (one array fewer written, and the same memory: x is kept instead of xhat)
            forward = K.bn_relu_forward_train if relu else K.bn_forward_train
            y, xhat, mean, var, invstd = forward(x, gamma, beta, self.epsilon,
                                                 out=self._buf("y"), xhat_out=self._buf("xhat"),
                                                 keep_xhat=False)
            self._keep("y", y)
            if xhat is None:
                source = (x, mean)
            else:
                self._keep("xhat", xhat)
            count = K.channel_count(x)
        else:
            mean, var, count = K.bn_stats_from_sums(self.stat_reducer(K.bn_sums(x)))
            y, xhat, invstd = K.bn_normalize(x, mean, var, gamma, beta, self.epsilon)
            if relu:
                np.maximum(y, 0, out=y)
        self._update_running(mean, var, count)
        self._cache = (True, xhat, invstd, count, relu, source)
        return y

    def forward_add_relu(self, x, r):
        """Training forward fused with the residual sum after it and the ReLU after that:
        max(y + r, 0) in one compiled pass (``Add`` asks it of its branch's last batch
        norm), the same bits and cache as ``forward`` then the sum and ReLU; None where it
        does not apply (SyncBatchNorm, a fused ReLU, no compiled kernel for x and r)."""
        if self.stat_reducer is not None or self.fused_relu is not None:
            return None
        check_input(self, x)
        out = K.bn_add_relu_forward_train(x, r, self.params["gamma"], self.params["beta"],
                                          self.epsilon)
        if out is None:
            return None
        y, mean, var, invstd = out
        count = K.channel_count(x)
        self._update_running(mean, var, count)
        self._cache = (True, None, invstd, count, False, (x, mean))
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
            _, x, mean, var, y = self._cache
            if y is not None:
                dy = K.relu_mask(dy, y)
            xhat, _ = K.bn_xhat(x, mean, var, self.epsilon)
            sum_dy, sum_dy_xhat = K.bn_grad_sums(dy, xhat)
            self.grads["beta"][...] = sum_dy
            self.grads["gamma"][...] = sum_dy_xhat
            if not self.need_dx:
                return None
            return K.bn_backward_dx_inference(dy, gamma, var, self.epsilon)
        _, xhat, invstd, count, relu, source = self._cache
        if xhat is None or (self.stat_reducer is None and self.need_dx):
            # sums and dx in one pass over each channel (no sums across ranks to wait for;
            # without xhat this is the only kernel, its dx unused when not needed)
            x, mean = source if xhat is None else (None, None)
            sum_dy, sum_dy_xhat, dx = K.bn_backward(dy, xhat, gamma, self.params["beta"],
                                                    invstd, count, relu, out=self._buf("dx"),
                                                    x=x, mean=mean)
            self.grads["beta"][...] = sum_dy
            self.grads["gamma"][...] = sum_dy_xhat
            return self._keep("dx", dx) if self.need_dx else None
        if not relu:
            sum_dy, sum_dy_xhat = K.bn_grad_sums(dy, xhat)
        else:
            sum_dy, sum_dy_xhat = K.bn_relu_grad_sums(dy, xhat, gamma, self.params["beta"])
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
        if not relu:
            dx = K.bn_backward_dx(dy, xhat, gamma, invstd, sum_dy, sum_dy_xhat, count,
                                  out=self._buf("dx"))
        else:
            dx = K.bn_relu_backward_dx(dy, xhat, gamma, self.params["beta"], invstd, sum_dy,
                                       sum_dy_xhat, count, out=self._buf("dx"))
        return self._keep("dx", dx)

    def describe(self):
        parts = []
        if self.momentum != 0.9:
            parts.append(f"momentum={self.momentum}")
        if self.epsilon != 1e-5:
            parts.append(f"epsilon={self.epsilon}")
        if self.stat_reducer is not None:
            parts.append("sync")
        return ", ".join(parts)

    # -- declarations (nn/base.py) -------------------------------------------------------
    onnx_ops = ("BatchNormalization",)

    def onnx_node(self, g, x):
        p, s = self.params, self.buffers
        inputs = [x, g.const(self, "gamma", p["gamma"]), g.const(self, "beta", p["beta"]),
                  g.const(self, "running_mean", s["running_mean"]),
                  g.const(self, "running_var", s["running_var"])]
        return g.node("BatchNormalization", inputs, self, epsilon=self.epsilon,
                      momentum=self.momentum)

    def torch_module(self):
        from torch import nn

        from .torch_export import tensor
        c = self.params["gamma"].shape[0]
        spatial = len(self.input_shape) - 1
        cls = {0: nn.BatchNorm1d, 1: nn.BatchNorm1d, 2: nn.BatchNorm2d, 3: nn.BatchNorm3d}[spatial]
        bn = cls(c, eps=self.epsilon, momentum=1.0 - self.momentum)  # PyTorch's is 1 - ours
        bn.weight.data = tensor(self.params["gamma"])
        bn.bias.data = tensor(self.params["beta"])
        bn.running_mean.data = tensor(self.buffers["running_mean"])
        bn.running_var.data = tensor(self.buffers["running_var"])
        return bn

    @classmethod
    def from_onnx(cls, g, node, attrs):
        gamma, beta, mean, var = (g.const(node, i) for i in range(1, 5))
        layer = cls(momentum=float(attrs.get("momentum", 0.9)),
                    epsilon=float(attrs.get("epsilon", 1e-5)))
        return layer, {"gamma": gamma, "beta": beta, "running_mean": mean, "running_var": var}


class LayerNormalization(Layer):
    """Layer normalization over the last axis (each token's features): y = (x - mean) /
    sqrt(var + epsilon) * gamma + beta, with the biased variance, the same in training
    and evaluation (``torch.nn.LayerNorm(dim)``).

    Args:
        epsilon: added to the variance.
        elementwise_affine: learn ``gamma`` and ``beta`` (dim,); without, y is the
            normalized x.

    Shape: (N, ..., dim) unchanged; the axes before the last may differ from the built ones.

    Example:
        [Embedding(256, 128), ..., LayerNormalization(), TiedDense(emb)]
    """

    def __init__(self, epsilon: float = 1e-5, elementwise_affine: bool = True,
                 name: str | None = None):
        super().__init__(name)
        if not epsilon > 0:
            raise ValueError(f"{type(self).__name__}: epsilon must be > 0, got {epsilon!r}")
        self.epsilon = float(epsilon)
        self.elementwise_affine = bool(elementwise_affine)

    def _build(self, input_shape, rng):
        if len(input_shape) < 1:
            raise ValueError(f"{type(self).__name__} layer {self.name!r} needs per-sample "
                             f"input with a feature axis, got {input_shape}")
        if self.elementwise_affine:
            d = input_shape[-1]
            self.add_param("gamma", (d,), "ones", rng)
            if self._has_beta:
                self.add_param("beta", (d,), "zeros", rng)
        return input_shape

    _has_beta = True

    def _normalize(self, x):
        """(xhat, invstd) over the last axis."""
        xc = x - x.mean(axis=-1, keepdims=True)
        invstd = 1.0 / np.sqrt(np.mean(xc * xc, axis=-1, keepdims=True) + self.epsilon)
        return xc * invstd, invstd

    def forward(self, x, training=False):
        check_features(self, x)
        if self.elementwise_affine and self._has_beta:  # one fused pass (kernels)
            d = x.shape[-1]
            y, xhat, invstd = layer_norm_forward(x.reshape(-1, d), self.params["gamma"],
                                                 self.params["beta"], self.epsilon)
            self._xhat, self._invstd = xhat, invstd
            return y.reshape(x.shape)
        xhat, self._invstd = self._normalize(x)
        self._xhat = xhat
        if not self.elementwise_affine:
            return xhat
        y = xhat * self.params["gamma"]
        if self._has_beta:
            y += self.params["beta"]
        return y

    def backward(self, dy):
        xhat = self._xhat
        if self.elementwise_affine and self._has_beta:
            d = dy.shape[-1]
            dx, dgamma, dbeta = layer_norm_backward(dy.reshape(-1, d), xhat, self._invstd,
                                                    self.params["gamma"])
            self.grads["gamma"][...] = dgamma
            self.grads["beta"][...] = dbeta
            return dx.reshape(dy.shape) if self.need_dx else None
        if self.elementwise_affine:
            d = dy.shape[-1]
            np.sum((dy * xhat).reshape(-1, d), axis=0, out=self.grads["gamma"])
            if self._has_beta:
                np.sum(dy.reshape(-1, d), axis=0, out=self.grads["beta"])
            dy = dy * self.params["gamma"]
        if not self.need_dx:
            return None
        proj = np.mean(dy * xhat, axis=-1, keepdims=True)
        if self._has_beta:  # the mean's share; RMSNorm subtracts no mean
            return self._invstd * (dy - dy.mean(axis=-1, keepdims=True) - xhat * proj)
        return self._invstd * (dy - xhat * proj)

    # -- declarations -------------------------------------------------------------------
    onnx_ops = ("LayerNormalization",)

    def _scale(self, g):
        d = self.input_shape[-1]
        gamma = self.params["gamma"] if self.elementwise_affine else np.ones(d)
        return g.const(self, "gamma", gamma)

    def onnx_node(self, g, x):
        inputs = [x, self._scale(g)]
        if self.elementwise_affine:
            inputs.append(g.const(self, "beta", self.params["beta"]))
        return g.node("LayerNormalization", inputs, self, axis=-1, epsilon=self.epsilon)

    def torch_module(self):
        import torch
        module = torch.nn.LayerNorm(self.input_shape[-1], eps=self.epsilon,
                                    elementwise_affine=self.elementwise_affine)
        self._copy_affine(module)
        return module

    def _copy_affine(self, module):
        import torch
        if self.elementwise_affine:
            module.weight.data = torch.tensor(self.params["gamma"])
            if self._has_beta:
                module.bias.data = torch.tensor(self.params["beta"])

    @classmethod
    def from_onnx(cls, g, node, attrs):
        if attrs.get("axis", -1) != -1:
            g.refuse(node, f"axis={attrs['axis']}; distnn normalizes the last axis only")
        gamma, beta = g.const(node, 1), g.const(node, 2)
        layer = cls(epsilon=attrs.get("epsilon", 1e-5))
        arrays = {"gamma": gamma,
                  "beta": np.zeros_like(gamma) if beta is None else beta}
        return layer, arrays

    def describe(self):
        default = type(self).__init__.__defaults__[0]
        parts = [] if self.epsilon == default else [f"epsilon={self.epsilon}"]
        return ", ".join(parts + ([] if self.elementwise_affine else
                                  ["elementwise_affine=False"]))


class RMSNorm(LayerNormalization):
    """Root-mean-square normalization over the last axis (Llama's): y = x /
    sqrt(mean(x**2) + epsilon) * gamma, no mean subtracted and no bias
    (``torch.nn.RMSNorm(dim, eps=epsilon)``).

    Args:
        epsilon: added to the mean square; default 1e-6.
        elementwise_affine: learn ``gamma`` (dim,).

    Shape: (N, ..., dim) unchanged.
    """

    _has_beta = False
    onnx_ops = ()  # no RMSNormalization op before opset 23

    def __init__(self, epsilon: float = 1e-6, elementwise_affine: bool = True,
                 name: str | None = None):
        super().__init__(epsilon, elementwise_affine, name)

    def _normalize(self, x):
        invrms = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.epsilon)
        return x * invrms, invrms

    def onnx_node(self, g, x):
        ms = g.node("ReduceMean", [g.node("Mul", [x, x], self)], self, axes=[-1], keepdims=1)
        eps = g.const(self, "epsilon", np.array(self.epsilon))
        rms = g.node("Sqrt", [g.node("Add", [ms, eps], self)], self)
        return g.node("Mul", [g.node("Div", [x, rms], self), self._scale(g)], self)

    def torch_module(self):
        import torch
        module = torch.nn.RMSNorm(self.input_shape[-1], eps=self.epsilon,
                                  elementwise_affine=self.elementwise_affine)
        self._copy_affine(module)
        return module


class GroupNormalization(Layer):
    """Group normalization (Wu and He 2018) over axis 1: the C channels are cut into
    ``groups`` groups of C / groups consecutive channels, and each sample's group is
    normalized over its channels and spatial positions with its own mean and biased
    variance, y = (x - mean) / sqrt(var + epsilon) * gamma + beta with gamma and beta per
    channel; the same in training and evaluation (``torch.nn.GroupNorm(groups, C)``).
    ``groups=1`` normalizes each sample as a whole, ``groups=C`` each channel apart.

    Args:
        groups: the number of groups; must divide the channels.
        epsilon: added to the variance.
        center: learn ``beta`` (C,), the offset.
        scale: learn ``gamma`` (C,), the factor.

    Shape: (C,), (C, L) or (C, H, W) per sample (channels first, as BatchNormalization),
    unchanged.

    Example:
        [Conv2D(32, 3, padding="same"), GroupNormalization(8), ReLU()]
    """

    def __init__(self, groups: int, epsilon: float = 1e-5, center: bool = True,
                 scale: bool = True, name: str | None = None):
        super().__init__(name)
        if isinstance(groups, bool) or not isinstance(groups, (int, np.integer)) or groups < 1:
            raise ValueError(f"GroupNormalization: groups must be an integer >= 1, got "
                             f"{groups!r}")
        if not epsilon > 0:
            raise ValueError(f"GroupNormalization: epsilon must be > 0, got {epsilon!r}")
        self.groups = int(groups)
        self.epsilon = float(epsilon)
        self.center = bool(center)
        self.scale = bool(scale)
        self._cache = None

    def _build(self, input_shape, rng):
        if len(input_shape) < 1 or input_shape[0] % self.groups:
            raise ValueError(f"GroupNormalization layer {self.name!r}: groups={self.groups} "
                             f"must divide the channels (axis 1) of per-sample input "
                             f"{input_shape}; choose groups among the divisors of the "
                             "channels")
        c = input_shape[0]
        if self.scale:
            self.add_param("gamma", (c,), "ones", rng)
        if self.center:
            self.add_param("beta", (c,), "zeros", rng)
        return input_shape

    def _per_channel(self, a):
        """A (C,) array shaped to broadcast over (N, C, ...)."""
        return a.reshape((-1,) + (1,) * (len(self.input_shape) - 1))

    def forward(self, x, training=False):
        check_input(self, x)
        xg = x.reshape(x.shape[0], self.groups, -1)
        xc = xg - xg.mean(axis=-1, keepdims=True)
        invstd = 1.0 / np.sqrt(np.mean(xc * xc, axis=-1, keepdims=True) + self.epsilon)
        xhat = (xc * invstd).reshape(x.shape)
        self._cache = (xhat, invstd)
        y = xhat * self._per_channel(self.params["gamma"]) if self.scale else xhat.copy()
        if self.center:
            y += self._per_channel(self.params["beta"])
        return y.astype(x.dtype, copy=False)

    def backward(self, dy):
        if self._cache is None:
            raise RuntimeError(f"GroupNormalization layer {self.name!r}: backward called "
                               "before forward")
        xhat, invstd = self._cache
        axes = (0,) + tuple(range(2, dy.ndim))
        if self.center:
            self.grads["beta"][...] = dy.sum(axis=axes)
        if self.scale:
            self.grads["gamma"][...] = (dy * xhat).sum(axis=axes)
            dy = dy * self._per_channel(self.params["gamma"])
        if not self.need_dx:
            return None
        n = dy.shape[0]
        dyg, xg = dy.reshape(n, self.groups, -1), xhat.reshape(n, self.groups, -1)
        proj = np.mean(dyg * xg, axis=-1, keepdims=True)
        dx = invstd * (dyg - dyg.mean(axis=-1, keepdims=True) - xg * proj)
        return dx.reshape(dy.shape).astype(dy.dtype, copy=False)

    def describe(self):
        parts = [f"groups={self.groups}"]
        parts += [] if self.epsilon == 1e-5 else [f"epsilon={self.epsilon}"]
        parts += [] if self.center else ["center=False"]
        parts += [] if self.scale else ["scale=False"]
        return ", ".join(parts)

    # -- declarations -------------------------------------------------------------------
    # ONNX's GroupNormalization op needs opset 18 (its scale per group there, per channel
    # from opset 21); distnn writes opset 17, so the layer is written as the standard
    # decomposition (torch's exporter writes the same ops): Reshape to (N, groups, -1),
    # InstanceNormalization with unit scale and no bias, Reshape back, Mul by gamma, Add
    # beta. ``from_onnx_pattern`` reads those nodes back into one GroupNormalization.
    onnx_patterns = ("Reshape",)

    def onnx_node(self, g, x):
        grouped = g.node("Reshape", [x, self._int64(g, "group_shape", [0, self.groups, -1])],
                         self)
        normed = g.node("InstanceNormalization",
                        [grouped, g.const(self, "unit_scale", np.ones(self.groups)),
                         g.const(self, "no_bias", np.zeros(self.groups))], self,
                        epsilon=self.epsilon)
        y = g.node("Reshape", [normed, self._int64(g, "shape", [0, *self.input_shape])], self)
        if self.scale:
            y = g.node("Mul", [y, g.const(self, "gamma",
                                          self._per_channel(self.params["gamma"]))], self)
        if self.center:
            y = g.node("Add", [y, g.const(self, "beta",
                                          self._per_channel(self.params["beta"]))], self)
        return y

    def _int64(self, g, key, values):
        """An int64 constant (``g.const`` writes float32 weights)."""
        name = f"{self.name}/{key}"
        g.inits.append(g.numpy_helper.from_array(np.array(values, np.int64), name))
        return name

    def torch_module(self):
        import torch
        c = self.input_shape[0]
        affine = self.scale or self.center
        module = torch.nn.GroupNorm(self.groups, c, eps=self.epsilon, affine=affine)
        if self.scale:
            module.weight.data = torch.tensor(self.params["gamma"])
        if self.center:
            module.bias.data = torch.tensor(self.params["beta"])
        dtype = torch.float64 if self.dtype == np.float64 else torch.float32
        for learned, p in ((self.scale, module.weight), (self.center, module.bias)):
            if affine and not learned:  # the half distnn does not learn: fixed identity
                p.data = p.data.to(dtype)
                p.requires_grad_(False)
        return module

    @classmethod
    def from_onnx_pattern(cls, g, node):
        """distnn's decomposition (``onnx_node``) back into one layer; None where ``node``
        is another Reshape (a Flatten's)."""
        def only_reader(tensor, op):
            readers = g.consumers.get(tensor, [])
            return readers[0] if len(readers) == 1 and readers[0].op_type == op else None

        def const_input(n):
            consts = [g.consts[i] for i in n.input[1:] if i in g.consts]
            return consts[0] if len(n.input) == 2 and len(consts) == 1 else None

        shape = g.consts.get(node.input[1]) if len(node.input) > 1 else None
        norm = only_reader(node.output[0], "InstanceNormalization")
        if (shape is None or norm is None or shape.size != 3
                or list(shape.reshape(-1)[::2]) != [0, -1]):
            return None
        groups = int(shape.reshape(-1)[1])
        unit, bias = g.const(norm, 1), g.const(norm, 2)
        if not (np.all(unit == 1) and np.all(bias == 0)):
            g.refuse(norm, "an InstanceNormalization of channel groups with a scale other "
                     "than 1 or a bias; distnn's GroupNormalization scales per channel")
        back = only_reader(norm.output[0], "Reshape")
        if back is None or back.input[1] not in g.consts:
            g.refuse(norm, "not followed by a Reshape to a constant shape; not a group "
                     "normalization distnn reads")
        channels = int(g.consts[back.input[1]].reshape(-1)[1])
        out, arrays = back.output[0], {}
        for op, key in (("Mul", "gamma"), ("Add", "beta")):  # per channel: (C, 1, ...)
            after = only_reader(out, op)
            value = const_input(after) if after is not None else None
            if value is not None and value.ndim >= 1 and value.shape[0] == value.size == \
                    channels:
                arrays[key], out = value.reshape(-1), after.output[0]
        layer = cls(groups, epsilon=float(g.attrs(norm).get("epsilon", 1e-5)),
                    center="beta" in arrays, scale="gamma" in arrays)
        return layer, arrays, out
