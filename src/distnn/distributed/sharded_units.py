"""The per-unit traffic of sharded stages 2 and 3 (``ShardedOptimizer``, sharded.py).

A *unit* is a run of consecutive top-level layers with parameters, at least
``bucket_size_mb`` of them (one layer with 0): a contiguous range [lo, hi) of the model's
flat buffers, exchanged by one collective (fewer, larger collectives: each is a moment all
ranks must meet, which costs most on a shared or slow host). Rank r owns the slice
``bounds[r]`` of those buffers; a unit's part on rank r is the intersection, possibly
empty. ``UnitExchange`` is driven by the model's hooks:

* before a unit's backward (``Sequential.layer_hooks``, phase "backward") its gradient
  views point into a fresh buffer of the unit's size; after it (``grad_hooks``) a
  non-blocking reduce-scatter sums that buffer over the ranks into each rank's own part
  of its gradient shard, and the buffer is dropped once the exchange completes (stage 2
  and 3: no rank ever holds the whole gradient, reduced or not);
* stage 3 only: before a unit's forward its parameters are all-gathered from the owners'
  shards into a fresh buffer (started one unit ahead: the prefetch), its parameter views
  pointed there, and the buffer dropped when the pass has moved on; the same before its
  backward, in backward order (the last unit's buffer stays from its forward).

Outside those moments the views are read-only NaN placeholders of the right shape (no
memory): a layer that runs on parameters nobody gathered gives NaN, never silent zeros.
Every rank starts the same collectives in the same order (the layers' order); a rank
that ran no forward/backward in a step (no samples) replays the hooks in ``finish``.
"""
from __future__ import annotations

import time

import numpy as np


def shard_bounds(total: int, size: int) -> list[tuple[int, int]]:
    """[lo, hi) of each rank's contiguous slice of ``total`` elements over ``size`` ranks:
    ``np.array_split``'s cut (the first ``total % size`` ranks one element more)."""
    base, extra = divmod(int(total), int(size))
    out, lo = [], 0
    for r in range(size):
        hi = lo + base + (1 if r < extra else 0)
        out.append((lo, hi))
        lo = hi
    return out


def overlap_counts(lo: int, hi: int, bounds) -> list[int]:
    """Elements of [lo, hi) on each rank's slice (rank order; they sum to hi - lo)."""
    return [max(0, min(hi, b) - max(lo, a)) for a, b in bounds]


