"""Horovod's collectives that move tensors between ranks: allgather, broadcast, alltoall,
reducescatter (with their grouped and ``*_async`` forms), differentiable as Horovod's:
the gradient of allgather and broadcast is the average of the output gradients (zero on
the ranks that did not send, for broadcast), of alltoall the reverse alltoall, and of
reducescatter the allgather of the gradients (times the size for Sum, and the pre- and
postscale factors), the conventions of Horovod's autograd functions.

The ranks agree on each call first (``agree``: name, dtype, shape, root, op) or all raise
the same RuntimeError. ``*_async`` forms are queued on the background worker
(``background``) and return at once. They raise on the ranks still training while some
rank is inside ``join()``, as Horovod does.
"""
from __future__ import annotations

import numpy as np
import torch

from .agree import agree
from .basics import Average, channel
from .collectives import (Handle, _flat_scaled, _int_mean, _op, _prepare, allreduce,
                          as_numpy, queued, scale_)
from .compression import Compression


class UnsupportedOp(ValueError, RuntimeError):
    """An op a collective does not support (a ValueError, and the RuntimeError Horovod
    raises)."""


def _guard(c, what: str) -> None:
    """After ``agree`` (a joined rank serves that check as an all-reduce): raise on every
    rank if some rank has joined."""
    if hasattr(c, "check_none_joined"):
        c.check_none_joined(what)


def allgather(tensor, name=None, process_set=None, *, comm=None) -> torch.Tensor:
    """Every rank's tensor concatenated along dim 0 in rank order (first dimensions may
    differ between ranks; the other dimensions and the dtype must agree)."""
    if tensor.requires_grad and torch.is_grad_enabled():
        return _Allgather.apply(tensor, process_set, comm, name)
    return _allgather(tensor, process_set, comm, name)


def _allgather(tensor, process_set, comm, name=None) -> torch.Tensor:
    c = channel(comm, process_set)
    a = np.ascontiguousarray(as_numpy(tensor, "allgather"))
    agree(c, "allgather", [tensor], name=name, skip_first=True)
    _guard(c, "allgather")
    if a.ndim == 0:
        a = a.reshape(1)
    shapes = c.allgather_obj((a.shape, str(a.dtype)))
    if any(s[0][1:] != shapes[0][0][1:] or s[1] != shapes[0][1] for s in shapes):
        raise RuntimeError(f"allgather: ranks pass tensors of shapes/dtypes {shapes}; all but "
                         "the first dimension and the dtype must agree")
    longest = max(s[0][0] for s in shapes)
    padded = np.zeros((longest,) + a.shape[1:], a.dtype)
    padded[:len(a)] = a
    everyone = c.allgather(padded)
    return torch.from_numpy(np.concatenate([everyone[r][:s[0][0]]
                                            for r, s in enumerate(shapes)]))


class _Allgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, process_set, comm, name):
        ctx.args, ctx.shape = (process_set, comm), tensor.shape
        ctx.rows = len(tensor) if tensor.dim() else 1
        return _allgather(tensor, process_set, comm, name)

    @staticmethod
    def backward(ctx, grad):
        process_set, comm = ctx.args
        c = channel(comm, process_set)
        mean = allreduce(grad, op=Average, process_set=process_set, comm=comm)
        rows = c.allgather_obj(ctx.rows)
        lo = sum(rows[:c.rank])
        return mean[lo:lo + ctx.rows].reshape(ctx.shape), None, None, None


def allgather_async(tensor, name=None, process_set=None, *, comm=None) -> Handle:
    """Queue an allgather on the background worker; ``synchronize`` returns its output."""
    return queued("allgather_async", name, process_set, comm,
                  lambda c: allgather(tensor, name, process_set, comm=c))


def grouped_allgather(tensors, name=None, process_set=None, *, comm=None) -> list:
    return [allgather(t, name, process_set, comm=comm) for t in tensors]


def grouped_allgather_async(tensors, name=None, process_set=None, *, comm=None) -> Handle:
    tensors = list(tensors)
    return queued("grouped_allgather_async", name, process_set, comm,
                  lambda c: grouped_allgather(tensors, name, process_set, comm=c))


