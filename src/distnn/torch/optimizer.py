"""DistributedOptimizer for torch optimizers: gradients summed over ranks through distnn's
MPI path, in flat buckets whose all-reduce starts during backward.

Every parameter's ``.grad`` is made a view into one flat NumPy-backed buffer (parameters in
registration order), so a bucket is a contiguous slice that ``Iallreduce`` reduces in place,
with no packing. A post-accumulate-grad hook per parameter counts the parameters of each
bucket; when the last one of a bucket has its gradient, that bucket's non-blocking
all-reduce starts. Buckets hold the *last* parameters first (backward order) and start
strictly in order, so every rank posts the same sequence of collectives.
"""
from __future__ import annotations

import time
from typing import Any, Iterable

import numpy as np
import torch

from .. import distributed as dist
from ..distributed import Communicator

_NP_DTYPES = {torch.float32: np.float32, torch.float64: np.float64, torch.float16: np.float16}


class _Param:
    """A parameter as ``make_buckets`` sees a layer: a name and a slice of the buffer."""

    def __init__(self, name: str):
        self.name = name


def _named(optimizer, named_parameters) -> list[tuple[str, torch.Tensor]]:
    in_optimizer = [p for group in optimizer.param_groups for p in group["params"]]
    if named_parameters is None:
        named = [(f"param.{i}", p) for i, p in enumerate(in_optimizer)]
    else:
        named = list(named_parameters)
        bad = [n for n, p in named if not isinstance(p, torch.Tensor)]
        if bad or any(not isinstance(n, str) for n, _ in named):
            raise ValueError("DistributedOptimizer: named_parameters must be (name, tensor) "
                             "pairs, e.g. model.named_parameters()")
        known = {id(p) for _, p in named}
        missing = [i for i, p in enumerate(in_optimizer) if id(p) not in known]
        if missing:
            raise ValueError(f"DistributedOptimizer: {len(missing)} parameters of the "
                             "optimizer are not in named_parameters; pass "
                             "model.named_parameters() of the model the optimizer updates")
        ids = {id(p) for p in in_optimizer}
        named = [(n, p) for n, p in named if id(p) in ids]
    seen: set[int] = set()
    out = []
    for n, p in named:
        if id(p) not in seen and p.requires_grad:
            seen.add(id(p))
            out.append((n, p))
    return out


class DistributedOptimizer:
    """Wrap a ``torch.optim.Optimizer`` so that ``step()`` uses gradients combined over all
    ranks (Horovod's ``hvd.DistributedOptimizer``).

    The returned object is an instance of a subclass of the optimizer's class, sharing its
    state and parameter groups, so LR schedulers and ``isinstance`` checks keep working.

    Gradient combination: ``op="average"`` (Horovod/DDP) divides the sum over ranks by the
    number of ranks: with a loss that is the mean over the local batch, N ranks of batch B
    make the update of one process with batch N*B. ``op="sum"`` only sums: use it with a
    loss that is the SUM over the local samples divided by the *global* batch size, which
    stays exact when the shards of a global batch are uneven or empty (see
    ``partition_dataset``).

    ``zero_grad()`` zeroes the flat buffer instead of setting gradients to None, so they
    stay views (a gradient replaced by other code is copied back into the buffer by the
    hook). Every rank must call ``step()`` (or ``synchronize()``) once per
    ``backward_passes_per_step`` backward passes, a rank with an empty shard too.

    Args:
        optimizer: a torch optimizer over CPU parameters of one floating dtype.
        named_parameters: ``model.named_parameters()`` (names appear in errors); default:
            the optimizer's parameters.
        op: "average" or "sum".
        bucket_size_mb: target bucket size in MiB (0: one bucket per parameter).
        non_blocking: start each bucket's all-reduce during backward; False does one
            blocking all-reduce per bucket in ``synchronize()``.
        backward_passes_per_step: backward passes accumulated locally before the
            all-reduce (gradient accumulation).
        comm: communicator (default ``distnn.distributed.get_comm()``).

    Example:
        opt = dtorch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                          named_parameters=model.named_parameters())
        opt.zero_grad(); loss_fn(model(x), y).backward(); opt.step()
    """

    def __new__(cls, optimizer: torch.optim.Optimizer, named_parameters: Iterable | None = None,
                *, op: str = "average", bucket_size_mb: float = 4.0, non_blocking: bool = True,
                backward_passes_per_step: int = 1, comm: Communicator | None = None):
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"DistributedOptimizer wraps a torch.optim.Optimizer, got "
                            f"{type(optimizer).__name__}; for distnn optimizers use "
                            "distnn.distributed.DistributedOptimizer")
        base = type(optimizer)
        wrapped = type(f"Distributed{base.__name__}", (_Mixin, base), {})
        obj = object.__new__(wrapped)
        obj.__dict__.update(optimizer.__dict__)
        obj._distnn_setup(optimizer, named_parameters, op, bucket_size_mb, non_blocking,
                          backward_passes_per_step, comm)
        return obj