class UnitExchange:
    """Gradients reduce-scattered (stage >= 2) and parameters gathered (stage 3) unit by
    unit, as the model's hooks call it (see the module doc).

    Args:
        model: the built ``Sequential``.
        comm: the communicator.
        bounds: every rank's slice of the flat buffers.
        grad_shard: this rank's slice of the summed gradient (written here).
        param_shard: this rank's slice of the parameters (stage 3), else None.
        stage: 2 or 3.
        bucket_size_mb: the least size of a unit (0: every layer its own).
    """

    def __init__(self, model, comm, bounds, grad_shard: np.ndarray,
                 param_shard: np.ndarray | None, stage: int, bucket_size_mb: float = 0.0):
        self.model, self.comm, self.bounds, self.stage = model, comm, bounds, stage
        self.grad_shard, self.param_shard = grad_shard, param_shard
        self.lo, self.hi = bounds[comm.rank]
        least = float(bucket_size_mb) * (1 << 20) / np.dtype(model.dtype).itemsize
        groups: list[list] = []
        for layer, a, b in model.layer_ranges():
            if groups and groups[-1][3] - groups[-1][2] < least:
                groups[-1][1], groups[-1][3] = layer, int(b)  # grow the open unit
            else:
                groups.append([layer, layer, int(a), int(b)])
        # (first layer, last layer, lo, hi): forward enters a unit at its first layer,
        # backward at its last, and its gradients are final after its first's backward
        self.units = [(first, a, b) for first, _, a, b in groups]
        self.last = [last for _, last, _, _ in groups]
        self.index = {id(first): i for i, (first, _, _) in enumerate(self.units)}
        self.index_back = {id(last): i for i, last in enumerate(self.last)}
        self.views = [[(layer, key, off - a, n, layer.params[key].shape)
                       for layer, key, off, n in model._layout if a <= off < b]
                      for _, a, b in self.units]
        self.counts = [overlap_counts(a, b, bounds) for _, a, b in self.units]
        self._nan = np.full((), np.nan, dtype=model.dtype)
        self.calls = 0
        self.bytes = 0
        self.wait_s = 0.0
        self.peak_unit_bytes = 0  # the most bytes of unit buffers alive at once
        self.reset()

    def reset(self) -> None:
        n = len(self.units)
        self.grads: list[np.ndarray | None] = [None] * n
        self.reducing: list = [None] * n
        self.params: list[np.ndarray | None] = [None] * n
        self.gathering: list = [None] * n
        self.forwarded = [False] * n
        self.reduced = [False] * n

    # -- placeholders and views ---------------------------------------------------------
    def placeholders(self, which: str) -> None:
        """Point every ``which`` ("params" or "grads") view at a read-only NaN placeholder."""
        for views in self.views:
            for layer, key, _, _, shape in views:
                getattr(layer, which)[key] = np.broadcast_to(self._nan, shape)

    def _point(self, i: int, which: str, buf: np.ndarray | None) -> None:
        for layer, key, off, n, shape in self.views[i]:
            getattr(layer, which)[key] = (np.broadcast_to(self._nan, shape) if buf is None
                                          else buf[off:off + n].reshape(shape))

    def _alive(self) -> int:
        return sum(b.nbytes for b in self.params + self.grads if b is not None)

    # -- stage 3: parameters ------------------------------------------------------------
    def _start_gather(self, i: int) -> None:
        if self.params[i] is not None or self.gathering[i] is not None:
            return
        _, a, b = self.units[i]
        mine = self.param_shard[max(a, self.lo) - self.lo:max(min(b, self.hi), self.lo) - self.lo]
        self.gathering[i] = self.comm.iallgatherv(mine, self.counts[i])
        self.calls += 1
        self.bytes += mine.nbytes

    def _materialize(self, i: int) -> None:
        self._start_gather(i)
        h = self.gathering[i]
        if h is not None:
            t0 = time.perf_counter()
            self.params[i] = h.wait()
            self.wait_s += time.perf_counter() - t0
            self.gathering[i] = None
            self._point(i, "params", self.params[i])
            self.peak_unit_bytes = max(self.peak_unit_bytes, self._alive())

    def _release(self, i: int) -> None:
        h = self.gathering[i]
        if h is not None:  # MPI still writes its buffer: complete it first
            h.wait()
            self.gathering[i] = None
        if self.params[i] is not None:
            self.params[i] = None
            self._point(i, "params", None)

    def release_all(self) -> None:
        for i in range(len(self.units)):
            self._release(i)

    # -- the hooks ----------------------------------------------------------------------
    def hook(self, phase: str, layer) -> None:
        i = (self.index if phase == "forward" else self.index_back).get(id(layer))
        if i is None:  # inside a unit entered already
            return
        n = len(self.units)
        if phase == "forward":
            self.forwarded[i] = True
            if self.stage == 3:
                for j in range(n):
                    if j != i and j != i + 1 and (self.params[j] is not None
                                                  or self.gathering[j] is not None):
                        self._release(j)
                self._materialize(i)
                if i + 1 < n:
                    self._start_gather(i + 1)
            return
        if self.stage == 3:
            for j in range(n):
                if j != i and j != i - 1 and (self.params[j] is not None
                                              or self.gathering[j] is not None):
                    self._release(j)
            self._materialize(i)
            if i > 0:
                self._start_gather(i - 1)
        _, a, b = self.units[i]
        self.grads[i] = np.empty(b - a, dtype=self.model.dtype)
        self._point(i, "grads", self.grads[i])
        self.peak_unit_bytes = max(self.peak_unit_bytes, self._alive())

    def ready(self, layer) -> None:
        """After a unit's backward: start the reduce-scatter of its gradients."""
        i = self.index.get(id(layer))
        if i is None or self.grads[i] is None:
            return
        _, a, b = self.units[i]
        lo, hi = max(a, self.lo), max(min(b, self.hi), max(a, self.lo))
        recv = self.grad_shard[lo - self.lo:hi - self.lo]
        self.reducing[i] = self.comm.ireduce_scatter_(self.grads[i], recv, self.counts[i])
        self.reduced[i] = True
        self.calls += 1
        self.bytes += self.grads[i].nbytes
        self._point(i, "grads", None)
        if self.stage == 3:
            self._release(i)
        for j, h in enumerate(self.reducing):  # progress, and drop what is done
            if h is not None and hasattr(h, "test") and h.test():
                self.reducing[j], self.grads[j] = None, None

    def finish(self) -> None:
        """Complete the step's exchanges; a unit whose hooks did not run this step (a rank
        with no samples) is replayed first, with zero gradients, in the order the other
        ranks ran them."""
        if self.stage == 3 and not any(self.forwarded):
            for layer, _, _ in self.units:
                self.hook("forward", layer)
        for i in reversed(range(len(self.units))):
            if not self.reduced[i]:
                self.hook("backward", self.last[i])
                self.grads[i].fill(0)
                self.ready(self.units[i][0])
        t0 = time.perf_counter()
        for i, h in enumerate(self.reducing):
            if h is not None:
                h.wait()
            self.reducing[i], self.grads[i] = None, None
        self.wait_s += time.perf_counter() - t0
        if self.stage == 3:
            self.release_all()
        self.reset()
