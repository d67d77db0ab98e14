"""DistributedOptimizer for distnn models: a thin adapter from ``model.grad_hooks`` to the
one gradient ``Reducer`` (reducer.py, where data-parallel gradients are combined:
docs/design.md §Gradient averaging), plus the check that every rank holds the same model.
"""
from __future__ import annotations

import numpy as np

from .comm import Communicator, get_comm
from .compressors import Compression
from .reducer import (REDUCE_OPS, Reducer, ReducerCounters, make_buckets,  # noqa: F401
                      wire_dtype)


def model_layout(model) -> tuple:
    """What must agree across ranks for flat-buffer collectives on ``model``."""
    flat = model.parameters_flat()
    ranges = tuple((layer.name, lo, hi) for layer, lo, hi in model.layer_ranges())
    bufs = tuple((f"{layer.name}/{k}", tuple(np.shape(v)), str(np.asarray(v).dtype))
                 for layer in model.walk() for k, v in sorted(layer.buffers.items()))
    return (int(flat.size), str(flat.dtype), ranges, bufs)


def parameter_tensors(model) -> list[tuple[str, int, int, tuple[int, ...]]]:
    """(name, start, stop, shape) of every parameter in ``model``'s flat gradient buffer,
    in buffer order (the layers' gradients are views into it)."""
    flat = model.gradients_flat()
    base, size = flat.__array_interface__["data"][0], flat.itemsize
    found = {}
    for layer in model.walk():
        grads = getattr(layer, "grads", None)
        if not isinstance(grads, dict):
            continue
        for key, g in grads.items():
            if not isinstance(g, np.ndarray) or g.size == 0:
                continue
            lo = (g.__array_interface__["data"][0] - base) // size
            if 0 <= lo and lo + g.size <= flat.size:
                found.setdefault(lo, (f"{layer.name}/{key}", lo, lo + g.size, tuple(g.shape)))
    return [found[lo] for lo in sorted(found)]


def check_same_layout(model, comm: Communicator, who: str) -> None:
    """Raise (on every rank alike, so no rank hangs) when ranks hold different models."""
    layouts = comm.allgather_obj(model_layout(model))
    if all(lay == layouts[0] for lay in layouts):
        return
    groups: dict[tuple, list[int]] = {}
    for r, lay in enumerate(layouts):
        groups.setdefault(lay, []).append(r)
    parts = [f"ranks {rs}: {lay[0]} {lay[1]} parameters in {len(lay[2])} layers "
             f"{[n for n, _, _ in lay[2]][:6]}{'...' if len(lay[2]) > 6 else ''}"
             f", {len(lay[3])} buffers" for lay, rs in groups.items()]
    raise RuntimeError(f"{who}: the model differs across ranks ({'; '.join(parts)}); "
                       "build the same architecture, input shape and dtype on every rank")


def wrapped(name: str) -> property:
    """A property that reads and sets the wrapped ``self.optimizer``'s attribute ``name``:
    the learning rate and the step count belong to the optimizer
    (docs/design.md §Learning rate)."""
    return property(lambda self: getattr(self.optimizer, name),
                    lambda self, value: setattr(self.optimizer, name, value))


class WrapsOptimizer:
    """The wrapped ``self.optimizer``'s learning rate, step count and state arrays, read
    and set as the wrapper's own (the distributed and the sharded optimizer)."""

    lr = wrapped("lr")
    scheduled_lr = wrapped("scheduled_lr")
    lr_scale = wrapped("lr_scale")
    iterations = wrapped("iterations")

    def state_arrays(self):
        return self.optimizer.state_arrays()