class _Mixin:
    """The distributed behaviour mixed into the wrapped optimizer's class."""

    def _distnn_setup(self, optimizer, named_parameters, op, bucket_size_mb, non_blocking,
                      passes, comm) -> None:
        if op not in ("average", "sum"):
            raise ValueError(f"DistributedOptimizer: op must be 'average' or 'sum', got {op!r}")
        if isinstance(passes, bool) or int(passes) != passes or passes < 1:
            raise ValueError("DistributedOptimizer: backward_passes_per_step must be an "
                             f"integer >= 1, got {passes!r}")
        self._distnn_base = optimizer
        self.comm = comm if comm is not None else dist.get_comm()
        self.op = op
        self.non_blocking = bool(non_blocking)
        self.backward_passes_per_step = int(passes)
        named = _named(optimizer, named_parameters)
        dtypes = {p.dtype for _, p in named}
        if len(dtypes) > 1 or any(d not in _NP_DTYPES for d in dtypes):
            raise ValueError(f"DistributedOptimizer: parameters have dtypes "
                             f"{sorted(map(str, dtypes))}; use one of float32/float64/"
                             "float16 for all (model.float() or model.double())")
        if any(p.device.type != "cpu" for _, p in named):
            raise ValueError("DistributedOptimizer: distnn.torch reduces CPU tensors; move the "
                             "model to the CPU")
        self._params = [p for _, p in named]
        self._names = [n for n, _ in named]
        np_dtype = _NP_DTYPES[next(iter(dtypes))] if dtypes else np.float32
        sizes = [p.numel() for p in self._params]
        offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
        self._flat = np.zeros(int(offsets[-1]), dtype=np_dtype)
        flat_t = torch.from_numpy(self._flat)
        self._views = [flat_t[offsets[i]:offsets[i + 1]].view_as(p)
                       for i, p in enumerate(self._params)]
        with torch.no_grad():
            for p, view in zip(self._params, self._views):
                if p.grad is not None:
                    view.copy_(p.grad)
                p.grad = view
        ranges = [(_Param(n), int(offsets[i]), int(offsets[i + 1]))
                  for i, n in enumerate(self._names)]
        self.buckets = dist.make_buckets(ranges, self._flat.itemsize, bucket_size_mb)
        bucket_by_name = {n: b for b, (_, _, names) in enumerate(self.buckets) for n in names}
        self._bucket_of = [bucket_by_name[n] for n in self._names]
        self._sizes = [len(names) for _, _, names in self.buckets]
        self._active = self.comm.size > 1
        if self._active:
            layouts = self.comm.allgather_obj(
                (str(self._flat.dtype), [(n, tuple(p.shape)) for n, p in named]))
            if any(lay != layouts[0] for lay in layouts):
                bad = next(r for r, lay in enumerate(layouts) if lay != layouts[0])
                raise RuntimeError(
                    f"DistributedOptimizer: rank {bad} has {len(layouts[bad][1])} parameters "
                    f"({layouts[bad][0]}), rank 0 has {len(layouts[0][1])} "
                    f"({layouts[0][0]}); build the same model on every rank")
        self.comm_wait_time = 0.0
        self.allreduce_calls = 0
        self.bytes_reduced = 0
        self._reset()
        self._hooks = []
        if self._active and self.non_blocking:
            for i, p in enumerate(self._params):
                self._hooks.append(p.register_post_accumulate_grad_hook(
                    lambda param, i=i: self._on_grad(i, param)))

    # -- communication ------------------------------------------------------------------
    def _reset(self) -> None:
        self._pending = [n * self.backward_passes_per_step for n in self._sizes]
        self._handles: list[Any] = [None] * len(self.buckets)
        self._next = 0
        self._synced = False

    def _claim(self, i: int, p: torch.Tensor) -> None:
        """Make p.grad the buffer view again if other code replaced it."""
        view = self._views[i]
        g = p.grad
        if g is None:
            view.zero_()
        elif g.data_ptr() != view.data_ptr():
            with torch.no_grad():
                view.copy_(g)
        else:
            return
        p.grad = view

    def _start(self, b: int) -> None:
        lo, hi, _ = self.buckets[b]
        if b == len(self.buckets) - 1:
            # The last bucket (the first layers) is ready when backward ends: there is no
            # compute left to overlap, and MPI's blocking all-reduce is its fastest path.
            t0 = time.perf_counter()
            self.comm.allreduce_(self._flat[lo:hi], "sum")
            self.comm_wait_time += time.perf_counter() - t0
        else:
            self._handles[b] = self.comm.iallreduce_(self._flat[lo:hi], "sum")
        self.allreduce_calls += 1
        self.bytes_reduced += (hi - lo) * self._flat.itemsize

    def _on_grad(self, i: int, p: torch.Tensor) -> None:
        self._claim(i, p)
        b = self._bucket_of[i]
        if self._pending[b] <= 0 or self._synced:
            raise RuntimeError(
                f"DistributedOptimizer: parameter {self._names[i]!r} got more gradients than "
                f"backward_passes_per_step={self.backward_passes_per_step} before step(); "
                "call step() (or synchronize()) after every backward pass, or raise "
                "backward_passes_per_step")
        self._pending[b] -= 1
        while self._next < len(self.buckets) and self._pending[self._next] == 0:
            self._start(self._next)
            self._next += 1
        for h in self._handles[:self._next]:
            if h is not None and hasattr(h, "test"):
                h.test()

    def synchronize(self) -> None:
        """Finish the all-reduce of every bucket; the parameters' ``.grad`` then hold the
        combined gradients (``step()`` calls it; a second call before ``step()`` does
        nothing)."""
        if not self._active or self._synced:
            return
        t0 = time.perf_counter()
        started = self._next if self.non_blocking else 0
        for i, b in enumerate(self._bucket_of):
            if b >= started:  # gradients no hook has seen (unused parameters, or blocking)
                self._claim(i, self._params[i])
        if self.non_blocking:
            while self._next < len(self.buckets):
                self._start(self._next)
                self._next += 1
            for h in self._handles:
                if h is not None:
                    h.wait()
        else:
            for lo, hi, _ in self.buckets:
                self.comm.allreduce_(self._flat[lo:hi], "sum")
                self.allreduce_calls += 1
                self.bytes_reduced += (hi - lo) * self._flat.itemsize
        self.comm_wait_time += time.perf_counter() - t0
        if self.op == "average":
            self._flat /= self.comm.size
        self._reset()
        self._synced = True

    def step(self, closure=None):
        """Wait for the gradient all-reduce, combine (see the class doc), update."""
        self.synchronize()
        out = type(self._distnn_base).step(self, closure)
        self._synced = False
        return out

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zero the flat gradient buffer (gradients stay views into it; ``set_to_none`` is
        accepted for compatibility and ignored)."""
        self._flat[...] = 0
        for i, p in enumerate(self._params):
            if p.grad is None or p.grad.data_ptr() != self._views[i].data_ptr():
                p.grad = self._views[i]

    def gradients_flat(self) -> np.ndarray:
        """The flat gradient buffer (every parameter's ``.grad`` is a view into it)."""
        return self._flat

    def remove_hooks(self) -> None:
        """Detach the gradient hooks (before wrapping the same parameters again)."""
        for h in self._hooks:
            h.remove()
        self._hooks = []

    def __repr__(self) -> str:
        return (f"DistributedOptimizer({type(self._distnn_base).__name__}, op={self.op!r}, "
                f"buckets={len(self.buckets)}, non_blocking={self.non_blocking})")
