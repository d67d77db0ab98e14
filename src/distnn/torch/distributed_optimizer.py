"""DistributedOptimizer for torch optimizers (Horovod's ``hvd.DistributedOptimizer``): a thin
adapter from torch's gradient hooks to distnn's one ``Reducer`` (distributed/reducer.py).

Every parameter's ``.grad`` is made a view into one flat NumPy-backed buffer (parameters in
registration order), so a bucket is a contiguous slice that ``Iallreduce`` reduces in place,
with no packing. A post-accumulate-grad hook per parameter tells the reducer that the
parameter's gradient is ready; the reducer starts each bucket's all-reduce, strictly in
order, as soon as all of its parameters are ready (the last bucket, ready when backward
ends, with the blocking all-reduce: no compute is left to overlap).
"""
from __future__ import annotations

import contextlib
import warnings
from typing import Iterable

import numpy as np
import torch

from ..distributed import Communicator, LocalComm
from ..distributed.reducer import Reducer, ReducerCounters
from .basics import Adasum, Average, channel, global_process_set
from .compression import Compression

_NP_DTYPES = {torch.float32: np.float32, torch.float64: np.float64, torch.float16: np.float16}
_OPS = {Average: "average", "sum": "sum", Adasum: "adasum"}


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
        names = [n for n, _ in named]
        dups = sorted({n for n in names if names.count(n) > 1})
        if dups:
            raise ValueError("DistributedOptimizer: parameter names in named_parameters must "
                             f"be unique, found duplicates {dups}")
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


