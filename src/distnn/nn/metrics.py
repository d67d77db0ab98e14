"""Metrics: ``metric(y_pred, y_true) -> float`` returns the SUM over the batch of a
per-sample value.

The trainer all-reduces these sums (and the sample counts) across ranks and divides once,
so a distributed metric equals the one computed on the whole data set. y_pred are the model
outputs as given (logits or probabilities; nothing is applied to them: argmax-based metrics
do not care, the others follow Keras, which does not apply softmax either); y_true are
integer labels of shape (N,) or one-hot targets of shape (N, C).

Token metrics (``perplexity``, ``token_accuracy``) score (N, T, C) outputs against (N, T)
labels and count tokens, not samples: they return ``(sum over the counted tokens, count)``
and say so with ``counted = True``; labels below 0 (torch's ignore_index -100) are not
counted. ``finish`` (perplexity: ``exp``) is applied to the exact mean over every rank's
tokens, so a perplexity is exp(mean token loss), never a mean of per-batch perplexities.
"""
from __future__ import annotations

import math
import re
from typing import Any, Callable

import numpy as np

from .losses import same_shape

Metric = Callable[[np.ndarray, np.ndarray], float]


def _pred(name: str, y_pred: Any) -> np.ndarray:
    y = np.asarray(y_pred)
    if y.ndim != 2:
        raise ValueError(f"{name}: y_pred must have shape (N, C), got {y.shape}")
    return y


def _labels(name: str, y: np.ndarray, y_true: Any) -> np.ndarray:
    """Integer labels (N,) from labels or one-hot targets, checked against y's shape."""
    t = np.asarray(y_true)
    n, c = y.shape
    if t.ndim == 2:
        if t.shape != y.shape:
            raise ValueError(f"{name}: y_true has shape {t.shape} but y_pred has shape "
                             f"{y.shape}; pass labels (N,) or one-hot targets (N, C)")
        return t.argmax(axis=1)
    if t.ndim != 1 or t.shape[0] != n:
        raise ValueError(f"{name}: y_true has shape {t.shape} but y_pred has shape {y.shape}; "
                         "pass labels (N,) or one-hot targets (N, C)")
    if t.dtype.kind not in "iub" and not (t.dtype.kind == "f" and np.all(np.mod(t, 1) == 0)):
        raise ValueError(f"{name}: labels of shape (N,) must be integers, got dtype {t.dtype}")
    labels = t.astype(np.intp, copy=False)
    if labels.size and (labels.min() < 0 or labels.max() >= c):
        bad = int(labels.min()) if labels.min() < 0 else int(labels.max())
        raise ValueError(f"{name}: y_true holds label {bad}, outside [0, {c}) for y_pred with "
                         f"{c} classes")
    return labels


def _one_hot(name: str, y: np.ndarray, y_true: Any) -> np.ndarray:
    """(N, C) float targets from labels or one-hot/probability targets."""
    t = np.asarray(y_true)
    if t.ndim == 2 and t.shape == y.shape:
        return t.astype(np.float64, copy=False)
    labels = _labels(name, y, t)
    out = np.zeros(y.shape, np.float64)
    out[np.arange(len(labels)), labels] = 1.0
    return out


def categorical_accuracy(y_pred: np.ndarray, y_true: np.ndarray) -> float:
    """Number of samples whose arg-max class is the true class; for (N, T, C) outputs, the
    sum over samples of the fraction of their T tokens predicted right (divided by the
    samples: the token accuracy; labels below 0 count as wrong, ``token_accuracy`` leaves
    them out)."""
    if np.ndim(y_pred) == 3:
        correct, _ = _token_counts("categorical_accuracy", y_pred, y_true)
        return correct / np.shape(y_pred)[1]
    y = _pred("categorical_accuracy", y_pred)
    labels = _labels("categorical_accuracy", y, y_true)
    return float(np.count_nonzero(y.argmax(axis=1) == labels))


