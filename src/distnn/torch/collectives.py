"""Horovod's tensor collectives over distnn's communicator: allreduce (op, pre/postscale,
compression, autograd), allgather, broadcast, alltoall, reducescatter, their grouped and
``*_async`` forms with ``poll``/``synchronize``, on the global set or a process set.

CPU tensors share memory with NumPy arrays (``tensor.numpy()``), so every collective is
distnn's in-place MPI call on that array: no pickling, no packing for contiguous tensors.
``name=`` is accepted (Horovod keys its negotiation by it; MPI needs no names because every
rank posts the same collectives in the same order). An ``*_async`` call returns a handle
whose non-blocking all-reduce is in flight; the other collectives complete when called and
return a finished handle.
"""
from __future__ import annotations

import numpy as np
import torch

from ..distributed import Communicator
from ..distributed.adasum import adasum_
from .basics import Adasum, Average, Max, Min, Product, Sum, channel
from .compression import Compression

_OPS = {Average: "mean", "mean": "mean", Sum: "sum", Max: "max", Min: "min",
        Adasum: "adasum", Product: "product"}


def _op(op, average: bool | None) -> str:
    if average is not None:
        return "mean" if average else "sum"
    if op is None:
        return "mean"
    key = str(op).lower()
    if key not in _OPS:
        raise ValueError(f"op must be one of hvd.Average, Sum, Adasum, Min, Max, Product "
                         f"({sorted(set(_OPS) - {'mean'})}), got {op!r}")
    return _OPS[key]


