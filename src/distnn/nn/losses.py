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
            denom = self._default_denom(y, y_true)
        elif not (isinstance(denom, (int, float, np.integer, np.floating))
                  and math.isfinite(denom) and denom > 0):
            raise ValueError(f"{owner}: denom must be a number > 0 (the count of samples the "
                             f"loss is averaged over, e.g. the global batch size), got {denom!r}")
        total, grad = self._sum_and_grad(y, y_true)
        if n == 0 or denom == 0:  # nothing to average (every label ignored): no loss
            return 0.0, grad
        np.multiply(grad, 1.0 / float(denom), out=grad)
        return float(total) / float(denom), grad

    def _sum_and_grad(self, y: Array, y_true: Any) -> tuple[float, Array]:
        raise NotImplementedError

    def _default_denom(self, y: Array, y_true: Any) -> float:
        """What the loss is divided by without ``denom``: the samples (a mean)."""
        return y.shape[0]

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({args})"


class CategoricalCrossEntropy(Loss):
    """Cross-entropy between class scores and integer labels or target distributions, per
    sample (N, C) or per token (N, T, C): a language model's logits over its vocabulary.

    With ``from_logits=True`` (default) y_pred are logits and softmax + log + NLL are fused:
    loss = logsumexp(z) - sum_j q_j z_j, gradient softmax(z) * sum_j q_j - q, stable for any
    logit size. With ``from_logits=False`` y_pred are probabilities, clipped to
    [eps, 1 - eps] (the gradient is zero where clipping acts). ``label_smoothing`` s
    replaces the targets q by (1 - s) q + s / C (as torch and Keras do).

    Tokens: a sample of (T, C) scores has a per-sample loss of the sum of its tokens'
    losses divided by T (the mean over its positions), so the loss of a batch is the mean
    token loss, and ``denom`` still counts samples. Labels equal to ``ignore_index`` (torch's
    -100 by default) add nothing; without ``denom`` the loss is divided by the number of
    labels not ignored (torch's ``reduction="mean"``: ``F.cross_entropy`` exactly, also
    with ``ignore_index`` and ``label_smoothing``); with ``denom`` (training: the global
    batch) by ``denom * T``, the same whenever nothing is ignored, as in windows of text.

    Args:
        from_logits: whether y_pred are logits (True) or probabilities.
        label_smoothing: in [0, 1].
        eps: clipping bound for probabilities (from_logits=False only).
        ignore_index: the label that marks a position to leave out (None: every label
            counts and must lie in [0, C)).

    Shape:
        y_pred (N, C) or (N, T, C); y_true (N,) / (N, T) integer labels or targets of
        y_pred's shape; gradient of y_pred's shape.

    Example:
        loss, dy = CategoricalCrossEntropy()(logits, labels)
        model.backward(dy)
    """

    name = "categorical_cross_entropy"

    def __init__(self, from_logits: bool = True, label_smoothing: float = 0.0,
                 eps: float = 1e-7, ignore_index: int | None = -100):
        if not 0.0 <= label_smoothing <= 1.0:
            raise ValueError(f"CategoricalCrossEntropy: label_smoothing must be in [0, 1], got "
                             f"{label_smoothing!r}")
        if not 0.0 < eps < 0.5:
            raise ValueError(f"CategoricalCrossEntropy: eps must be in (0, 0.5), got {eps!r}")
        if ignore_index is not None and (isinstance(ignore_index, bool)
                                         or int(ignore_index) != ignore_index):
            raise ValueError(f"CategoricalCrossEntropy: ignore_index must be an integer or None, "
                             f"got {ignore_index!r}")
        self.from_logits = bool(from_logits)
        self.label_smoothing = float(label_smoothing)
        self.eps = float(eps)
        self.ignore_index = None if ignore_index is None else int(ignore_index)

    def _targets(self, y, y_true) -> tuple[Array | None, Array | None, Array | None]:
        """(labels, valid rows or None, None) or (None, None, targets), rows of (M, C)."""
        owner = type(self).__name__
        if y.ndim < 2:
            raise ValueError(f"{owner}: y_pred must have shape (N, C) or (N, T, C), got "
                             f"{y.shape}")
        t = np.asarray(y_true)
        c = y.shape[-1]
        if t.shape == y.shape:
            return None, None, t.reshape(-1, c).astype(y.dtype, copy=False)
        if t.shape != y.shape[:-1]:
            raise ValueError(f"{owner}: y_true has shape {t.shape} but y_pred has shape "
                             f"{y.shape}; pass labels of shape {y.shape[:-1]} or targets of "
                             f"shape {y.shape}")
        t = t.reshape(-1)
        valid = None
        if self.ignore_index is not None and t.dtype.kind in "iuf":
            ignored = t == self.ignore_index
            if ignored.any():
                valid = ~ignored
                t = np.where(valid, t, 0)
        return _labels(owner, t, c), valid, None

    def _default_denom(self, y, y_true) -> float:
        labels, valid, _ = self._targets(y, y_true)
        if valid is None:
            return y.shape[0]
        return np.count_nonzero(valid) / (y.size // (y.shape[0] * y.shape[-1]))

    def _sum_and_grad(self, y, y_true):
        labels, valid, q = self._targets(y, y_true)
        c = y.shape[-1]
        per = y.size // (y.shape[0] * c) if y.shape[0] else 1  # positions per sample
        total, grad = self._rows(y.reshape(-1, c), labels, valid, q)
        if per != 1:
            total /= per
            np.multiply(grad, 1.0 / per, out=grad)
        return total, grad.reshape(y.shape)

    def _rows(self, y, labels, valid, q):
        """Sum of the row losses of (M, C) scores and its gradient (zero on ignored rows)."""
        n, c = y.shape
        s = self.label_smoothing
        if not self.from_logits:
            if q is None:
                q = np.zeros_like(y)
                q[np.arange(n), labels] = 1
                if s:
                    q = q * (1 - s) + s / c
                if valid is not None:
                    q[~valid] = 0
            elif s:
                q = q * (1 - s) + s / c
            return self._probabilities(y, q)
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
            row_loss = lse - linear
            z[rows, labels] -= 1 - s
            if s:
                np.subtract(z, s / c, out=z)
            if valid is not None:
                row_loss = row_loss[valid]
                z[~valid] = 0
            total = float(np.sum(row_loss))
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


class _DifferenceLoss(Loss):
    """A loss of ``y_pred - y_true`` element by element, meaned over the features:
    subclasses turn the difference into the summed loss and, in place, its gradient."""

    def _sum_and_grad(self, y, y_true):
        t = same_shape(type(self).__name__, y, y_true)
        features = y.size // y.shape[0] if y.shape[0] else 1
        diff = np.subtract(y, t)
        return self._total_and_grad(diff, features) / features, diff

    def _total_and_grad(self, diff: np.ndarray, features: int) -> float:
        raise NotImplementedError


class MeanSquaredError(_DifferenceLoss):
    """Squared error; the per-sample loss is the mean over the features.

    Shape:
        y_pred (N, ...) and y_true of the same shape ((N,) and (N, 1) are interchangeable).

    Example:
        loss, dy = MeanSquaredError()(y, targets)
    """

    name = "mean_squared_error"

    def _total_and_grad(self, diff, features):
        total = float(np.sum(np.square(diff), dtype=np.float64))
        np.multiply(diff, 2.0 / features, out=diff)
        return total


class MeanAbsoluteError(_DifferenceLoss):
    """Absolute error; the per-sample loss is the mean over the features (gradient
    sign(y_pred - y_true), 0 where they are equal, as torch). Shape: as
    ``MeanSquaredError``'s.

    Example:
        loss, dy = MeanAbsoluteError()(y, targets)
    """

    name = "mean_absolute_error"

    def _total_and_grad(self, diff, features):
        total = float(np.sum(np.abs(diff), dtype=np.float64))
        np.multiply(np.sign(diff, out=diff), 1.0 / features, out=diff)
        return total


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
