"""Collectives on torch tensors and the consistency of replicas, over distnn's communicator.

CPU tensors share memory with NumPy arrays (``tensor.numpy()``), so every collective here
is distnn's in-place MPI call on that array: no pickling, no packing for contiguous tensors.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping

import numpy as np
import torch

from .. import distributed as dist
from ..distributed import Communicator

Average = "average"
Sum = "sum"
Max = "max"
Min = "min"
_OPS = {"average": "mean", "mean": "mean", "sum": "sum", "max": "max", "min": "min"}


def _comm(comm: Communicator | None) -> Communicator:
    return comm if comm is not None else dist.get_comm()


def _op(op: str | None, average: bool | None) -> str:
    if average is not None:
        return "mean" if average else "sum"
    key = str(op).lower()
    if key not in _OPS:
        raise ValueError(f"op must be one of {sorted(set(_OPS) - {'mean'})}, got {op!r}")
    return _OPS[key]


def as_numpy(t: torch.Tensor, what: str) -> np.ndarray:
    """The NumPy view of a CPU tensor (no copy)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{what} needs a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cpu":
        raise ValueError(f"{what}: tensor is on {t.device}; distnn.torch communicates CPU "
                         "tensors (MPI over host memory): move it with .cpu()")
    if t.dtype in (torch.bfloat16, torch.complex32) or t.is_sparse:
        raise TypeError(f"{what}: dtype {t.dtype} (sparse={t.is_sparse}) has no NumPy "
                        "equivalent; convert it (e.g. .float()) first")
    return t.detach().numpy()


def _inplace(t: torch.Tensor, what: str, fn) -> torch.Tensor:
    """Run ``fn(array)`` in place on t's memory (through a contiguous copy if needed)."""
    a = as_numpy(t, what)
    if a.flags.c_contiguous and a.flags.writeable:
        fn(a)
    else:
        tmp = np.ascontiguousarray(a).copy()
        fn(tmp)
        with torch.no_grad():
            t.copy_(torch.from_numpy(tmp))
    return t


def allreduce_(tensor: torch.Tensor, op: str = Average, *, average: bool | None = None,
               comm: Communicator | None = None) -> torch.Tensor:
    """Reduce ``tensor`` over ranks in place ("average", "sum", "max", "min"); returns it."""
    c, mode = _comm(comm), _op(op, average)
    return _inplace(tensor, "allreduce_", lambda a: c.allreduce_(a, mode))


def allreduce(tensor: torch.Tensor, op: str = Average, *, average: bool | None = None,
              comm: Communicator | None = None) -> torch.Tensor:
    """Reduction of ``tensor`` over ranks as a new tensor (Horovod's ``hvd.allreduce``).
    Integer tensors averaged come back as float64."""
    mode = _op(op, average)
    out = tensor.detach().clone().contiguous()
    if mode == "mean" and not out.is_floating_point():
        out = out.double()
    return allreduce_(out, "sum" if mode == "sum" else op, average=average, comm=comm)


def allgather(tensor: torch.Tensor, comm: Communicator | None = None) -> torch.Tensor:
    """Every rank's tensor concatenated along dim 0 in rank order (first dimensions may
    differ between ranks; the other dimensions and the dtype must agree)."""
    c = _comm(comm)
    a = np.ascontiguousarray(as_numpy(tensor, "allgather"))
    if a.ndim == 0:
        a = a.reshape(1)
    shapes = c.allgather_obj((a.shape, str(a.dtype)))
    if any(s[0][1:] != shapes[0][0][1:] or s[1] != shapes[0][1] for s in shapes):
        raise ValueError(f"allgather: ranks pass tensors of shapes/dtypes {shapes}; all but "
                         "the first dimension and the dtype must agree")
    longest = max(s[0][0] for s in shapes)
    padded = np.zeros((longest,) + a.shape[1:], a.dtype)
    padded[:len(a)] = a
    everyone = c.allgather(padded)
    return torch.from_numpy(np.concatenate([everyone[r][:s[0][0]]
                                            for r, s in enumerate(shapes)]))


def broadcast_(tensor: torch.Tensor, root_rank: int = 0,
               comm: Communicator | None = None) -> torch.Tensor:
    """Overwrite ``tensor`` in place with root's; returns it."""
    c = _comm(comm)
    return _inplace(tensor, "broadcast_", lambda a: c.bcast_(a, root_rank))


def broadcast(tensor: torch.Tensor, root_rank: int = 0,
              comm: Communicator | None = None) -> torch.Tensor:
    """Root's tensor on every rank, as a new tensor."""
    return broadcast_(tensor.detach().clone().contiguous(), root_rank, comm)


def broadcast_object(obj: Any, root_rank: int = 0, comm: Communicator | None = None) -> Any:
    """Root's picklable object on every rank."""
    return _comm(comm).bcast_obj(obj, root_rank)


def metric_average(value: Any, comm: Communicator | None = None) -> float:
    """Mean of a number (or 0-d tensor) over ranks, as a float (Horovod's example helper).
    For exact means over uneven shards, all-reduce sums and counts with op="sum" instead."""
    if isinstance(value, torch.Tensor):
        value = value.detach().double().item()
    out = np.array([float(value)], dtype=np.float64)
    _comm(comm).allreduce_(out, "mean")
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
                         root_rank: int = 0, comm: Communicator | None = None) -> None:
    """Make every rank's tensors equal to root's, in place: ``model.state_dict()`` (weights
    and buffers), ``model.named_parameters()``, or a module (its state dict).

    Collective. Raises on every rank when the ranks' names, shapes or dtypes differ.
    """
    c = _comm(comm)
    if c.size == 1:
        return
    items = _named_tensors(params)
    _check_same(c, "broadcast_parameters",
                [(n, tuple(t.shape), str(t.dtype)) for n, t in items], "tensors")
    with torch.no_grad():
        for _, t in items:
            broadcast_(t, root_rank, c)


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int = 0,
                              comm: Communicator | None = None) -> None:
    """Make every rank's optimizer state and hyper-parameters equal to root's, without
    stepping the optimizer.

    Root's ``state_dict()`` travels as a skeleton (numbers, hyper-parameters, shapes) plus
    one in-place broadcast per state tensor; the other ranks load it with
    ``load_state_dict``. A fresh optimizer has no state: only its hyper-parameters are
    sent, so its trajectory stays that of one process (Horovod creates the state with a
    zero-gradient ``step()``, which advances Adam's step count).
    """
    c = _comm(comm)
    if c.size == 1:
        return
    optimizer = getattr(optimizer, "_distnn_base", optimizer)
    state = optimizer.state_dict()
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
                [len(g["params"]) for g in state["param_groups"]], "parameter groups")
    if c.rank == root_rank:
        for t in tensors:
            broadcast_(t, root_rank, c)
        return
    received: list[torch.Tensor] = []

    def rebuild(obj):
        if isinstance(obj, tuple) and len(obj) == 3 and obj[0] == "__tensor__":
            t = torch.empty(obj[1], dtype=getattr(torch, obj[2]))
            received.append(broadcast_(t, root_rank, c))
            return t
        if isinstance(obj, dict):
            return {k: rebuild(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return type(obj)(rebuild(v) for v in obj)
        return obj

    optimizer.load_state_dict(rebuild(theirs))
