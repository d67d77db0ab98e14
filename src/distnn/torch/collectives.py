"""Horovod's all-reduces over distnn's communicator: allreduce (op, pre/postscale,
compression, autograd), its grouped and ``*_async`` forms, ``poll``/``synchronize``, on the
global set or a process set (allgather, broadcast, alltoall, reducescatter: exchange.py).

CPU tensors share memory with NumPy arrays (``tensor.numpy()``), so every collective is
distnn's in-place MPI call on that array: no pickling, no packing for contiguous tensors.
Before each one the ranks agree on it (``agree``: name, dtype, shape, op, root) or all raise
the same RuntimeError. Pre- and postscale factors scale integers in float64 and float16 in
float32, cast back (Horovod's rule); an integer Average keeps its dtype (truncated mean).
``allreduce_async`` returns a handle whose non-blocking all-reduce is in flight; the other
``*_async`` collectives are queued on a background thread (``background``). A ``name`` of
an operation in flight cannot be reused until its handle is synchronized.
"""
from __future__ import annotations

import weakref

import numpy as np
import torch

from ..distributed import Communicator
from ..distributed.adasum import adasum_
from .agree import agree
from .background import release, release_after, reserve
from .basics import Adasum, Average, Max, Min, Product, Sum, channel, worker
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
    ``hvd.poll(handle)`` tells whether it has completed. A ``name`` stays taken until then."""

    def __init__(self, output, pending=None, finish=None, name=None):
        self._output, self._pending, self._finish = output, pending, finish
        self._done = pending is None
        self._name = None
        self.take(name)

    def take(self, name) -> "Handle":
        """Hold ``name`` (already reserved) until this handle is synchronized or dropped."""
        if name is not None:
            self._name = weakref.finalize(self, release, name)
        return self

    def _free(self) -> None:
        if self._name is not None:
            self._name()

    def poll(self) -> bool:
        if not self._done and hasattr(self._pending, "test") and self._pending.test():
            self.wait()
        return self._done

    def wait(self):
        if not self._done:
            try:
                self._pending.wait()
            finally:
                self._done = True
                self._free()
            if self._finish is not None:
                self._finish()
        self._free()
        return self._output

    test = poll

    def __call__(self):
        """Horovod's sparse_allreduce_async returns a function: calling it synchronizes."""
        return self.wait()


class QueuedHandle(Handle):
    """A collective queued on the background worker (see ``background``)."""

    def take(self, name) -> "Handle":
        if name is not None:
            self._name = weakref.finalize(self, release_after, self._pending, name)
        return self

    def poll(self) -> bool:
        return self._done or self._pending.test()

    def wait(self):
        if not self._done:
            try:
                self._output = self._pending.wait()
            finally:
                self._done = True
        self._free()
        return self._output

    test = poll


def queued(what: str, name, process_set, comm, run) -> Handle:
    """Run ``run(c)`` (a blocking collective on communicator c; None: the usual channel)
    on the process set's background worker, or now when it has none; ``name`` is taken
    until the handle is synchronized."""
    reserve(name, what)
    w = worker(process_set) if comm is None else None
    if w is None:
        try:
            with torch.no_grad():
                out = run(None)
        except BaseException:
            release(name)
            raise
        h = Handle(out)
        release(name)
        return h
    return QueuedHandle(None, w.submit(run), name=name)


def poll(handle: Handle) -> bool:
    """True once the collective behind ``handle`` has completed."""
    return handle.poll()


def synchronize(handle: Handle):
    """Wait for the collective behind ``handle``; returns its output."""
    return handle.wait()


def scale_(a: np.ndarray, factor: float) -> np.ndarray:
    """Multiply ``a`` in place by ``factor`` as Horovod does: integers in float64 and cast
    back (truncated toward zero), float16 in float32, other floats in their own dtype."""
    if factor == 1.0:
        return a
    if np.issubdtype(a.dtype, np.integer) or a.dtype == np.bool_:
        a[...] = a.astype(np.float64) * float(factor)
    elif a.dtype == np.float16:
        a[...] = a.astype(np.float32) * np.float32(factor)
    else:
        a *= a.dtype.type(factor)
    return a


