"""Keeping replicas consistent: broadcast of weights and optimizer state, SyncBatchNorm,
metric reduction and learning-rate scaling."""
from __future__ import annotations

from typing import Mapping

import numpy as np

from .comm import Communicator, get_comm
from .optimizer import check_same_layout


def _bcast_array(comm: Communicator, value, root: int):
    """Broadcast one array in place when possible; return the (possibly new) value."""
    if isinstance(value, np.ndarray) and value.flags.c_contiguous and value.flags.writeable:
        return comm.bcast_(value, root)
    if isinstance(value, np.ndarray):
        tmp = comm.bcast_(np.ascontiguousarray(value).copy(), root)
        value[...] = tmp
        return value
    return comm.bcast_obj(value, root)


def broadcast_parameters(model, root: int = 0, comm: Communicator | None = None) -> None:
    """Make every rank's weights (the flat parameter buffer) and every layer's ``buffers``
    (e.g. BatchNorm running statistics) equal to those of ``root``, in place.

    Initial weights must be broadcast, never assumed equal because seeds are
    (docs/design.md §Randomness and seeds). Raises on every rank when the ranks hold
    different models.
    """
    comm = comm if comm is not None else get_comm()
    if comm.size == 1:
        return
    check_same_layout(model, comm, "broadcast_parameters")
    comm.bcast_(model.parameters_flat(), root)
    for layer in model.walk():
        for key in sorted(layer.buffers):
            layer.buffers[key] = _bcast_array(comm, layer.buffers[key], root)


def broadcast_optimizer_state(optimizer, root: int = 0,
                              comm: Communicator | None = None) -> None:
    """Make the optimizer state of every rank (``state_arrays()`` in place, plus ``lr`` and
    ``iterations``) equal to that of ``root`` — after a checkpoint was loaded on root."""
    comm = comm if comm is not None else get_comm()
    if comm.size == 1:
        return
    arrays = list(optimizer.state_arrays())
    shapes = [(tuple(a.shape), str(a.dtype)) for a in arrays]
    everyone = comm.allgather_obj(shapes)
    if any(s != everyone[root] for s in everyone):
        bad = [r for r, s in enumerate(everyone) if s != everyone[root]]
        raise RuntimeError(
            f"broadcast_optimizer_state: ranks {bad} have optimizer state arrays "
            f"{[len(everyone[r]) for r in bad]} (count) that differ from root {root}'s "
            f"{len(everyone[root])}; use the same optimizer and model on every rank and "
            "broadcast after its state exists (e.g. after load_state_dict on all ranks)")
    for a in arrays:
        _bcast_array(comm, a, root)
    scalars = {k: getattr(optimizer, k) for k in ("lr", "iterations") if hasattr(optimizer, k)}
    for key, value in comm.bcast_obj(scalars, root).items():
        setattr(optimizer, key, value)


class _SumOverRanks:
    """BatchNormalization.stat_reducer: local per-channel sums -> sums over all ranks."""

    def __init__(self, comm: Communicator):
        self.comm = comm

    def __call__(self, packed: np.ndarray) -> np.ndarray:
        if not (packed.flags.c_contiguous and packed.flags.writeable):
            packed = np.array(packed, order="C")
        return self.comm.allreduce_(packed, "sum")

    def __repr__(self):
        return f"SumOverRanks({self.comm!r})"


def sync_batchnorm(model, comm: Communicator | None = None):
    """Turn every batch-normalization layer of ``model`` into a synchronized one: batch
    statistics are computed over the global batch (all ranks), so running statistics
    stay identical across ranks. Returns the model.

    Every rank must then run forward and backward of every training batch (a rank with
    no samples too), because each BN layer calls an all-reduce there.
    """
    comm = comm if comm is not None else get_comm()
    reducer = _SumOverRanks(comm) if comm.size > 1 else None
    for layer in model.walk():
        if hasattr(layer, "stat_reducer"):
            layer.stat_reducer = reducer
    return model


def metrics_allreduce(metrics: Mapping[str, float], op: str = "sum",
                      comm: Communicator | None = None) -> dict[str, float]:
    """Reduce a dict of numbers over ranks with one all-reduce (float64).

    For exact means over uneven shards pass sums and counts with op="sum" and divide
    afterwards (e.g. ``{"loss_sum": l * n, "correct": c, "n": n}``).
    """
    comm = comm if comm is not None else get_comm()
    keys = sorted(metrics)
    values = np.array([float(metrics[k]) for k in keys], dtype=np.float64)
    comm.allreduce_(values, op)
    return {k: float(v) for k, v in zip(keys, values)}


def scale_lr(lr: float, size: int, rule: str = "linear") -> float:
    """Learning rate for ``size`` ranks (Goyal et al.): "linear" lr*size, "sqrt"
    lr*sqrt(size), "none" lr."""
    rules = {"linear": lambda: lr * size, "sqrt": lambda: lr * size ** 0.5, "none": lambda: lr}
    if rule not in rules:
        raise ValueError(f"rule must be one of {sorted(rules)}, got {rule!r}")
    if size < 1:
        raise ValueError(f"size must be >= 1, got {size}")
    return float(rules[rule]())