def top_k_accuracy(y_pred: np.ndarray, y_true: np.ndarray, k: int = 5) -> float:
    """Number of samples whose true class is among the k highest scores. Ties straddling the
    k-th place count as in the top k (fewer than k classes score strictly higher), as
    ``tf.math.in_top_k``."""
    if isinstance(k, bool) or int(k) != k or k < 1:
        raise ValueError(f"top_k_accuracy: k must be an integer >= 1, got {k!r}")
    y = _pred(f"top{k}_accuracy", y_pred)
    labels = _labels(f"top{k}_accuracy", y, y_true)
    true_score = y[np.arange(len(labels)), labels]
    higher = np.count_nonzero(y > true_score[:, None], axis=1)
    return float(np.count_nonzero(higher < k))


def top_k_metric(k: int) -> Metric:
    """The metric ``top_k_accuracy`` with k fixed, named ``top<k>_accuracy``."""
    if isinstance(k, bool) or int(k) != k or k < 1:
        raise ValueError(f"top_k_metric: k must be an integer >= 1, got {k!r}")
    k = int(k)

    def metric(y_pred: np.ndarray, y_true: np.ndarray) -> float:
        return top_k_accuracy(y_pred, y_true, k=k)

    metric.__name__ = metric.__qualname__ = f"top{k}_accuracy"
    metric.__doc__ = f"Number of samples whose true class is among the {k} highest scores."
    return metric


def categorical_hinge(y_pred: np.ndarray, y_true: np.ndarray) -> float:
    """Sum of max(0, 1 + max_j (1 - t_j) y_j - sum_j t_j y_j) (Keras' categorical hinge;
    t one-hot, y as given)."""
    y = _pred("categorical_hinge", y_pred)
    t = _one_hot("categorical_hinge", y, y_true)
    pos = np.sum(t * y, axis=1)
    neg = np.max((1.0 - t) * y, axis=1, initial=-np.inf)
    return float(np.sum(np.maximum(neg - pos + 1.0, 0.0)))


def categorical_mse(y_pred: np.ndarray, y_true: np.ndarray) -> float:
    """Sum over samples of the mean over classes of (y_pred - one_hot)^2 (y_pred as given)."""
    y = _pred("categorical_mse", y_pred)
    t = _one_hot("categorical_mse", y, y_true)
    return float(np.sum(np.mean(np.square(y - t), axis=1)))


def categorical_mae(y_pred: np.ndarray, y_true: np.ndarray) -> float:
    """Sum over samples of the mean over classes of |y_pred - one_hot| (y_pred as given)."""
    y = _pred("categorical_mae", y_pred)
    t = _one_hot("categorical_mae", y, y_true)
    return float(np.sum(np.mean(np.abs(y - t), axis=1)))


def _tokens(name: str, y_pred: Any, y_true: Any):
    """(scores (M, C), labels (M,), counted rows (bool, M)) of (N, T, C) outputs and (N, T)
    labels; labels below 0 are not counted."""
    y = np.asarray(y_pred)
    t = np.asarray(y_true)
    if y.ndim != 3 or t.shape != y.shape[:2]:
        raise ValueError(f"{name}: needs outputs (N, T, C) and labels (N, T), got y_pred "
                         f"{y.shape} and y_true {t.shape}")
    c = y.shape[-1]
    t = t.reshape(-1)
    counted = t >= 0
    labels = np.where(counted, t, 0)
    if labels.size and int(labels.max()) >= c:
        bad = int(labels.max())
        raise ValueError(f"{name}: y_true holds token {bad}, outside the vocabulary [0, {c}) "
                         f"of y_pred; build the model with the data's vocabulary size")
    return y.reshape(-1, c), labels.astype(np.intp), counted


def _token_counts(name, y_pred, y_true) -> tuple[float, float]:
    y, labels, counted = _tokens(name, y_pred, y_true)
    right = (y.argmax(axis=1) == labels) & counted
    return float(np.count_nonzero(right)), float(np.count_nonzero(counted))


def token_accuracy(y_pred: np.ndarray, y_true: np.ndarray) -> tuple[float, float]:
    """(tokens whose arg-max is the label, tokens counted) of (N, T, C) outputs."""
    return _token_counts("token_accuracy", y_pred, y_true)