def broadcast_(tensor, root_rank=0, name=None, process_set=None, *, comm=None):
    """Overwrite ``tensor`` in place with root's (``root_rank`` is a global rank, also
    for a process set, as in Horovod); returns it."""
    c = channel(comm, process_set)
    root = root_rank
    if process_set is not None and getattr(process_set, "ranks", None) is not None:
        if root_rank not in process_set.ranks:
            raise ValueError(f"broadcast: root_rank {root_rank} is not in {process_set}")
        root = process_set.ranks.index(root_rank)
    a = as_numpy(tensor, "broadcast_")
    agree(c, "broadcast", [tensor], name=name, root=root_rank)
    _guard(c, "broadcast")
    return _bcast(tensor, a, root, c)


def _bcast(tensor, a, root, c):
    """The broadcast itself (``root`` relative to c), once the ranks agree."""
    if a.flags.c_contiguous and a.flags.writeable:
        c.bcast_(a, root)
    else:
        tmp = np.ascontiguousarray(a).copy()
        c.bcast_(tmp, root)
        with torch.no_grad():
            tensor.copy_(torch.from_numpy(tmp))
    return tensor


def broadcast(tensor, root_rank=0, name=None, process_set=None, *, comm=None):
    """Root's tensor on every rank, as a new tensor (differentiable)."""
    if tensor.requires_grad and torch.is_grad_enabled():
        return _Broadcast.apply(tensor, root_rank, process_set, comm)
    return broadcast_(tensor.detach().clone().contiguous(), root_rank, name, process_set,
                      comm=comm)


class _Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, process_set, comm):
        ctx.args = (root_rank, process_set, comm)
        return broadcast_(tensor.detach().clone().contiguous(), root_rank, None, process_set,
                          comm=comm)

    @staticmethod
    def backward(ctx, grad):
        root_rank, process_set, comm = ctx.args
        mean = allreduce(grad, op=Average, process_set=process_set, comm=comm)
        me = channel(comm, process_set)
        if process_set is not None and getattr(process_set, "ranks", None) is not None:
            root_rank = process_set.ranks.index(root_rank)
        return (mean if me.rank == root_rank else mean * 0), None, None, None


def broadcast_async(tensor, root_rank=0, name=None, process_set=None, *, comm=None):
    """Queue a broadcast (into a new tensor) on the background worker."""
    return queued("broadcast_async", name, process_set, comm,
                  lambda c: broadcast(tensor, root_rank, name, process_set, comm=c))


def broadcast_async_(tensor, root_rank=0, name=None, process_set=None, *, comm=None):
    """Queue an in-place broadcast on the background worker."""
    return queued("broadcast_async_", name, process_set, comm,
                  lambda c: broadcast_(tensor, root_rank, name, process_set, comm=c))


def alltoall(tensor, splits=None, name=None, process_set=None, *, comm=None):
    """Send ``splits[r]`` rows (dim 0) of ``tensor`` to rank r and gather what every rank
    sends here, in rank order. Without ``splits`` the rows are split as evenly as possible
    (the first ranks get one more) and only the tensor is returned; with it, (tensor,
    received splits)."""
    if tensor.requires_grad and torch.is_grad_enabled():
        result, recv = _Alltoall.apply(tensor, splits, process_set, comm, name)
        return (result, recv) if splits is not None else result
    return _alltoall(tensor, splits, process_set, comm, name)


class _Alltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, process_set, comm, name):
        ctx.args = (process_set, comm)
        given = splits if splits is not None else _even(len(tensor), channel(
            comm, process_set).size)
        result, recv = _alltoall(tensor, given, process_set, comm, name)
        ctx.recv = recv
        ctx.mark_non_differentiable(recv)
        return result, recv

    @staticmethod
    def backward(ctx, grad, _):
        process_set, comm = ctx.args
        back, _ = _alltoall(grad, ctx.recv, process_set, comm)
        return back, None, None, None, None


def _even(rows: int, n: int) -> list[int]:
    return [len(s) for s in np.array_split(np.arange(rows), n)]


def _alltoall(tensor, splits, process_set, comm, name=None):
    c = channel(comm, process_set)
    a = np.ascontiguousarray(as_numpy(tensor, "alltoall"))
    agree(c, "alltoall", [tensor], name=name, skip_first=True)
    _guard(c, "alltoall")
    rows = len(a)
    given = splits is not None
    if given:
        if isinstance(splits, torch.Tensor) and (splits.is_floating_point()
                                                 or splits.is_complex()):
            raise ValueError(f"alltoall: splits must hold integers (row counts), got a "
                             f"{splits.dtype} tensor")
        send = [int(s) for s in (splits.tolist() if isinstance(splits, torch.Tensor)
                                 else splits)]
        if len(send) != c.size or sum(send) != rows or min(send) < 0:
            raise ValueError(f"alltoall: splits must be {c.size} non-negative row counts "
                             f"summing to {rows}, got {send}")
    else:
        send = _even(rows, c.size)
    row = int(np.prod(a.shape[1:], dtype=np.int64))
    recv = [int(n) for n in c.allgather(np.array(send, dtype=np.int64))[:, c.rank]]
    out = np.empty((sum(recv),) + a.shape[1:], a.dtype)
    c.alltoallv_(a.reshape(-1), [n * row for n in send], out.reshape(-1),
                 [n * row for n in recv])
    result = torch.from_numpy(out)
    return (result, torch.tensor(recv, dtype=torch.int32)) if given else result