def _flat_scaled(t: torch.Tensor, prescale: float, what: str) -> np.ndarray:
    return scale_(as_numpy(t, what).reshape(-1), prescale)


def _int_mean(mode: str, a: np.ndarray, size: int, postscale: float) -> tuple[str, float]:
    """An Average of integers is a Sum scaled by 1/size (in float64, cast back: Horovod
    keeps the dtype): returns the MPI op and the postscale factor to apply."""
    if mode == "mean" and not np.issubdtype(a.dtype, np.inexact):
        return "sum", postscale / size
    return mode, postscale


def _start_reduce(out: torch.Tensor, mode: str, prescale: float, postscale: float,
                  c: Communicator, counts=None, name=None, check: bool = True) -> Handle:
    """Reduce ``out`` (contiguous, owned) in place over c, once every rank has agreed on
    the call (``check``); returns a handle."""
    if check:
        agree(c, "allreduce", [out], name=name, op=mode)
    a = _flat_scaled(out, prescale, "allreduce")
    mode, postscale = _int_mean(mode, a, c.size, postscale)

    def finish():
        scale_(a, postscale)

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
        return Handle(out, c.iallreduce_(a, mode), finish)
    finish()
    return Handle(out)


def _prepare(tensor: torch.Tensor, mode: str) -> torch.Tensor:
    return tensor.detach().clone().contiguous()


