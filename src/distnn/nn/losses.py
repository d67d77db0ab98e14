"""Losses: each call returns the loss value and its gradient with respect to y_pred, in one
pass and numerically stable.

The loss is the SUM over samples of a per-sample loss divided by ``denom`` (default: the
batch size, i.e. the mean), and the gradient uses the same ``denom``. Distributed training
passes ``denom`` = the global batch size on every rank and then sums gradients across ranks,
which gives exactly the gradient of the mean loss over the global batch, even when ranks hold
batches of different sizes.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

Array = np.ndarray


def _check_pred(owner: str, y_pred: Any) -> Array:
    y = np.asarray(y_pred)
    if y.dtype.kind != "f":
        raise ValueError(f"{owner}: y_pred must be a float array (the model output), got dtype "
                         f"{y.dtype}")
    if y.ndim < 1:
        raise ValueError(f"{owner}: y_pred must have a batch axis, got shape {y.shape}")
    return y


def _class_targets(owner: str, y: Array, y_true: Any) -> tuple[Array | None, Array | None]:
    """(labels, None) for integer labels of shape (N,), or (None, targets) for (N, C)
    targets (one-hot or probabilities) cast to y's dtype."""
    if y.ndim != 2:
        raise ValueError(f"{owner}: y_pred must have shape (N, C), got {y.shape}")
    t = np.asarray(y_true)
    n, c = y.shape
    if t.ndim == 1:
        if t.shape[0] != n:
            raise ValueError(f"{owner}: y_true has shape {t.shape} but y_pred has shape "
                             f"{y.shape}; pass one label per sample")
        return _labels(owner, t, c), None
    if t.shape != y.shape:
        raise ValueError(f"{owner}: y_true has shape {t.shape} but y_pred has shape {y.shape}; "
                         "pass labels of shape (N,) or targets of shape (N, C)")
    return None, t.astype(y.dtype, copy=False)


def _labels(owner: str, t: Array, n_classes: int) -> Array:
    """Integer class labels, checked to lie in [0, n_classes)."""
    if t.dtype.kind not in "iub":
        if t.dtype.kind != "f" or not np.all(np.mod(t, 1) == 0):
            raise ValueError(f"{owner}: labels of shape (N,) must be integers, got dtype "
                             f"{t.dtype} with values such as {t[:3].tolist()}")
    labels = t.astype(np.intp, copy=False)
    if labels.size:
        lo, hi = int(labels.min()), int(labels.max())
        if lo < 0 or hi >= n_classes:
            bad = lo if lo < 0 else hi
            raise ValueError(f"{owner}: y_true holds label {bad}, outside [0, {n_classes}) for "
                             f"y_pred with {n_classes} classes")
    return labels


def same_shape(owner: str, y: Array, y_true: Any) -> Array:
    """y_true as an array of y's shape and dtype; (N,) and (N, 1) are interchangeable."""
    t = np.asarray(y_true)
    if t.shape != y.shape:
        if t.size == y.size and t.shape[:1] == y.shape[:1] and max(t.ndim, y.ndim) <= 2:
            t = t.reshape(y.shape)
        else:
            raise ValueError(f"{owner}: y_true has shape {t.shape} but y_pred has shape "
                             f"{y.shape}; they must match")
    return t.astype(y.dtype, copy=False)


class Loss:
    """Base class: ``loss(y_pred, y_true, denom=None) -> (value, dloss/dy_pred)``.

    Subclasses implement ``_sum_and_grad`` returning the sum of per-sample losses and its
    gradient (a fresh array of y_pred's dtype, which the base then divides by ``denom``).
    """

    name = ""

    def __call__(self, y_pred: Array, y_true: Array, *,
                 denom: float | None = None) -> tuple[float, Array]:
        owner = type(self).__name__
        y = _check_pred(owner, y_pred)
        n = y.shape[0]
        if denom is None:
            denom = n
        elif not (isinstance(denom, (int, float, np.integer, np.floating))
                  and math.isfinite(denom) and denom > 0):
            raise ValueError(f"{owner}: denom must be a number > 0 (the count of samples the "
                             f"loss is averaged over, e.g. the global batch size), got {denom!r}")
        total, grad = self._sum_and_grad(y, y_true)
        if n == 0:
            return 0.0, grad
        np.multiply(grad, 1.0 / float(denom), out=grad)
        return float(total) / float(denom), grad

    def _sum_and_grad(self, y: Array, y_true: Any) -> tuple[float, Array]:
        raise NotImplementedError

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({args})"