class DistributedOptimizer(ReducerCounters, torch.optim.Optimizer):
    """Wrap a ``torch.optim.Optimizer`` so that ``step()`` uses gradients combined over all
    ranks (Horovod's ``hvd.DistributedOptimizer``, same arguments).

    It wraps the optimizer (``.optimizer``) and steps it: ``param_groups``, ``state``,
    ``defaults``, ``state_dict()`` and the optimizer's hooks are the wrapped optimizer's
    own, so LR schedulers (which check ``isinstance(opt, torch.optim.Optimizer)``) and
    checkpoints work as on the optimizer itself; ``isinstance(opt, type(optimizer))`` holds
    too (``__class__`` reads the wrapped optimizer's class, as for Horovod's, whose class is
    made at run time; ``type(opt)`` is ``DistributedOptimizer``).

    Gradient combination (in ``Reducer``): ``op=hvd.Average`` ("average", Horovod's
    default) divides the sum over ranks by the number of ranks: with a loss that is the
    mean over the local batch, N ranks of batch B make the update of one process with batch
    N*B. ``op=hvd.Sum`` only sums: use it with a loss that is the SUM over the local
    samples divided by the *global* batch size, which stays exact when the shards of a
    global batch are uneven or empty (see ``partition_dataset``). ``op=hvd.Adasum`` does
    what Horovod's Adasum optimizer does: each rank steps the wrapped optimizer on its own
    gradients, the parameter deltas are combined by adaptive summation
    (``distnn.distributed.adasum``) and every rank applies the combined delta; do not
    scale the learning rate by the number of ranks.

    ``zero_grad()`` zeroes the flat buffer instead of setting gradients to None, so they
    stay views (a gradient replaced by other code is copied back into the buffer by the
    hook). Every rank must call ``step()`` (or ``synchronize()``) once per
    ``backward_passes_per_step`` backward passes, a rank with an empty shard too; a rank
    out of data calls ``hvd.join()`` instead.

    Args:
        optimizer: a torch optimizer over CPU parameters of one floating dtype.
        named_parameters: ``model.named_parameters()`` (names appear in errors); default:
            the optimizer's parameters.
        compression: ``hvd.Compression.none`` or ``hvd.Compression.fp16`` (buckets travel
            as float16), or what sends less, with error feedback: "topk:RATIO",
            "threshold:VALUE", "powersgd:RANK" or ``hvd.Compression.topk(0.01)``,
            ``.threshold(1e-3)``, ``.powersgd(2)`` (``distnn.distributed.lossy``;
            with ``non_blocking`` each bucket's exchange starts during backward, else all
            of them in ``synchronize()``, after backward; the same result).
        error_feedback: with topk/threshold/powersgd, add what a rank did not send to its
            next gradient (default True).
        compression_warmup_steps: dense steps before topk/threshold/powersgd start.
        backward_passes_per_step: backward passes accumulated locally before the
            all-reduce (gradient accumulation: gradients are summed over the passes).
        op: ``hvd.Average``, ``hvd.Sum`` or ``hvd.Adasum``.
        gradient_predivide_factor: with Average, scale by 1/f before the sum and f/size
            after it.
        num_groups, groups: accepted for Horovod's signature; distnn fuses gradients into
            buckets of ``bucket_size_mb`` instead of explicit groups.
        sparse_as_dense: accepted; gradients are always reduced densely here, and sparse
            ones (``nn.Embedding(sparse=True)``) go back to the step as sparse tensors
            (``SparseAdam`` works).
        process_set: reduce over this ``hvd.ProcessSet`` only (a rank outside it steps on
            its own gradients).
        bucket_size_mb: target bucket size in MiB (0: one bucket per parameter).
        non_blocking: start each bucket's all-reduce during backward; False does one
            blocking all-reduce per bucket in ``synchronize()``.
        comm: communicator (default: the process set's).
        stall: a ``distnn.distributed.stall.StallInspector`` watching that communicator
            (``watch_stalls(comm)``); the reducer tells it which bucket it waits for, so a
            stalled rank is named with the bucket (default: none).

    Example:
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                       named_parameters=model.named_parameters())
        opt.zero_grad(); loss_fn(model(x), y).backward(); opt.step()
    """

    def __init__(self, optimizer: torch.optim.Optimizer,
                 named_parameters: Iterable | None = None, compression=Compression.none,
                 backward_passes_per_step: int = 1, op: str = Average,
                 gradient_predivide_factor: float = 1.0, num_groups: int = 0, groups=None,
                 sparse_as_dense: bool = False, process_set=global_process_set, *,
                 bucket_size_mb: float = 4.0, non_blocking: bool = True,
                 comm: Communicator | None = None, error_feedback: bool = True,
                 compression_warmup_steps: int = 0, stall=None):
        # torch.optim.Optimizer.__init__ is not called: the state, groups and hooks are
        # the wrapped optimizer's (``__getattr__``)
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"DistributedOptimizer wraps a torch.optim.Optimizer, got "
                            f"{type(optimizer).__name__}; for distnn optimizers use "
                            "distnn.distributed.DistributedOptimizer")
        key = str(op).lower()
        if key not in _OPS:
            raise ValueError(f"DistributedOptimizer: op must be hvd.Average, hvd.Sum or "
                             f"hvd.Adasum ('average', 'sum', 'adasum'), got {op!r}")
        if comm is None:
            included = process_set is None or process_set.included()
            comm = channel(process_set=process_set) if included else LocalComm()
        else:
            comm = channel(comm)  # the default communicator: join-safe
        self.optimizer = optimizer
        self.comm = comm
        self.op = op = _OPS[key]
        self.non_blocking = bool(non_blocking)
        self.compression = compression
        named = _named(optimizer, named_parameters)
        dtypes = {p.dtype for _, p in named}
        if len(dtypes) > 1 or any(d not in _NP_DTYPES for d in dtypes):
            raise ValueError(f"DistributedOptimizer: parameters have dtypes "
                             f"{sorted(map(str, dtypes))}; use one of float32/float64/"
                             "float16 for all (model.float() or model.double())")
        if any(p.device.type != "cpu" for _, p in named):
            raise ValueError("DistributedOptimizer: distnn.torch reduces CPU tensors "
                             "(cuda_built() is False); move the model to the CPU")
        self._params = [p for _, p in named]
        self._names = [n for n, _ in named]
        np_dtype = _NP_DTYPES[next(iter(dtypes))] if dtypes else np.float32
        sizes = [p.numel() for p in self._params]
        offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
        self._offsets = offsets
        self._flat = np.zeros(int(offsets[-1]), dtype=np_dtype)
        flat_t = torch.from_numpy(self._flat)
        self._views = [flat_t[offsets[i]:offsets[i + 1]].view_as(p)
                       for i, p in enumerate(self._params)]
        with torch.no_grad():
            for p, view in zip(self._params, self._views):
                if p.grad is not None:
                    view.copy_(p.grad)
                p.grad = view
        segments = [(n, int(offsets[i]), int(offsets[i + 1]))
                    for i, n in enumerate(self._names)]
        self._reducer = Reducer(self._flat, segments, comm, op=op,
                                bucket_size_mb=bucket_size_mb, non_blocking=non_blocking,
                                compression=compression,
                                backward_passes_per_step=backward_passes_per_step,
                                gradient_predivide_factor=gradient_predivide_factor,
                                blocking_last=True, what="parameter",
                                error_feedback=error_feedback,
                                compression_warmup_steps=compression_warmup_steps, stall=stall,
                                tensors=[(n, int(offsets[i]), int(offsets[i + 1]),
                                          tuple(p.shape)) for i, (n, p) in enumerate(named)])
        self.buckets = self._reducer.buckets
        self._active = comm.size > 1
        if self._active:
            layouts = comm.allgather_obj(
                (str(self._flat.dtype), [(n, tuple(p.shape)) for n, p in named]))
            if any(lay != layouts[0] for lay in layouts):
                bad = next(r for r, lay in enumerate(layouts) if lay != layouts[0])
                raise RuntimeError(
                    f"DistributedOptimizer: rank {bad} has {len(layouts[bad][1])} parameters "
                    f"({layouts[bad][0]}), rank 0 has {len(layouts[0][1])} "
                    f"({layouts[0][0]}); build the same model on every rank")
        self._should_synchronize = True
        # parameters whose step wants sparse gradients (accumulated densely in the buffer)
        self._sparse: set = (set(range(len(self._params)))
                             if isinstance(optimizer, torch.optim.SparseAdam) else set())
        self._hooks = []
        if self._active and self.non_blocking and op != "adasum":
            for i, p in enumerate(self._params):
                self._hooks.append(p.register_post_accumulate_grad_hook(
                    lambda param, i=i: self._on_grad(i, param)))

    # -- the wrapped optimizer -----------------------------------------------------------
    def __getattr__(self, name: str):
        # only for what this object lacks: param_groups, state, defaults, the hooks' dicts
        if name == "optimizer":  # not set yet (during __init__)
            raise AttributeError(name)
        return getattr(self.optimizer, name)

    @property
    def __class__(self):
        """The wrapped optimizer's class: ``isinstance(opt, torch.optim.SGD)`` holds for a
        wrapped SGD (``isinstance(opt, DistributedOptimizer)`` too, by ``type(opt)``)."""
        return type(self.optimizer)

    def state_dict(self) -> dict:
        """The wrapped optimizer's state (what a checkpoint of it would hold)."""
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict) -> None:
        """Load the wrapped optimizer's state; pending reductions are forgotten."""
        self._reducer.reset()
        self.optimizer.load_state_dict(state_dict)

    def add_param_group(self, param_group: dict) -> None:
        raise NotImplementedError("DistributedOptimizer: its gradient buffer holds the "
                                  "parameters it was built with; add the group to the "
                                  "optimizer before wrapping it")

    @property
    def _parameter_names(self) -> dict:
        """Horovod's map of parameter -> name (``param.<i>`` without named_parameters)."""
        return {p: n for n, p in zip(self._names, self._params)}

    # -- counters live in the reducer (the common ones: ReducerCounters) ----------------
    backward_passes_per_step = property(lambda self: self._reducer.passes)
    gradient_predivide_factor = property(lambda self: self._reducer.predivide)

    def set_backward_passes_per_step(self, passes: int) -> None:
        """Change the number of backward passes per step (between steps)."""
        self._reducer.set_passes(passes)

    def _claim(self, i: int, p: torch.Tensor) -> None:
        """Make p.grad the buffer view again if other code replaced it."""
        view = self._views[i]
        g = p.grad
        if g is None:
            view.zero_()
        elif g.is_sparse:  # reduced densely; handed back sparse to the step (SparseAdam)
            with torch.no_grad():
                view.copy_(g.to_dense())
            self._sparse.add(i)
        elif g.data_ptr() != view.data_ptr():
            with torch.no_grad():
                view.copy_(g)
        else:
            return
        p.grad = view

    def _on_grad(self, i: int, p: torch.Tensor) -> None:
        self._claim(i, p)
        self._reducer.ready(i)

    def synchronize(self) -> None:
        """Finish the all-reduce of every bucket; the parameters' ``.grad`` then hold the
        combined gradients (``step()`` calls it unless inside ``skip_synchronize()``). With
        Adasum there is nothing to do before the step, as in Horovod."""
        if not self._active or self._reducer.synced or self.op == "adasum":
            return
        # gradients no hook has seen (unused parameters, or blocking)
        for i in (self._reducer.not_started() if self.non_blocking
                  else range(len(self._params))):
            self._claim(i, self._params[i])
        self._reducer.synchronize()

    @contextlib.contextmanager
    def skip_synchronize(self):
        """``step()`` inside this context does not synchronize: call ``synchronize()``
        first, then edit the gradients (unscale, clip), then step."""
        if self.op == "adasum" and self._active:
            raise AssertionError("Skipping synchronization is not supported when using "
                                 "Adasum optimizer (Horovod's rule): call step() directly")
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        """Wait for the gradient all-reduce, combine (see the class doc), update."""
        if self.op == "adasum" and self._active:
            return self._adasum_step(closure)
        if self._should_synchronize:
            if self._reducer.synced:
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() "
                              "after optimizer.synchronize(); wrap step() in "
                              "`with optimizer.skip_synchronize():`", stacklevel=2)
            self.synchronize()
        for i in self._sparse:
            self._params[i].grad = self._views[i].to_sparse(min(1, self._views[i].dim()))
        try:
            out = self.optimizer.step(closure)
        finally:
            for i in self._sparse:
                self._params[i].grad = self._views[i]
        self._reducer.reset()
        return out

    def _params_flat(self) -> np.ndarray:
        if not self._params:
            return np.zeros(0, self._flat.dtype)
        return np.concatenate([p.detach().reshape(-1).numpy() for p in self._params])

    def _adasum_step(self, closure):
        """Step on the local gradients, combine the parameter deltas with Adasum, apply."""
        start = self._params_flat()
        out = self.optimizer.step(closure)
        delta = self._params_flat() - start
        self._reducer.reduce_(delta)
        combined = torch.from_numpy(start + delta)
        with torch.no_grad():
            for p, lo, hi in zip(self._params, self._offsets[:-1], self._offsets[1:]):
                p.copy_(combined[lo:hi].view_as(p))
        self._reducer.reset()
        return out

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zero the flat gradient buffer (gradients stay views into it; ``set_to_none`` is
        accepted for compatibility and ignored)."""
        if self._reducer.in_flight:
            raise RuntimeError("optimizer.zero_grad() was called after loss.backward() but "
                               "before optimizer.step() or optimizer.synchronize(); the "
                               "all-reduce is still reading the gradients: step first")
        self._flat[...] = 0
        for i, p in enumerate(self._params):
            if p.grad is None or p.grad.data_ptr() != self._views[i].data_ptr():
                p.grad = self._views[i]

    def reset_grad(self) -> None:
        """Needle's name for ``zero_grad()``."""
        self.zero_grad()

    def gradients_flat(self) -> np.ndarray:
        """The flat gradient buffer (every parameter's ``.grad`` is a view into it)."""
        return self._flat

    def remove_hooks(self) -> None:
        """Detach the gradient hooks (before wrapping the same parameters again)."""
        for h in self._hooks:
            h.remove()
        self._hooks = []

    def __repr__(self) -> str:
        return (f"DistributedOptimizer({type(self.optimizer).__name__}, op={self.op!r}, "
                f"buckets={len(self.buckets)}, non_blocking={self.non_blocking})")
