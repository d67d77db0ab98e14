"""What a step measures and how a model is scored: ``MetricSet`` (the loss and metric
functions, their per-batch sums and epoch logs), ``evaluate`` and ``predict`` over sharded
datasets (exact over the ranks), and the per-rank/global batch sizes.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from .callback_base import _ALIASES


def resolve_batch_sizes(batch_size: int | None, global_batch_size: int | None,
                        size: int) -> tuple[int, int]:
    """(per-rank, global) batch sizes. ``batch_size`` is per rank (PyDTNN); a given
    ``global_batch_size`` wins and the per-rank size is then its share rounded up."""
    for name, value in (("batch_size", batch_size), ("global_batch_size", global_batch_size)):
        if value is not None and (isinstance(value, bool) or int(value) != value or value < 1):
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    if global_batch_size is not None:
        return -(-int(global_batch_size) // size), int(global_batch_size)
    if batch_size is None:
        raise ValueError("give batch_size (per rank) or global_batch_size")
    return int(batch_size), int(batch_size) * size


def metric_key(name: str) -> str:
    """The key a metric is logged under: its canonical name ("categorical_accuracy" and
    "acc" log as "accuracy")."""
    base = str(name).lower()
    alias = _ALIASES.get(base)
    return alias if alias is not None and alias != "loss" else base


class MetricSet:
    """The loss and metrics of a run, and the arithmetic of their exact sums.

    Sums are kept in one float64 array ``[loss_sum, metric_sums..., token_counts...,
    count]`` so that one all-reduce makes them exact over the ranks: a metric that counts
    what it averages over (``counted``: the token metrics) has its own count slot, and its
    ``finish`` (perplexity's exp) is applied to the exact mean.

    Args:
        loss: loss name for ``distnn.nn.losses.get_loss`` or a callable
            ``loss(logits, y, denom=...) -> (value, dlogits)``.
        metrics: metric names for ``distnn.nn.metrics.get_metric`` (or callables with a
            ``__name__``); each returns the SUM over a batch.
    """

    loss_key = "loss"

    def __init__(self, loss: str | Callable = "categorical_cross_entropy",
                 metrics: Sequence[str | Callable] = ("accuracy",)):
        if callable(loss):
            self.loss_fn, self.loss_name = loss, getattr(loss, "__name__", type(loss).__name__)
        else:
            from ..nn.losses import get_loss
            self.loss_fn, self.loss_name = get_loss(loss), str(loss)
        self.metric_fns: dict[str, Callable] = {}
        for m in metrics:
            if callable(m):
                key, fn = metric_key(getattr(m, "__name__", type(m).__name__)), m
            else:
                from ..nn.metrics import get_metric
                key, fn = metric_key(m), get_metric(m)
            if key in self.metric_fns or key == self.loss_key:
                raise ValueError(f"metrics: {m!r} is given twice (or clashes with 'loss'); "
                                 f"got {list(metrics)}")
            self.metric_fns[key] = fn
        # the count slot of each counted metric, after the metric sums
        self._slots = {}
        for i, fn in enumerate(self.metric_fns.values(), start=1):
            if getattr(fn, "counted", False):
                self._slots[i] = len(self.metric_fns) + 1 + len(self._slots)

    @property
    def names(self) -> list[str]:
        return [self.loss_key, *self.metric_fns]

    def zeros(self) -> np.ndarray:
        return np.zeros(len(self.metric_fns) + 2 + len(self._slots), dtype=np.float64)

    def accumulate(self, sums: np.ndarray, logits, y, loss_value: float, weight: int) -> None:
        """Add one batch: the loss (a mean over ``weight`` samples) and every metric."""
        sums[0] += float(loss_value) * weight
        for i, fn in enumerate(self.metric_fns.values(), start=1):
            if i in self._slots:
                total, counted = fn(logits, y)
                sums[i] += float(total)
                sums[self._slots[i]] += float(counted)
            else:
                sums[i] += float(fn(logits, y))
        sums[-1] += len(y)

    def logs(self, sums: np.ndarray, prefix: str = "") -> dict[str, float]:
        from ..nn.metrics import finish
        out = {}
        for i, (key, value) in enumerate(zip(self.names, sums)):
            count = sums[self._slots.get(i, -1)]
            if count == 0:
                out[prefix + key] = float("nan")
            elif i == 0:
                out[prefix + key] = float(value / count)
            else:
                out[prefix + key] = finish(self.metric_fns[key], float(value / count))
        return out


def _close(batches) -> None:
    close = getattr(batches, "close", None)
    if close is not None:
        close()


def evaluate(model, metrics: MetricSet, comm, dataset, *, batch_size: int | None = None,
             global_batch_size: int | None = None, steps: int = 0,
             prefix: str = "") -> tuple[dict[str, float], int]:
    """Loss and metrics of ``model`` over ``dataset``, exact over the ranks (every sample
    counted once), and the number of samples seen. Collective: every rank must call it.

    Args:
        batch_size / global_batch_size: per-rank (default 256) or global batch size.
        steps: evaluate at most this many batches (0: all).
        prefix: put before every key (the trainer uses "val_").
    """
    if batch_size is None and global_batch_size is None:
        batch_size = 256
    _, gbs = resolve_batch_sizes(batch_size, global_batch_size, comm.size)
    sums = metrics.zeros()
    batches = dataset.batches(gbs, shuffle=False, rank=comm.rank, size=comm.size)
    try:
        for i, batch in enumerate(batches):
            if steps and i >= steps:
                break
            n = len(batch.x)
            if not n:
                continue
            logits = model.forward(batch.x, training=False)
            loss_value, _ = metrics.loss_fn(logits, batch.y, denom=n)
            metrics.accumulate(sums, logits, batch.y, loss_value, n)
    finally:
        _close(batches)
    comm.allreduce_(sums, "sum")
    return metrics.logs(sums, prefix), int(sums[-1])


def predict(model, comm, data, *, batch_size: int = 256, steps: int = 0,
            return_labels: bool = False, gather: bool = True):
    """Model outputs (logits) for a Dataset (in dataset order, the ranks sharing the work,
    every rank getting the whole result; collective) or for an array (computed locally).
    With ``return_labels`` (datasets only) returns (outputs, labels). ``gather=False``
    (datasets only): nothing is sent, each rank returns its own part and the dataset
    indices of its rows, (outputs, labels, indices), for outputs too big for one rank."""
    if isinstance(data, np.ndarray):
        return model.predict(data, batch_size=batch_size)
    _, gbs = resolve_batch_sizes(batch_size, None, comm.size)
    empty = np.empty((0,) + tuple(model.output_shape), model.dtype)
    outs, labels, index = [], [], []
    from ..nn.inference import runner
    forward = runner(model) or (lambda x: model.forward(x, training=False))
    batches = data.batches(gbs, shuffle=False, rank=comm.rank, size=comm.size)
    try:
        for i, batch in enumerate(batches):
            if steps and i >= steps:
                break
            outs.append(forward(batch.x) if len(batch.x) else empty)
            labels.append(batch.y)
            start = i * gbs  # this rank's np.array_split piece of global batch i
            rows = np.arange(start, min(start + gbs, len(data)))
            index.append(np.array_split(rows, comm.size)[comm.rank])
    finally:
        _close(batches)
    if not gather:
        none = np.empty(0, np.int64)
        return (np.concatenate(outs) if outs else empty,
                np.concatenate(labels) if labels else none,
                np.concatenate(index) if index else none)
    if comm.size > 1:
        # Shards are np.array_split pieces in rank order: global batch i is the ranks'
        # i-th parts, concatenated in rank order.
        everyone = comm.allgather_obj((outs, labels))
        outs = [everyone[r][0][i] for i in range(len(outs)) for r in range(comm.size)]
        labels = [everyone[r][1][i] for i in range(len(labels)) for r in range(comm.size)]
    result = np.concatenate(outs) if outs else empty
    if return_labels:
        return result, (np.concatenate(labels) if labels else np.empty(0, np.int64))
    return result