class CategoricalCrossEntropy(Loss):
    """Cross-entropy between class scores and integer labels or (N, C) target distributions.

    With ``from_logits=True`` (default) y_pred are logits and softmax + log + NLL are fused:
    loss_i = logsumexp(z_i) - sum_j q_ij z_ij, gradient softmax(z_i) * sum_j q_ij - q_i,
    stable for any logit size. With ``from_logits=False`` y_pred are probabilities, clipped
    to [eps, 1 - eps] (the gradient is zero where clipping acts). ``label_smoothing`` s
    replaces the targets q by (1 - s) q + s / C (as torch and Keras do).

    Args:
        from_logits: whether y_pred are logits (True) or probabilities.
        label_smoothing: in [0, 1].
        eps: clipping bound for probabilities (from_logits=False only).

    Shape:
        y_pred (N, C); y_true (N,) integer labels or (N, C) targets; gradient (N, C).

    Example:
        loss, dy = CategoricalCrossEntropy()(logits, labels)
        model.backward(dy)
    """

    name = "categorical_cross_entropy"

    def __init__(self, from_logits: bool = True, label_smoothing: float = 0.0, eps: float = 1e-7):
        if not 0.0 <= label_smoothing <= 1.0:
            raise ValueError(f"CategoricalCrossEntropy: label_smoothing must be in [0, 1], got "
                             f"{label_smoothing!r}")
        if not 0.0 < eps < 0.5:
            raise ValueError(f"CategoricalCrossEntropy: eps must be in (0, 0.5), got {eps!r}")
        self.from_logits = bool(from_logits)
        self.label_smoothing = float(label_smoothing)
        self.eps = float(eps)

    def _sum_and_grad(self, y, y_true):
        labels, q = _class_targets(type(self).__name__, y, y_true)
        n, c = y.shape
        s = self.label_smoothing
        if not self.from_logits:
            if q is None:
                q = np.zeros_like(y)
                q[np.arange(n), labels] = 1
            return self._probabilities(y, q * (1 - s) + s / c if s else q)
        z = np.subtract(y, y.max(axis=1, keepdims=True))
        rows = np.arange(n)
        if q is None:
            # -sum_j q_j log p_j with q = (1-s) onehot + s/C
            linear = (1 - s) * z[rows, labels].astype(np.float64)
            if s:
                linear += (s / c) * z.sum(axis=1, dtype=np.float64)
            q_sum = None
        else:
            if s:
                q = q * (1 - s) + s / c
            linear = np.einsum("ij,ij->i", q, z, dtype=np.float64)
            q_sum = q.sum(axis=1, keepdims=True)
        np.exp(z, out=z)
        sums = z.sum(axis=1, keepdims=True)
        lse = np.log(sums[:, 0], dtype=np.float64)
        np.divide(z, sums, out=z)  # z is now softmax(y): the gradient's base
        if q is None:
            total = float(np.sum(lse) - np.sum(linear))
            z[rows, labels] -= 1 - s
            if s:
                np.subtract(z, s / c, out=z)
        else:
            total = float(np.dot(lse, q_sum[:, 0].astype(np.float64)) - np.sum(linear))
            np.multiply(z, q_sum, out=z)
            np.subtract(z, q, out=z)
        return total, z

    def _probabilities(self, y, q):
        p = np.clip(y, self.eps, 1 - self.eps)
        total = -float(np.sum(q * np.log(p), dtype=np.float64))
        grad = np.negative(q)
        np.divide(grad, p, out=grad)
        grad[(y < self.eps) | (y > 1 - self.eps)] = 0
        return total, grad


