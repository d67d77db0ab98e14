"""DistributedOptimizer: gradients all-reduced in buckets, overlapped with backward.

This module is the one place where data-parallel gradients are combined (DESIGN rule 7).
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np

from .comm import Communicator, get_comm

Bucket = tuple[int, int, list[str]]


def make_buckets(layer_ranges, itemsize: int, bucket_size_mb: float) -> list[Bucket]:
    """Group top-level layers into contiguous buckets in *backward* order.

    Args:
        layer_ranges: ``model.layer_ranges()``: (layer, start, stop) in forward order.
        itemsize: bytes per gradient element.
        bucket_size_mb: target bucket size in MiB; a layer larger than that is a bucket
            of its own; 0 makes every layer its own bucket.

    Returns:
        [(start, stop, [layer names])], the first bucket holding the last layers.
    """
    if bucket_size_mb < 0:
        raise ValueError(f"bucket_size_mb must be >= 0, got {bucket_size_mb}")
    cap = bucket_size_mb * (1 << 20)
    buckets: list[Bucket] = []
    names: list[str] = []
    start = stop = 0
    for layer, lo, hi in reversed(list(layer_ranges)):
        nbytes = (hi - lo) * itemsize
        if names and ((stop - start) * itemsize + nbytes > cap or hi != start):
            buckets.append((start, stop, names))
            names = []
        if not names:
            start, stop = lo, hi
        start = lo
        names.append(layer.name)
        if (stop - start) * itemsize >= cap:
            buckets.append((start, stop, names))
            names = []
    if names:
        buckets.append((start, stop, names))
    return buckets


def model_layout(model) -> tuple:
    """What must agree across ranks for flat-buffer collectives on ``model``."""
    flat = model.parameters_flat()
    ranges = tuple((layer.name, lo, hi) for layer, lo, hi in model.layer_ranges())
    bufs = tuple((f"{layer.name}/{k}", tuple(np.shape(v)), str(np.asarray(v).dtype))
                 for layer in model.walk() for k, v in sorted(layer.buffers.items()))
    return (int(flat.size), str(flat.dtype), ranges, bufs)


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


class DistributedOptimizer:
    """Wrap an optimizer so that ``step()`` uses gradients combined over all ranks.

    Gradient combination (the one place it is defined): with ``op="average"`` (the
    Horovod/DDP default) the gradients of all ranks are summed and divided by the number
    of ranks — N ranks with local batch B then make the update of 1 rank with batch N·B
    when the loss is a mean over the local batch. With ``op="sum"`` they are only summed:
    use it with a loss whose denominator is the *global* batch size, which stays exact
    when shards are uneven (or empty) — that is what the trainer does.

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
        op: "average" or "sum", see above.
        bucket_size_mb: target bucket size in MiB (0: one bucket per layer).
        non_blocking: True overlaps with backward (``Iallreduce``); False does one
            blocking ``Allreduce`` per bucket inside ``step()``.
        compression: None, or "fp16": each bucket travels as float16 (half the bytes) and
            is reduced by MPI's float16 SUM (or, without one, a user-defined op adding in
            float32); the result is cast back into the gradient buffer. Gradients beyond
            float16's range (|g| > 65504 / size) overflow to inf. It pays only where the
            network is the bottleneck: NumPy (and MPICH) convert float16 in software,
            about 6 ns per element on a CPU without F16C use, which on one machine costs
            more than the bytes it saves (see benchmarks/scaling.py).

    Attributes:
        buckets: [(start, stop, [layer names])] in the order they are reduced.
        comm_wait_time: total seconds ``step()`` spent blocked on communication.
        allreduce_calls: number of all-reduce calls started.
        bytes_reduced: total bytes this rank handed to all-reduce.
        steps: number of ``step()`` calls.

    Example:
        opt = DistributedOptimizer(SGD(model, lr=0.1 * dist.size()), model, op="average")
        model.backward(dlogits); opt.step()
    """

    def __init__(self, optimizer, model, *, comm: Communicator | None = None,
                 op: str = "average", bucket_size_mb: float = 4.0, non_blocking: bool = True,
                 compression: str | None = None):
        if op not in ("average", "sum"):
            raise ValueError(f"op must be 'average' or 'sum', got {op!r}")
        if compression not in (None, "fp16"):
            raise ValueError(f"compression must be None or 'fp16', got {compression!r}")
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
        self.buckets = make_buckets(model.layer_ranges(), grads.itemsize, bucket_size_mb)
        # Collective, before any gradient traffic: ranks with different models would
        # otherwise post all-reduces of different sizes and hang or corrupt memory.
        check_same_layout(model, self.comm, "DistributedOptimizer")
        self._bucket_of = {id(layer): next(i for i, (start, stop, _) in enumerate(self.buckets)
                                           if start <= lo < stop)
                           for layer, lo, _ in model.layer_ranges()}
        self._sizes = [len(names) for _, _, names in self.buckets]
        self._fp16 = ([np.empty(stop - start, np.float16) for start, stop, _ in self.buckets]
                      if compression == "fp16" else None)
        self._reset()
        self.comm_wait_time = 0.0
        self.allreduce_calls = 0
        self.bytes_reduced = 0
        self.steps = 0
        self._active = self.comm.size > 1
        # One DistributedOptimizer per model: a stale one's hook would post all-reduces
        # that nobody waits for.
        model.grad_hooks[:] = [h for h in model.grad_hooks
                               if not isinstance(getattr(h, "__self__", None),
                                                 DistributedOptimizer)]
        if self._active and self.non_blocking:
            model.grad_hooks.append(self._hook)

    # -- communication ------------------------------------------------------------------
    def _reset(self) -> None:
        self._pending = list(self._sizes)
        self._handles: list[Any] = [None] * len(self.buckets)
        self._synced = False
        self._next = 0  # buckets start strictly in order, so every rank posts the same sequence

    def _send_buffer(self, i: int) -> np.ndarray:
        start, stop, _ = self.buckets[i]
        g = self._grads[start:stop]
        if self._fp16 is None:
            return g
        np.copyto(self._fp16[i], g, casting="unsafe")
        return self._fp16[i]

    def _start(self, i: int) -> None:
        buf = self._send_buffer(i)
        self._handles[i] = self.comm.iallreduce_(buf, "sum")
        self.allreduce_calls += 1
        self.bytes_reduced += buf.nbytes

    def _hook(self, layer) -> None:
        i = self._bucket_of.get(id(layer))
        if i is None:
            return
        if self._pending[i] <= 0 or self._synced:
            raise RuntimeError(
                f"DistributedOptimizer: layer {layer.name!r} produced gradients twice before "
                "step(); call step() after every backward (gradients are overwritten, not "
                "accumulated, and the first all-reduce may still be reading them)")
        self._pending[i] -= 1
        while self._next < len(self.buckets) and self._pending[self._next] == 0:
            self._start(self._next)
            self._next += 1
        for h in self._handles[:self._next]:  # let MPI progress the earlier buckets
            if h is not None and hasattr(h, "test"):
                h.test()

    def _finish(self, i: int) -> None:
        if self._fp16 is not None:
            start, stop, _ = self.buckets[i]
            np.copyto(self._grads[start:stop], self._fp16[i])

    def synchronize(self) -> None:
        """Complete the all-reduce of every bucket and combine the gradients. ``step()``
        calls it; call it yourself first to read or clip the combined gradients (a second
        call before ``step()`` does nothing)."""
        if not self._active or self._synced:
            return
        t0 = time.perf_counter()
        if self.non_blocking:
            while self._next < len(self.buckets):  # buckets backward did not start
                self._start(self._next)
                self._next += 1
            for i, h in enumerate(self._handles):
                h.wait()
                self._finish(i)
        else:
            for i in range(len(self.buckets)):
                buf = self._send_buffer(i)
                self.comm.allreduce_(buf, "sum")
                self.allreduce_calls += 1
                self.bytes_reduced += buf.nbytes
                self._finish(i)
        self.comm_wait_time += time.perf_counter() - t0
        if self.op == "average":
            self._grads /= self.comm.size
        self._reset()
        self._synced = True

    def step(self) -> None:
        """Wait for the gradient all-reduce, combine (see class doc), update parameters."""
        self.synchronize()
        self.optimizer.step()
        self._synced = False
        self.steps += 1

    def remove_hook(self) -> None:
        """Detach from ``model.grad_hooks`` (before wrapping the model in another one)."""
        if self._hook in self.model.grad_hooks:
            self.model.grad_hooks.remove(self._hook)

    # -- pass-through to the wrapped optimizer ------------------------------------------
    @property
    def lr(self):
        return self.optimizer.lr

    @lr.setter
    def lr(self, value):
        self.optimizer.lr = value

    @property
    def iterations(self):
        return self.optimizer.iterations

    @iterations.setter
    def iterations(self, value):
        self.optimizer.iterations = value

    def state_dict(self):
        return self.optimizer.state_dict()

    def load_state_dict(self, state):
        return self.optimizer.load_state_dict(state)

    def state_arrays(self):
        return self.optimizer.state_arrays()

    def __getattr__(self, name):
        if name == "optimizer":
            raise AttributeError(name)
        return getattr(self.optimizer, name)

    def __repr__(self):
        return (f"DistributedOptimizer({self.optimizer!r}, op={self.op!r}, "
                f"buckets={len(self.buckets)}, non_blocking={self.non_blocking}, "
                f"compression={self.compression!r})")