class DistributedOptimizer(ReducerCounters, WrapsOptimizer):
    """Wrap an optimizer so that ``step()`` uses gradients combined over all ranks.

    A thin adapter: the gradients are reduced by ``Reducer`` (``reducer.py``), the one
    place where data-parallel gradients are combined. With ``op="average"`` (the
    Horovod/DDP default) the gradients of all ranks are summed and divided by the number
    of ranks — N ranks with local batch B then make the update of 1 rank with batch N·B
    when the loss is a mean over the local batch. With ``op="sum"`` they are only summed:
    use it with a loss whose denominator is the *global* batch size, which stays exact
    when shards are uneven (or empty) — that is what the trainer does. ``op="adasum"``
    applies Horovod's Adasum to the parameter *deltas*: every rank steps its optimizer on
    its own gradients, the deltas are combined by adaptive summation, and every rank
    applies the combined delta (no learning-rate scaling by the number of ranks).

    The flat gradient buffer is cut into buckets of whole top-level layers in backward
    order (the last layers first), about ``bucket_size_mb`` each. A hook in
    ``model.grad_hooks`` starts a non-blocking all-reduce of a bucket as soon as backward
    has produced all of its layers' gradients, so communication overlaps the rest of
    backward; ``step()`` waits for them, scales, and calls the wrapped optimizer's step.
    Every rank must call ``step()`` once per backward — a rank with no samples in a batch
    too (with zeroed gradients; buckets that backward did not start are started there).

    Args:
        optimizer: a distnn optimizer over ``model`` (anything with ``step()``).
        model: the built ``Sequential`` whose flat gradient buffer is reduced.
        comm: communicator; None means the default (``distnn.dist.init()``).
        op: "average", "sum" or "adasum", see above.
        bucket_size_mb: target bucket size in MiB (0: one bucket per layer).
        non_blocking: True overlaps with backward (``Iallreduce``); False does one
            blocking ``Allreduce`` per bucket inside ``step()``.
        compression: None, "fp16", "topk:RATIO", "threshold:VALUE", "powersgd:RANK" or a
            Compression object (``Compression.fp16``, ``Compression.topk(0.01)``, ...).
            topk/threshold/powersgd send less than the gradients, with error feedback
            (``distnn.distributed.lossy``); with ``non_blocking`` each bucket is
            compressed and its exchange started during backward (PowerSGD's second
            all-reduce in ``step()``), else all of them in ``step()`` after backward; they
            keep state (``compressor``: residuals, PowerSGD's Q). With fp16
            each bucket travels as float16 (half the bytes) through the float16 exchange
            of ``halfsum.py`` (an all-to-all of float16 chunks, each summed in float32 in
            rank order and rounded once, and an all-gather; started during backward like
            the dense buckets); the result is cast back into the gradient buffer.
            Gradients beyond float16's range (|g| > 65504 / size) overflow to inf. It pays
            where the link is the bottleneck (benchmarks/RESULTS.md: faster than dense on
            1 Gbit/s links; about even at 10 Gbit/s).
        gradient_predivide_factor: with op "average", multiply by 1/f before the sum and
            by f/size after it (Horovod's knob against overflow in low precision).
        error_feedback: with topk/threshold/powersgd, add what a rank did not send to its
            next gradient (default True).
        compression_warmup_steps: dense steps before topk/threshold/powersgd start.
        backward_passes_per_step: must be 1 here: distnn layers overwrite their gradients
            in backward, so there is nothing to accumulate (``distnn.torch`` accumulates).
        stall: a ``stall.StallInspector`` the reducer tells which bucket it waits for.

    Attributes:
        buckets: [(start, stop, [layer names])] in the order they are reduced.
        comm_wait_time: total seconds ``step()`` spent blocked on communication.
        allreduce_calls: number of all-reduce calls started.
        bytes_reduced: total bytes this rank handed to collectives (after compression).
        bytes_dense: what the dense exchange would have handed over (before compression).
        compressor: the ``CompressedReduction`` of topk/threshold/powersgd, else None.
        steps: number of ``step()`` calls.

    Example:
        opt = DistributedOptimizer(SGD(model, lr=0.1 * dist.size()), model, op="average")
        model.backward(dlogits); opt.step()
    """

    def __init__(self, optimizer, model, *, comm: Communicator | None = None,
                 op: str = "average", bucket_size_mb: float = 4.0, non_blocking: bool = True,
                 compression=None, gradient_predivide_factor: float = 1.0,
                 backward_passes_per_step: int = 1, error_feedback: bool = True,
                 compression_warmup_steps: int = 0, stall=None):
        if op not in REDUCE_OPS:
            raise ValueError(f"op must be one of {REDUCE_OPS}, got {op!r}")
        compression = Compression.parse(compression)  # once; the Reducer shares the object
        if backward_passes_per_step != 1:
            raise ValueError(
                f"backward_passes_per_step={backward_passes_per_step!r}: distnn layers "
                "overwrite their gradients in backward, so the NumPy DistributedOptimizer "
                "reduces after every backward (1); accumulate with distnn.torch, or make the "
                "global batch larger")
        if not hasattr(model, "gradients_flat") or not hasattr(optimizer, "step"):
            raise TypeError(
                f"DistributedOptimizer(optimizer, model) takes a distnn optimizer and a built "
                f"distnn model, got {type(optimizer).__name__} and {type(model).__name__}; for "
                "a torch module use distnn.torch.DistributedOptimizer(torch_optimizer, "
                "named_parameters=module.named_parameters()), or wrap the module in "
                "distnn.torch.TorchModel")
        self.optimizer = optimizer
        self.model = model
        self.comm = comm if comm is not None else get_comm()
        self.op = op
        self.non_blocking = bool(non_blocking)
        self.compression = compression
        grads = model.gradients_flat()
        self._grads = grads
        self._segments = [(layer.name, lo, hi) for layer, lo, hi in model.layer_ranges()]
        self._reducer_options = dict(
            op=op, non_blocking=non_blocking, compression=compression,
            gradient_predivide_factor=gradient_predivide_factor,
            tensors=parameter_tensors(model), error_feedback=error_feedback,
            compression_warmup_steps=compression_warmup_steps, stall=stall)
        self._reducer = Reducer(grads, self._segments, self.comm, bucket_size_mb=bucket_size_mb,
                                **self._reducer_options)
        self.buckets = self._reducer.buckets
        # Collective, before any gradient traffic: ranks with different models would
        # otherwise post all-reduces of different sizes and hang or corrupt memory.
        check_same_layout(model, self.comm, "DistributedOptimizer")
        self._segment_of = {id(layer): i for i, (layer, _, _) in
                            enumerate(model.layer_ranges())}
        self.steps = 0
        self._active = self.comm.size > 1
        # One DistributedOptimizer per model: a stale one's hook would post all-reduces
        # that nobody waits for.
        model.grad_hooks[:] = [h for h in model.grad_hooks
                               if not isinstance(getattr(h, "__self__", None),
                                                 DistributedOptimizer)]
        if self._active and self.non_blocking and op != "adasum":
            model.grad_hooks.append(self._hook)

    # -- counters (ReducerCounters) and state live in the reducer -----------------------
    _next = property(lambda self: self._reducer.next)

    def layout(self, bucket_size_mb: float) -> list:
        """The buckets [(start, stop, names)] that ``bucket_size_mb`` would make."""
        return make_buckets(list(self.model.layer_ranges()), self._grads.itemsize,
                            bucket_size_mb)

    def rebucket(self, bucket_size_mb: float) -> None:
        """Cut the gradients into buckets of ``bucket_size_mb`` from the next step on
        (between steps, at the same step on every rank: the autotuner's choice). The
        counters and a compression's state (residuals, PowerSGD's Q, its step) go on."""
        old = self._reducer
        if old.active and any(h is not None for h in old.handles):
            raise RuntimeError("DistributedOptimizer.rebucket: call it between steps, not "
                               "while a step's buckets are in flight")
        new = Reducer(self._grads, self._segments, self.comm, bucket_size_mb=bucket_size_mb,
                      compressor=old.compressor, **self._reducer_options)
        for name in ("allreduce_calls", "bytes_reduced", "bytes_dense", "comm_wait_time",
                     "early_starts"):
            setattr(new, name, getattr(old, name))
        if old.half is not None and hasattr(old.half, "free"):
            old.half.free()
        self._reducer, self.buckets = new, new.buckets

    def _hook(self, layer) -> None:
        i = self._segment_of.get(id(layer))
        if i is not None:
            self._reducer.ready(i)

    def synchronize(self) -> None:
        """Complete the all-reduce of every bucket and combine the gradients. ``step()``
        calls it; call it yourself first to read or clip the combined gradients (a second
        call before ``step()`` does nothing). With op "adasum" there is nothing to do
        before the step (the deltas are combined inside ``step()``)."""
        if self.op != "adasum":
            self._reducer.synchronize()

    def step(self) -> None:
        """Wait for the gradient all-reduce, combine (see class doc), update parameters."""
        if self.op == "adasum" and self._active:
            params = self.model.parameters_flat()
            start = params.copy()
            self.optimizer.step()
            delta = params - start
            self._reducer.reduce_(delta)
            np.add(start, delta, out=params)
        else:
            self.synchronize()
            self.optimizer.step()
            self._reducer.synced = False
        self.steps += 1

    def remove_hook(self) -> None:
        """Detach from ``model.grad_hooks`` (before wrapping the model in another one)."""
        if self._hook in self.model.grad_hooks:
            self.model.grad_hooks.remove(self._hook)

    # -- pass-through to the wrapped optimizer ------------------------------------------
    def state_dict(self):
        return self.optimizer.state_dict()

    def load_state_dict(self, state):
        return self.optimizer.load_state_dict(state)

    def __getattr__(self, name):
        if name == "optimizer":
            raise AttributeError(name)
        return getattr(self.optimizer, name)

    def __repr__(self):
        return (f"DistributedOptimizer({self.optimizer!r}, op={self.op!r}, "
                f"buckets={len(self.buckets)}, non_blocking={self.non_blocking}, "
                f"compression={self.compression!r})")