def as_numpy(t: torch.Tensor, what: str) -> np.ndarray:
    """The NumPy view of a CPU tensor (no copy)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{what} needs a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cpu":
        raise ValueError(f"{what}: tensor is on {t.device}; distnn.torch communicates CPU "
                         "tensors (MPI over host memory; nccl_built() is False): move it "
                         "with .cpu()")
    if t.dtype in (torch.bfloat16, torch.complex32) or t.is_sparse:
        raise TypeError(f"{what}: dtype {t.dtype} (sparse={t.is_sparse}) has no NumPy "
                        "equivalent; convert it (e.g. .float()) first")
    return t.detach().numpy()


class Handle:
    """A started collective: ``hvd.synchronize(handle)`` (or ``wait()``) returns its output,
    ``hvd.poll(handle)`` tells whether it has completed."""

    def __init__(self, output, pending=None, finish=None):
        self._output, self._pending, self._finish = output, pending, finish
        self._done = pending is None

    def poll(self) -> bool:
        if not self._done and hasattr(self._pending, "test") and self._pending.test():
            self.wait()
        return self._done

    def wait(self):
        if not self._done:
            self._pending.wait()
            self._done = True
            if self._finish is not None:
                self._finish()
        return self._output

    test = poll


def poll(handle: Handle) -> bool:
    """True once the collective behind ``handle`` has completed."""
    return handle.poll()


def synchronize(handle: Handle):
    """Wait for the collective behind ``handle``; returns its output."""
    return handle.wait()


def _flat_scaled(t: torch.Tensor, prescale: float, what: str) -> np.ndarray:
    a = as_numpy(t, what).reshape(-1)
    if prescale != 1.0:
        a *= a.dtype.type(prescale)
    return a


def _start_reduce(out: torch.Tensor, mode: str, prescale: float, postscale: float,
                  c: Communicator, counts=None) -> Handle:
    """Reduce ``out`` (contiguous, owned) in place over c; returns a handle."""
    a = _flat_scaled(out, prescale, "allreduce")

    def finish():
        if postscale != 1.0:
            a[...] = a * postscale

    if mode == "adasum":
        if hasattr(c, "adasum_"):
            c.adasum_(a, counts or [a.size])
        else:
            adasum_(a, counts or [a.size], c)
    elif mode == "product":
        a[...] = np.prod(c.allgather(a.copy()), axis=0)
    else:
        if mode == "mean" and not np.issubdtype(a.dtype, np.inexact):
            raise TypeError(f"op Average needs a floating tensor, got {out.dtype}")
        return Handle(out, c.iallreduce_(a, mode), finish)
    finish()
    return Handle(out)


def _prepare(tensor: torch.Tensor, mode: str) -> torch.Tensor:
    out = tensor.detach().clone().contiguous()
    if mode == "mean" and not out.is_floating_point():
        out = out.double()  # distnn: an average of integers is not truncated
    return out


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=None, *, comm=None) -> Handle:
    """Start an in-place reduction of ``tensor``; ``synchronize(handle)`` returns it."""
    mode = _op(op, average)
    c = channel(comm, process_set)
    if tensor.is_contiguous():
        return _start_reduce(tensor, mode, prescale_factor, postscale_factor, c)
    tmp = tensor.detach().contiguous().clone()
    inner = _start_reduce(tmp, mode, prescale_factor, postscale_factor, c)
    return Handle(tensor, inner, lambda: tensor.data.copy_(inner.wait()))


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=None, *, comm=None) -> torch.Tensor:
    """Reduce ``tensor`` over ranks in place (Average, Sum, Adasum, Min, Max, Product);
    returns it."""
    with torch.no_grad():
        return allreduce_async_(tensor, average, name, op, prescale_factor, postscale_factor,
                                process_set, comm=comm).wait()


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=None, *, comm=None) -> Handle:
    """Start a reduction of a copy of ``tensor``; ``synchronize(handle)`` returns it."""
    mode = _op(op, average)
    return _start_reduce(_prepare(tensor, mode), mode, prescale_factor, postscale_factor,
                         channel(comm, process_set))


class _Allreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, op, prescale, postscale, c):
        ctx.args = (op, prescale, postscale, c)
        mode = _op(op, None)
        return _start_reduce(_prepare(tensor, mode), mode, prescale, postscale, c).wait()

    @staticmethod
    def backward(ctx, grad):
        op, prescale, postscale, c = ctx.args
        return _Allreduce.apply(grad, op, prescale, postscale, c), None, None, None, None


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, process_set=None, *,
              comm=None) -> torch.Tensor:
    """Reduction of ``tensor`` over ranks as a new tensor (Horovod's ``hvd.allreduce``;
    differentiable for Average and Sum). Integer tensors averaged come back as float64."""
    mode = _op(op, average)
    c = channel(comm, process_set)
    sent, ctx = compression.compress(tensor)
    if sent.requires_grad and mode in ("mean", "sum"):
        out = _Allreduce.apply(sent, "sum" if mode == "sum" else Average, prescale_factor,
                               postscale_factor, c)
    else:
        out = _start_reduce(_prepare(sent, mode), mode, prescale_factor, postscale_factor,
                            c).wait()
    return compression.decompress(out, ctx)


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=None, *, comm=None) -> Handle:
    """Start reducing a list of tensors in place as one fused buffer per dtype (Adasum:
    tensor by tensor inside the buffer); ``synchronize`` returns the list."""
    mode = _op(op, average)
    c = channel(comm, process_set)
    tensors = list(tensors)
    pending = []
    for dtype in dict.fromkeys(t.dtype for t in tensors):
        group = [t for t in tensors if t.dtype == dtype]
        fused = torch.cat([t.detach().reshape(-1) for t in group])
        if mode == "mean" and not fused.is_floating_point():
            raise TypeError(f"op Average needs floating tensors, got {dtype}")
        h = _start_reduce(fused, mode, prescale_factor, postscale_factor, c,
                          counts=[t.numel() for t in group])
        pending.append((h, group, fused))

    def finish():
        with torch.no_grad():
            for h, group, fused in pending:
                h.wait()
                for t, part in zip(group, torch.split(fused, [t.numel() for t in group])):
                    t.copy_(part.view_as(t))

    return Handle(tensors, _Group([h for h, _, _ in pending]), finish)


class _Group:
    def __init__(self, handles):
        self.handles = handles

    def test(self) -> bool:
        return all(h.poll() for h in self.handles)

    def wait(self):
        for h in self.handles:
            h.wait()


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=None, *, comm=None):
    return grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                    postscale_factor, process_set, comm=comm).wait()


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=None, *, comm=None) -> Handle:
    mode = _op(op, average)
    return grouped_allreduce_async_([_prepare(t, mode) for t in tensors], average, name, op,
                                    prescale_factor, postscale_factor, process_set, comm=comm)


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=None, *,
                      comm=None) -> list:
    """Reductions of a list of tensors, fused into one all-reduce per dtype."""
    sent = [compression.compress(t) for t in tensors]
    out = grouped_allreduce_async([s for s, _ in sent], average, name, op, prescale_factor,
                                  postscale_factor, process_set, comm=comm).wait()
    return [compression.decompress(o, ctx) for o, (_, ctx) in zip(out, sent)]


def allgather(tensor, name=None, process_set=None, *, comm=None) -> torch.Tensor:
    """Every rank's tensor concatenated along dim 0 in rank order (first dimensions may
    differ between ranks; the other dimensions and the dtype must agree)."""
    c = channel(comm, process_set)
    if hasattr(c, "check_none_joined"):
        c.check_none_joined("allgather")
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


def allgather_async(tensor, name=None, process_set=None, *, comm=None) -> Handle:
    return Handle(allgather(tensor, name, process_set, comm=comm))


def grouped_allgather(tensors, name=None, process_set=None, *, comm=None) -> list:
    return [allgather(t, name, process_set, comm=comm) for t in tensors]


def grouped_allgather_async(tensors, name=None, process_set=None, *, comm=None) -> Handle:
    return Handle(grouped_allgather(tensors, name, process_set, comm=comm))


def broadcast_(tensor, root_rank=0, name=None, process_set=None, *, comm=None):
    """Overwrite ``tensor`` in place with root's (``root_rank`` is a global rank, also
    for a process set, as in Horovod); returns it."""
    c = channel(comm, process_set)
    root = root_rank
    if process_set is not None and getattr(process_set, "ranks", None) is not None:
        if root_rank not in process_set.ranks:
            raise ValueError(f"broadcast: root_rank {root_rank} is not in {process_set}")
        root = process_set.ranks.index(root_rank)
    if hasattr(c, "check_none_joined"):
        c.check_none_joined("broadcast")
    a = as_numpy(tensor, "broadcast_")
    if a.flags.c_contiguous and a.flags.writeable:
        c.bcast_(a, root)
    else:
        tmp = np.ascontiguousarray(a).copy()
        c.bcast_(tmp, root)
        with torch.no_grad():
            tensor.copy_(torch.from_numpy(tmp))
    return tensor


def broadcast(tensor, root_rank=0, name=None, process_set=None, *, comm=None):
    """Root's tensor on every rank, as a new tensor."""
    return broadcast_(tensor.detach().clone().contiguous(), root_rank, name, process_set,
                      comm=comm)


