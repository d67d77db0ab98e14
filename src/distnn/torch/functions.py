"""Horovod's functions on whole models and Python objects: broadcast_parameters,
broadcast_optimizer_state, broadcast_object, allgather_object, and the examples'
metric_average, over distnn's communicator.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping

import numpy as np
import torch

from ..distributed import Communicator
from .basics import channel
from .collectives import as_numpy
from .exchange import _bcast, broadcast_


def _comm(comm: Communicator | None, process_set=None) -> Communicator:
    return channel(comm, process_set)


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None,
                     process_set=None, *, comm: Communicator | None = None) -> Any:
    """Root's picklable object on every rank (Horovod's signature: ``name`` third)."""
    c = _comm(comm, process_set)
    if hasattr(c, "check_none_joined"):
        c.check_none_joined("broadcast_object")
    if process_set is not None and getattr(process_set, "ranks", None) is not None:
        root_rank = process_set.ranks.index(root_rank)
    return c.bcast_obj(obj, root_rank)


def allgather_object(obj: Any, name: str | None = None, process_set=None, *,
                     comm: Communicator | None = None) -> list:
    """Every rank's picklable object, in rank order."""
    c = _comm(comm, process_set)
    if hasattr(c, "check_none_joined"):
        c.check_none_joined("allgather_object")
    return c.allgather_obj(obj)


def metric_average(value: Any, name: str | None = None, comm: Communicator | None = None,
                   process_set=None) -> float:
    """Mean of a number (or 0-d tensor) over ranks, as a float (Horovod's example helper).
    For exact means over uneven shards, all-reduce sums and counts with op="sum" instead."""
    if isinstance(value, torch.Tensor):
        value = value.detach().double().item()
    out = np.array([float(value)], dtype=np.float64)
    _comm(comm, process_set).allreduce_(out, "mean")
    return float(out[0])


def _named_tensors(params) -> list[tuple[str, torch.Tensor]]:
    if isinstance(params, Mapping):
        items = list(params.items())
    elif isinstance(params, torch.nn.Module):
        items = list(params.state_dict().items())
    else:
        items = list(params)
        if items and isinstance(items[0], torch.Tensor):
            items = [(str(i), t) for i, t in enumerate(items)]
    for name, t in items:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"broadcast_parameters: entry {name!r} is a {type(t).__name__}; "
                            "pass model.state_dict(), model.named_parameters() or a module")
    return items


def _check_same(c: Communicator, who: str, described: list, what: str) -> None:
    everyone = c.allgather_obj(described)
    bad = [r for r, d in enumerate(everyone) if d != everyone[0]]
    if bad:
        first = next(i for i, (a, b) in enumerate(zip(everyone[0] + [None],
                                                      everyone[bad[0]] + [None])) if a != b)
        raise RuntimeError(
            f"{who}: rank {bad[0]} has different {what} than rank 0 (rank 0: "
            f"{len(everyone[0])} entries, entry {first}: "
            f"{everyone[0][first] if first < len(everyone[0]) else None}; rank {bad[0]}: "
            f"{len(everyone[bad[0]])} entries, entry {first}: "
            f"{everyone[bad[0]][first] if first < len(everyone[bad[0]]) else None}); "
            "build the same model (and optimizer) on every rank")


def broadcast_parameters(params: Mapping[str, torch.Tensor] | Iterable | torch.nn.Module,
                         root_rank: int = 0, process_set=None, *,
                         comm: Communicator | None = None) -> None:
    """Make every rank's tensors equal to root's, in place: ``model.state_dict()`` (weights
    and buffers), ``model.named_parameters()``, or a module (its state dict).

    Collective. Raises on every rank when the ranks' names, shapes or dtypes differ.
    """
    c = _comm(comm, process_set)
    if c.size == 1:
        return
    items = _named_tensors(params)
    # one check for all tensors (and the root), then the broadcasts alone
    _check_same(c, "broadcast_parameters", [("root_rank", root_rank)] + [
        (n, tuple(t.shape), str(t.dtype)) for n, t in items], "tensors (or root_rank)")
    root = root_rank
    if process_set is not None and getattr(process_set, "ranks", None) is not None:
        root = process_set.ranks.index(root_rank)
    if hasattr(c, "check_none_joined"):
        c.check_none_joined("broadcast_parameters")
    with torch.no_grad():
        for _, t in items:
            _bcast(t, as_numpy(t, "broadcast_parameters"), root, c)


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int = 0,
                              model: torch.nn.Module | None = None, process_set=None, *,
                              comm: Communicator | None = None) -> None:
    """Make every rank's optimizer state and hyper-parameters equal to root's, without
    stepping the optimizer.

    Root's ``state_dict()`` travels as a skeleton (numbers, hyper-parameters, shapes) plus
    one in-place broadcast per state tensor; the other ranks load it with
    ``load_state_dict``. A fresh optimizer has no state: only its hyper-parameters are
    sent, so its trajectory stays that of one process (Horovod creates the state with a
    zero-gradient ``step()``, which advances Adam's step count). ``model`` is accepted
    for Horovod's signature (distnn needs no model to build the state). A
    ``ZeroRedundancyOptimizer`` is consolidated on root first; each rank loads its part.
    """
    c = _comm(comm, process_set)
    if c.size == 1:
        return
    if process_set is not None and getattr(process_set, "ranks", None) is not None:
        root_rank = process_set.ranks.index(root_rank)
        process_set = None  # root_rank is now relative to c
    # a sharded optimizer (ZeroRedundancyOptimizer): root's whole state, each rank keeps its part
    sharded = hasattr(optimizer, "consolidate_state_dict")
    if sharded:
        optimizer.consolidate_state_dict(to=root_rank)
    state = optimizer.state_dict() if c.rank == root_rank or not sharded else {}
    tensors: list[torch.Tensor] = []

    def skeleton(obj):
        if isinstance(obj, torch.Tensor):
            tensors.append(obj.detach().clone().contiguous())
            return ("__tensor__", tuple(obj.shape), str(obj.dtype).replace("torch.", ""))
        if isinstance(obj, dict):
            return {k: skeleton(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return type(obj)(skeleton(v) for v in obj)
        return obj

    mine = skeleton(state)
    theirs = c.bcast_obj(mine if c.rank == root_rank else None, root_rank)
    _check_same(c, "broadcast_optimizer_state",
                [len(g["params"]) for g in optimizer.param_groups], "parameter groups")
    if c.rank == root_rank:
        for t in tensors:
            broadcast_(t, root_rank, process_set=process_set, comm=c)
        return
    received: list[torch.Tensor] = []

    def rebuild(obj):
        if isinstance(obj, tuple) and len(obj) == 3 and obj[0] == "__tensor__":
            t = torch.empty(obj[1], dtype=getattr(torch, obj[2]))
            received.append(broadcast_(t, root_rank, comm=c))
            return t
        if isinstance(obj, dict):
            return {k: rebuild(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return type(obj)(rebuild(v) for v in obj)
        return obj

    optimizer.load_state_dict(rebuild(theirs))
