"""Evaluation and prediction over sharded datasets (``Trainer.evaluate`` and
``Trainer.predict``), exact over the ranks, and the per-rank/global batch sizes.
"""
from __future__ import annotations

import numpy as np


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


class _EvaluationMixin:
    """The ``Trainer``'s ``evaluate`` and ``predict``, and the epoch logs from metric sums.
    Uses the trainer's ``comm``, ``model``, ``loss_fn``, ``metric_fns`` and ``loss_key``."""

    def _logs(self, sums: np.ndarray, prefix: str = "") -> dict[str, float]:
        count = sums[-1]
        names = [self.loss_key, *self.metric_fns]
        if count == 0:
            return {prefix + k: float("nan") for k in names}
        return {prefix + k: float(v / count) for k, v in zip(names, sums[:-1])}

    def evaluate(self, dataset, *, batch_size: int | None = None,
                 global_batch_size: int | None = None, steps: int = 0,
                 prefix: str = "") -> dict[str, float]:
        """Loss and metrics over ``dataset``, exact over the ranks (every sample counted
        once). Collective: every rank must call it.

        Args:
            dataset: a Dataset.
            batch_size / global_batch_size: per-rank (default 256) or global batch size.
            steps: evaluate at most this many batches (0: all).
            prefix: put before every key (the trainer uses "val_").
        """
        comm = self.comm
        if batch_size is None and global_batch_size is None:
            batch_size = 256
        _, gbs = resolve_batch_sizes(batch_size, global_batch_size, comm.size)
        sums = np.zeros(len(self.metric_fns) + 2, dtype=np.float64)
        batches = dataset.batches(gbs, shuffle=False, rank=comm.rank, size=comm.size)
        try:
            for i, batch in enumerate(batches):
                if steps and i >= steps:
                    break
                n = len(batch.x)
                if not n:
                    continue
                logits = self.model.forward(batch.x, training=False)
                loss_value, _ = self.loss_fn(logits, batch.y, denom=n)
                sums[0] += float(loss_value) * n
                for j, fn in enumerate(self.metric_fns.values(), start=1):
                    sums[j] += float(fn(logits, batch.y))
                sums[-1] += n
        finally:
            close = getattr(batches, "close", None)
            if close is not None:
                close()
        comm.allreduce_(sums, "sum")
        self.last_eval_count = int(sums[-1])
        return self._logs(sums, prefix)

    def predict(self, data, *, batch_size: int = 256, steps: int = 0,
                return_labels: bool = False):
        """Model outputs (logits) for a Dataset (in dataset order, the ranks sharing the
        work, every rank getting the whole result; collective) or for an array (computed
        locally). With ``return_labels`` (datasets only) returns (outputs, labels)."""
        if isinstance(data, np.ndarray):
            return self.model.predict(data, batch_size=batch_size)
        comm = self.comm
        _, gbs = resolve_batch_sizes(batch_size, None, comm.size)
        empty = np.empty((0,) + tuple(self.model.output_shape), self.model.dtype)
        outs, labels = [], []
        batches = data.batches(gbs, shuffle=False, rank=comm.rank, size=comm.size)
        try:
            for i, batch in enumerate(batches):
                if steps and i >= steps:
                    break
                outs.append(self.model.forward(batch.x, training=False) if len(batch.x)
                            else empty)
                labels.append(batch.y)
        finally:
            close = getattr(batches, "close", None)
            if close is not None:
                close()
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
