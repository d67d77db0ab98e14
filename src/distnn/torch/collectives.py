"""Horovod's all-reduces over distnn's communicator: allreduce (op, pre/postscale,
compression, autograd), its grouped and ``*_async`` forms, ``poll``/``synchronize``, on the
global set or a process set (allgather, broadcast, alltoall, reducescatter: exchange.py).

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
        if hasattr(c, "check_none_joined"):
            c.check_none_joined("allreduce(op=Product)")
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


def sparse_allreduce_async(tensor, name=None, op=Average, process_set=None, *, comm=None):
    """Sparse tensors are reduced densely here (Horovod's ``sparse_as_dense``)."""
    dense = tensor.to_dense() if tensor.is_sparse else tensor
    out = allreduce(dense, name=name, op=op, process_set=process_set, comm=comm)
    return Handle(out.to_sparse() if tensor.is_sparse else out)