class BinaryCrossEntropy(Loss):
    """Binary cross-entropy of independent targets in [0, 1]; the per-sample loss is the mean
    over the features (as Keras).

    With ``from_logits=True`` (default) the sigmoid is fused:
    l = max(x, 0) - x t + log(1 + exp(-|x|)), gradient sigmoid(x) - t, stable for any |x|.
    With ``from_logits=False`` y_pred are probabilities clipped to [eps, 1 - eps].

    Args:
        from_logits: whether y_pred are logits (True) or probabilities.
        eps: clipping bound for probabilities (from_logits=False only).

    Shape:
        y_pred (N, ...) and y_true of the same shape ((N,) and (N, 1) are interchangeable).

    Example:
        loss, dy = BinaryCrossEntropy()(logits, targets)
    """

    name = "binary_cross_entropy"

    def __init__(self, from_logits: bool = True, eps: float = 1e-7):
        if not 0.0 < eps < 0.5:
            raise ValueError(f"BinaryCrossEntropy: eps must be in (0, 0.5), got {eps!r}")
        self.from_logits = bool(from_logits)
        self.eps = float(eps)

    def _sum_and_grad(self, y, y_true):
        t = same_shape(type(self).__name__, y, y_true)
        features = y.size // y.shape[0] if y.shape[0] else 1
        if self.from_logits:
            e = np.abs(y)
            np.negative(e, out=e)
            np.exp(e, out=e)  # exp(-|x|) in (0, 1]: never overflows
            total = (np.sum(np.maximum(y, 0), dtype=np.float64)
                     - np.sum(y * t, dtype=np.float64)
                     + np.sum(np.log1p(e), dtype=np.float64))
            # sigmoid(x) = 1 / (1 + e) for x >= 0, e / (1 + e) for x < 0
            grad = np.where(y >= 0, 1, e)
            np.divide(grad, np.add(e, 1, out=e), out=grad)
            np.subtract(grad, t, out=grad)
        else:
            p = np.clip(y, self.eps, 1 - self.eps)
            one_minus = 1 - p
            total = -(np.sum(t * np.log(p), dtype=np.float64)
                      + np.sum((1 - t) * np.log(one_minus), dtype=np.float64))
            grad = np.subtract(p, t)
            np.divide(grad, np.multiply(p, one_minus, out=p), out=grad)
            grad[(y < self.eps) | (y > 1 - self.eps)] = 0
        np.multiply(grad, 1.0 / features, out=grad)
        return float(total) / features, grad.astype(y.dtype, copy=False)


class MeanSquaredError(Loss):
    """Squared error; the per-sample loss is the mean over the features.

    Shape:
        y_pred (N, ...) and y_true of the same shape ((N,) and (N, 1) are interchangeable).

    Example:
        loss, dy = MeanSquaredError()(y, targets)
    """

    name = "mean_squared_error"

    def _sum_and_grad(self, y, y_true):
        t = same_shape(type(self).__name__, y, y_true)
        features = y.size // y.shape[0] if y.shape[0] else 1
        diff = np.subtract(y, t)
        total = float(np.sum(np.square(diff), dtype=np.float64))
        np.multiply(diff, 2.0 / features, out=diff)
        return total / features, diff


class MeanAbsoluteError(Loss):
    """Absolute error; the per-sample loss is the mean over the features (gradient
    sign(y_pred - y_true), 0 where they are equal, as torch).

    Shape:
        y_pred (N, ...) and y_true of the same shape ((N,) and (N, 1) are interchangeable).

    Example:
        loss, dy = MeanAbsoluteError()(y, targets)
    """

    name = "mean_absolute_error"

    def _sum_and_grad(self, y, y_true):
        t = same_shape(type(self).__name__, y, y_true)
        features = y.size // y.shape[0] if y.shape[0] else 1
        diff = np.subtract(y, t)
        total = float(np.sum(np.abs(diff), dtype=np.float64))
        np.sign(diff, out=diff)
        np.multiply(diff, 1.0 / features, out=diff)
        return total / features, diff


LOSSES: dict[str, type[Loss]] = {
    "categorical_cross_entropy": CategoricalCrossEntropy,
    "cce": CategoricalCrossEntropy,
    "cross_entropy": CategoricalCrossEntropy,
    "binary_cross_entropy": BinaryCrossEntropy,
    "bce": BinaryCrossEntropy,
    "mse": MeanSquaredError,
    "mean_squared_error": MeanSquaredError,
    "mae": MeanAbsoluteError,
    "mean_absolute_error": MeanAbsoluteError,
}


def get_loss(name: str | Loss, **kwargs: Any) -> Loss:
    """The loss registered as ``name`` (case-insensitive), built with ``kwargs``; a Loss
    instance is returned as is.

    Example:
        get_loss("cce", label_smoothing=0.1)
    """
    if isinstance(name, Loss):
        return name
    key = str(name).lower()
    if key not in LOSSES:
        raise ValueError(f"loss {name!r} is unknown; valid choices: {', '.join(sorted(LOSSES))}")
    return LOSSES[key](**kwargs)


__all__ = ["Loss", "CategoricalCrossEntropy", "BinaryCrossEntropy", "MeanSquaredError",
           "MeanAbsoluteError", "LOSSES", "get_loss"]