def alltoall_async(tensor, splits=None, name=None, process_set=None, *, comm=None):
    """Queue an alltoall on the background worker."""
    return queued("alltoall_async", name, process_set, comm,
                  lambda c: alltoall(tensor, splits, name, process_set, comm=c))


def reducescatter(tensor, name=None, compression=Compression.none, op=Average,
                  process_set=None, prescale_factor=1.0, postscale_factor=1.0, *, comm=None):
    """Reduce ``tensor`` over ranks (Average or Sum) and give rank r its block of rows
    (dim 0 split as evenly as possible, the first ranks one row more, as Horovod)."""
    mode = _op(op, None)
    if mode not in ("mean", "sum"):
        raise UnsupportedOp(f"reducescatter supports op Average or Sum, got {op!r}")
    sent, ctx = compression.compress(tensor)
    if sent.requires_grad and torch.is_grad_enabled():
        out = _Reducescatter.apply(sent, mode, process_set, comm, prescale_factor,
                                   postscale_factor, name)
    else:
        out = _reducescatter(sent, mode, process_set, comm, prescale_factor, postscale_factor,
                             name)
    return compression.decompress(out, ctx)


class _Reducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, mode, process_set, comm, prescale, postscale, name):
        ctx.args = (mode, process_set, comm, prescale * postscale)
        return _reducescatter(tensor, mode, process_set, comm, prescale, postscale, name)

    @staticmethod
    def backward(ctx, grad):
        mode, process_set, comm, scale = ctx.args
        c = channel(comm, process_set)
        full = _allgather(grad.contiguous(), process_set, comm)
        factor = scale * (c.size if mode == "sum" else 1.0)  # Horovod's scaling
        return full * factor, None, None, None, None, None, None


def _reducescatter(sent, mode, process_set, comm, prescale_factor, postscale_factor,
                   name=None):
    c = channel(comm, process_set)
    agree(c, "reducescatter", [sent], name=name, op=mode)
    _guard(c, "reducescatter")
    a = _flat_scaled(_prepare(sent, mode), prescale_factor, "reducescatter")
    shape = tuple(sent.shape)
    if not shape:
        raise ValueError("reducescatter needs a tensor with at least one dimension")
    row = int(np.prod(shape[1:], dtype=np.int64))
    rows = [len(s) for s in np.array_split(np.arange(shape[0]), c.size)]
    out = np.empty(rows[c.rank] * row, a.dtype)
    mode, postscale_factor = _int_mean(mode, a, c.size, postscale_factor)
    c.reduce_scatter_(a, out, [n * row for n in rows], mode)
    scale_(out, postscale_factor)
    return torch.from_numpy(out).view((rows[c.rank],) + shape[1:])


def reducescatter_async(tensor, name=None, op=Average, process_set=None, prescale_factor=1.0,
                        postscale_factor=1.0, *, comm=None):
    """Queue a reducescatter on the background worker."""
    return queued("reducescatter_async", name, process_set, comm,
                  lambda c: reducescatter(tensor, name, op=op, process_set=process_set,
                                          prescale_factor=prescale_factor,
                                          postscale_factor=postscale_factor, comm=c))


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=Average,
                          process_set=None, prescale_factor=1.0, postscale_factor=1.0, *,
                          comm=None) -> list:
    return [reducescatter(t, name, compression, op, process_set, prescale_factor,
                          postscale_factor, comm=comm) for t in tensors]


def grouped_reducescatter_async(tensors, name=None, op=Average, process_set=None,
                                prescale_factor=1.0, postscale_factor=1.0, *, comm=None):
    tensors = list(tensors)
    return queued("grouped_reducescatter_async", name, process_set, comm,
                  lambda c: grouped_reducescatter(tensors, name, op=op, process_set=process_set,
                                                  prescale_factor=prescale_factor,
                                                  postscale_factor=postscale_factor, comm=c))