def broadcast_async(tensor, root_rank=0, name=None, process_set=None, *, comm=None):
    return Handle(broadcast(tensor, root_rank, name, process_set, comm=comm))


def broadcast_async_(tensor, root_rank=0, name=None, process_set=None, *, comm=None):
    return Handle(broadcast_(tensor, root_rank, name, process_set, comm=comm))


def alltoall(tensor, splits=None, name=None, process_set=None, *, comm=None):
    """Send ``splits[r]`` rows (dim 0) of ``tensor`` to rank r and gather what every rank
    sends here, in rank order. Without ``splits`` the rows are split as evenly as possible
    (the first ranks get one more) and only the tensor is returned; with it, (tensor,
    received splits)."""
    c = channel(comm, process_set)
    if hasattr(c, "check_none_joined"):
        c.check_none_joined("alltoall")
    a = np.ascontiguousarray(as_numpy(tensor, "alltoall"))
    rows = len(a)
    given = splits is not None
    if given:
        send = [int(s) for s in (splits.tolist() if isinstance(splits, torch.Tensor)
                                 else splits)]
        if len(send) != c.size or sum(send) != rows or min(send) < 0:
            raise ValueError(f"alltoall: splits must be {c.size} non-negative row counts "
                             f"summing to {rows}, got {send}")
    else:
        send = [len(s) for s in np.array_split(np.arange(rows), c.size)]
    row = int(np.prod(a.shape[1:], dtype=np.int64))
    recv = [int(n) for n in c.allgather(np.array(send, dtype=np.int64))[:, c.rank]]
    out = np.empty((sum(recv),) + a.shape[1:], a.dtype)
    c.alltoallv_(a.reshape(-1), [n * row for n in send], out.reshape(-1),
                 [n * row for n in recv])
    result = torch.from_numpy(out)
    return (result, torch.tensor(recv, dtype=torch.int32)) if given else result