def perplexity(y_pred: np.ndarray, y_true: np.ndarray) -> tuple[float, float]:
    """(sum of the tokens' cross-entropy of the logits, tokens counted): the run logs
    exp(sum / count) over all its tokens (``finish``), the perplexity. No label smoothing:
    the loss's smoothing does not change it."""
    y, labels, counted = _tokens("perplexity", y_pred, y_true)
    y, labels = y[counted], labels[counted]
    if not len(y):
        return 0.0, 0.0
    top = y.max(axis=1, keepdims=True)
    z = np.subtract(y, top, dtype=np.float64)
    lse = np.log(np.exp(z).sum(axis=1))
    return float(np.sum(lse - z[np.arange(len(y)), labels])), float(len(y))


token_accuracy.counted = perplexity.counted = True
perplexity.finish = math.exp


def finish(fn: Metric, mean: float) -> float:
    """A metric's logged value from its mean (``fn.finish``, e.g. perplexity's exp; inf
    where that overflows)."""
    f = getattr(fn, "finish", None)
    if f is None:
        return mean
    try:
        return float(f(mean))
    except OverflowError:
        return float("inf")


def _regression_diff(name: str, y_pred: Any, y_true: Any) -> np.ndarray:
    y = np.asarray(y_pred, dtype=np.float64)
    if y.ndim < 1:
        raise ValueError(f"{name}: y_pred must have a batch axis, got shape {y.shape}")
    return (y - same_shape(name, y, y_true)).reshape(y.shape[0], int(np.prod(y.shape[1:])))


def mean_squared_error(y_pred: np.ndarray, y_true: np.ndarray) -> float:
    """Sum over samples of the mean over features of (y_pred - y_true)^2."""
    d = _regression_diff("mean_squared_error", y_pred, y_true)
    return float(np.sum(np.mean(np.square(d), axis=1))) if d.size else 0.0


def mean_absolute_error(y_pred: np.ndarray, y_true: np.ndarray) -> float:
    """Sum over samples of the mean over features of |y_pred - y_true|."""
    d = _regression_diff("mean_absolute_error", y_pred, y_true)
    return float(np.sum(np.mean(np.abs(d), axis=1))) if d.size else 0.0


METRICS: dict[str, Metric] = {
    "accuracy": categorical_accuracy,
    "categorical_accuracy": categorical_accuracy,
    "acc": categorical_accuracy,
    "top5": top_k_metric(5),
    "top_5_accuracy": top_k_metric(5),
    "categorical_hinge": categorical_hinge,
    "categorical_mse": categorical_mse,
    "categorical_mae": categorical_mae,
    "mse": mean_squared_error,
    "mean_squared_error": mean_squared_error,
    "mae": mean_absolute_error,
    "mean_absolute_error": mean_absolute_error,
    "perplexity": perplexity,
    "ppl": perplexity,
    "token_accuracy": token_accuracy,
}

_TOP_K = re.compile(r"top_?(\d+)(_accuracy)?")


def get_metric(name: str | Metric) -> Metric:
    """The metric registered as ``name`` (case-insensitive); ``"top<k>"`` and
    ``"top_<k>_accuracy"`` give top-k accuracy for any k >= 1; a callable is returned as is.

    Example:
        get_metric("top3")(logits, labels)  # how many of the batch have the label in the top 3
    """
    if callable(name):
        return name
    key = str(name).lower()
    if key in METRICS:
        return METRICS[key]
    match = _TOP_K.fullmatch(key)
    if match:
        k = int(match.group(1))
        if k < 1:
            raise ValueError(f"metric {name!r}: k must be >= 1 in 'top<k>', got {k}")
        return top_k_metric(k)
    raise ValueError(f"metric {name!r} is unknown; valid choices: "
                     f"{', '.join(sorted(METRICS))}, or 'top<k>' for any k >= 1")


__all__ = ["Metric", "METRICS", "get_metric", "categorical_accuracy", "top_k_accuracy",
           "top_k_metric", "categorical_hinge", "categorical_mse", "categorical_mae",
           "mean_squared_error", "mean_absolute_error", "perplexity", "token_accuracy",
           "finish"]