def _reduce_inplace(tensor, mode, prescale_factor, postscale_factor, c, name) -> Handle:
    """Reduce ``tensor`` in place over c (through a copy when it is not contiguous)."""
    if tensor.is_contiguous():
        return _start_reduce(tensor, mode, prescale_factor, postscale_factor, c, name=name)
    tmp = tensor.detach().contiguous().clone()
    inner = _start_reduce(tmp, mode, prescale_factor, postscale_factor, c, name=name)
    return Handle(tensor, inner, lambda: tensor.data.copy_(inner.wait()))


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=None, *, comm=None) -> Handle:
    """Queue an in-place reduction of ``tensor`` on the background worker;
    ``synchronize(handle)`` returns it."""
    mode = _op(op, average)
    return queued("allreduce_async_", name, process_set, comm, lambda c: _reduce_inplace(
        tensor, mode, prescale_factor, postscale_factor, c or channel(comm, process_set),
        name).wait())


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=None, *, comm=None) -> torch.Tensor:
    """Reduce ``tensor`` over ranks in place (Average, Sum, Adasum, Min, Max, Product);
    returns it."""
    mode = _op(op, average)
    with torch.no_grad():
        return _reduce_inplace(tensor, mode, prescale_factor, postscale_factor,
                               channel(comm, process_set), name).wait()


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=None, *, comm=None) -> Handle:
    """Queue a reduction of ``tensor`` on the background worker; ``synchronize(handle)``
    returns the result (a new tensor)."""
    mode = _op(op, average)
    return queued("allreduce_async", name, process_set, comm, lambda c: _start_reduce(
        _prepare(tensor, mode), mode, prescale_factor, postscale_factor,
        c or channel(comm, process_set), name=name).wait())


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
    differentiable for Average and Sum). Integer tensors averaged keep their dtype (the
    mean is truncated toward zero, as Horovod's)."""
    mode = _op(op, average)
    c = channel(comm, process_set)
    sent, ctx = compression.compress(tensor)
    if sent.requires_grad and mode in ("mean", "sum"):
        out = _Allreduce.apply(sent, "sum" if mode == "sum" else Average, prescale_factor,
                               postscale_factor, c)
    else:
        out = _start_reduce(_prepare(sent, mode), mode, prescale_factor, postscale_factor,
                            c, name=name).wait()
    return compression.decompress(out, ctx)


def _grouped_inplace(tensors, mode, prescale_factor, postscale_factor, c, name) -> Handle:
    """Reduce a list of tensors in place over c as one fused buffer per dtype (Adasum:
    tensor by tensor inside the buffer)."""
    tensors = list(tensors)
    agree(c, "grouped_allreduce", tensors, name=name, op=mode)
    pending = []
    for dtype in dict.fromkeys(t.dtype for t in tensors):
        group = [t for t in tensors if t.dtype == dtype]
        fused = torch.cat([t.detach().reshape(-1) for t in group])
        h = _start_reduce(fused, mode, prescale_factor, postscale_factor, c,
                          counts=[t.numel() for t in group], check=False)
        pending.append((h, group, fused))

    def finish():
        with torch.no_grad():
            for h, group, fused in pending:
                h.wait()
                for t, part in zip(group, torch.split(fused, [t.numel() for t in group])):
                    t.copy_(part.view_as(t))

    return Handle(tensors, _Group([h for h, _, _ in pending]), finish)


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=None, *, comm=None) -> Handle:
    """Queue an in-place grouped reduction on the background worker; ``synchronize``
    returns the list."""
    mode = _op(op, average)
    tensors = list(tensors)
    return queued("grouped_allreduce_async_", name, process_set, comm,
                  lambda c: _grouped_inplace(tensors, mode, prescale_factor, postscale_factor,
                                             c or channel(comm, process_set), name).wait())


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
    return _grouped_inplace(tensors, _op(op, average), prescale_factor, postscale_factor,
                            channel(comm, process_set), name).wait()


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=None, *, comm=None) -> Handle:
    mode = _op(op, average)
    tensors = list(tensors)
    return queued("grouped_allreduce_async", name, process_set, comm,
                  lambda c: _grouped_inplace([_prepare(t, mode) for t in tensors], mode,
                                             prescale_factor, postscale_factor,
                                             c or channel(comm, process_set), name).wait())


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=None, *,
                      comm=None) -> list:
    """Reductions of a list of tensors, fused into one all-reduce per dtype
    (differentiable for Average and Sum, as ``allreduce``)."""
    sent = [compression.compress(t) for t in tensors]
    mode = _op(op, average)
    if mode in ("mean", "sum") and torch.is_grad_enabled() and any(
            s.requires_grad for s, _ in sent):
        out = _GroupedAllreduce.apply((mode, prescale_factor, postscale_factor, process_set,
                                       comm, name), *[s for s, _ in sent])
    else:
        out = _grouped_inplace([_prepare(s, mode) for s, _ in sent], mode, prescale_factor,
                               postscale_factor, channel(comm, process_set), name).wait()
    return [compression.decompress(o, ctx) for o, (_, ctx) in zip(out, sent)]


class _GroupedAllreduce(torch.autograd.Function):
    """The gradient of a grouped Sum/Average is the same grouped reduction of the output
    gradients (as for ``allreduce``)."""

    @staticmethod
    def forward(ctx, args, *tensors):
        ctx.args = args
        mode, prescale, postscale, process_set, comm, name = args
        return tuple(_grouped_inplace([_prepare(t, mode) for t in tensors], mode, prescale,
                                      postscale, channel(comm, process_set), name).wait())

    @staticmethod
    def backward(ctx, *grads):
        mode, prescale, postscale, process_set, comm, _ = ctx.args
        return (None, *_GroupedAllreduce.apply((mode, prescale, postscale, process_set, comm,
                                                None), *[g.contiguous() for g in grads]))


def sparse_allreduce_async(tensor, name=None, op=Average, process_set=None, *, comm=None):
    """Queue the reduction of a sparse tensor (reduced densely, returned sparse); returns a
    handle that is also a function, as Horovod's: ``handle()`` waits and returns it."""
    sparse = tensor.is_sparse
    dense = tensor.to_dense() if sparse else tensor

    def run(c):
        out = allreduce(dense, name=name, op=op, process_set=process_set,
                        comm=c if c is not None else comm)
        return out.to_sparse() if sparse else out

    return queued("sparse_allreduce_async", name, process_set, comm, run)