def alltoall_async(tensor, splits=None, name=None, process_set=None, *, comm=None):
    return Handle(alltoall(tensor, splits, name, process_set, comm=comm))


def reducescatter(tensor, name=None, compression=Compression.none, op=Average,
                  process_set=None, prescale_factor=1.0, postscale_factor=1.0, *, comm=None):
    """Reduce ``tensor`` over ranks (Average or Sum) and give rank r its block of rows
    (dim 0 split as evenly as possible, the first ranks one row more, as Horovod)."""
    mode = _op(op, None)
    if mode not in ("mean", "sum"):
        raise ValueError(f"reducescatter supports op Average or Sum, got {op!r}")
    c = channel(comm, process_set)
    if hasattr(c, "check_none_joined"):
        c.check_none_joined("reducescatter")
    sent, ctx = compression.compress(tensor)
    a = _flat_scaled(_prepare(sent, mode), prescale_factor, "reducescatter")
    shape = tuple(sent.shape)
    if not shape:
        raise ValueError("reducescatter needs a tensor with at least one dimension")
    row = int(np.prod(shape[1:], dtype=np.int64))
    rows = [len(s) for s in np.array_split(np.arange(shape[0]), c.size)]
    out = np.empty(rows[c.rank] * row, a.dtype)
    c.reduce_scatter_(a, out, [n * row for n in rows], mode)
    if postscale_factor != 1.0:
        out *= out.dtype.type(postscale_factor)
    return compression.decompress(torch.from_numpy(out).view((rows[c.rank],) + shape[1:]), ctx)


def reducescatter_async(tensor, name=None, op=Average, process_set=None, prescale_factor=1.0,
                        postscale_factor=1.0, *, comm=None):
    return Handle(reducescatter(tensor, name, op=op, process_set=process_set,
                                prescale_factor=prescale_factor,
                                postscale_factor=postscale_factor, comm=comm))


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=Average,
                          process_set=None, prescale_factor=1.0, postscale_factor=1.0, *,
                          comm=None) -> list:
    return [reducescatter(t, name, compression, op, process_set, prescale_factor,
                          postscale_factor, comm=comm) for t in tensors]


def grouped_reducescatter_async(tensors, name=None, op=Average, process_set=None,
                                prescale_factor=1.0, postscale_factor=1.0, *, comm=None):
    return Handle(grouped_reducescatter(tensors, name, op=op, process_set=process_set,
                                        prescale_factor=prescale_factor,
                                        postscale_factor=postscale_factor, comm=comm))


def sparse_allreduce_async(tensor, name=None, op=Average, process_set=None, *, comm=None):
    """Sparse tensors are reduced densely here (Horovod's ``sparse_as_dense``)."""
    dense = tensor.to_dense() if tensor.is_sparse else tensor
    out = allreduce(dense, name=name, op=op, process_set=process_set, comm=comm)
    return Handle(out.to_sparse() if tensor.is_sparse else out)
