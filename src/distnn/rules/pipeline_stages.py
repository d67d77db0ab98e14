"""The pieces of the ``pipeline`` rule that know nothing of messages: where a Sequential is
cut into stages (by parameters, by measured time, or at given layers), the stage's view of
the model (a slice of the layer list and of the flat buffers), the per-micro-batch layer
caches, and the two schedules (the order of forwards F and backwards B on one stage).

A stage is a contiguous run of top-level layers, so its parameters and gradients are a
contiguous slice of the model's flat buffers (they are laid out in forward order): the
stage's optimizer and its gradient all-reduce work on that slice, with no copies.
"""
from __future__ import annotations

import copy
import time
from typing import Callable, Iterator, Sequence

import numpy as np

from ..nn import fusion
from .base import RuleArgumentError

__all__ = ["StageModel", "partition", "stage_starts", "layer_costs", "CacheSlots",
           "SCHEDULES", "gpipe_order", "one_f_one_b_order", "live_micro_batches"]


def partition(costs: Sequence[float], stages: int) -> tuple[int, ...]:
    """The first layer of each of ``stages`` contiguous stages of layers of ``costs``
    that makes the largest stage sum smallest (each stage keeps one layer at least; of
    equal partitions, the one with the earliest cuts).

    Example:
        partition([1, 1, 1, 3], 2) == (0, 3)
    """
    n = len(costs)
    prefix = np.concatenate([[0.0], np.cumsum(np.asarray(costs, dtype=np.float64))])
    inf = float("inf")
    # best[k][j]: the smallest largest sum of cutting layers [0, j) into k stages
    best = [[inf] * (n + 1) for _ in range(stages + 1)]
    cut = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for k in range(1, stages + 1):
        for j in range(k, n - (stages - k) + 1):
            for i in range(k - 1, j):
                value = max(best[k - 1][i], prefix[j] - prefix[i])
                if value < best[k][j] * (1 - 1e-12):
                    best[k][j], cut[k][j] = value, i
    starts, j = [], n
    for k in range(stages, 0, -1):
        j = cut[k][j]
        starts.append(j)
    return tuple(reversed(starts))


def layer_costs(model, balance: str, rows: int, comm) -> np.ndarray:
    """Cost of each top-level layer: its parameter count (``params``) or the seconds of its
    forward and backward on a micro-batch of ``rows`` samples (``time``, measured on a copy
    of the model so no state changes, the best of 3, averaged over the ranks of ``comm``
    so that every rank cuts alike)."""
    if balance == "params":
        return np.array([float(sum(p.size for l in top.walk() for p in l.params.values()))
                         for top in model.layers])
    probe = copy.deepcopy(model)
    shape = probe.layers[0].input_shape
    x = np.random.default_rng(0).standard_normal((rows, *shape)).astype(probe.dtype)
    times = np.zeros(len(probe.layers))
    for k, layer in enumerate(probe.layers):
        layer.need_dx = True
        best = float("inf")
        for rep in range(4):  # the first runs choose kernels and warm caches: not timed
            t0 = time.perf_counter()
            y = layer.forward(x, True)
            layer.backward(np.ones_like(y))
            if rep:
                best = min(best, time.perf_counter() - t0)
        times[k], x = best, y
    comm.allreduce_(times, "mean")
    return times


def stage_starts(model, stages: int, balance, rows: int, comm) -> tuple[int, ...]:
    """The first top-level layer of each stage: ``balance`` "params", "time" or the first
    layers of stages 1.. (a sequence of ints, or a string "2,5")."""
    n = len(model.layers)
    if stages > n:
        raise RuleArgumentError(
            "stages", f"{stages} pipeline stages need at least {stages} top-level layers; the "
            f"model has {n}: use at most {n} stages")
    if isinstance(balance, str) and balance in ("params", "time"):
        if stages == 1:
            return (0,)
        return partition(layer_costs(model, balance, rows, comm), stages)
    try:
        cuts = ([int(c) for c in balance.split(",") if c.strip()] if isinstance(balance, str)
                else [int(c) for c in balance])
    except (TypeError, ValueError):
        cuts = None
    if cuts is None or len(cuts) != stages - 1 or cuts != sorted(set(cuts)) \
            or (cuts and (cuts[0] < 1 or cuts[-1] > n - 1)):
        raise RuleArgumentError(
            "balance", f"balance must be 'params', 'time' or the first layer of each stage "
            f"after the first ({stages - 1} increasing integers in [1, {n - 1}], e.g. "
            f"'{','.join(str(1 + i) for i in range(stages - 1))}'), got {balance!r}")
    return (0, *cuts)


class StageModel:
    """Layers ``[lo, hi)`` of a built Sequential as a model of their own: its parameters
    and gradients are the slice of the model's flat buffers those layers own (views), so
    an optimizer or a ``DistributedOptimizer`` over it updates the model in place.

    ``hold()`` makes the stage the only part of the model this rank keeps: the stage's
    parameters and gradients move to buffers of the stage's size, the other layers' views
    become read-only NaN placeholders of their shapes (no memory; a layer run on them
    gives NaN, never silent zeros) and the model's whole flat buffers are dropped.
    ``whole(flat)`` gives the model a whole parameter buffer again (validation, the end
    of a run); ``hold()`` after it copies the stage's part back.

    Shape: forward takes ``(rows, *layers[lo].input_shape)`` and returns
    ``(rows, *layers[hi - 1].output_shape)``.
    """

    def __init__(self, model, lo: int, hi: int):
        self.model, self.layers = model, list(model.layers[lo:hi])
        self.dtype = model.dtype
        ranges = [(top, a, b) for top, a, b in model.layer_ranges()
                  if any(top is layer for layer in self.layers)]
        self.start = ranges[0][1] if ranges else 0
        self.stop = ranges[-1][2] if ranges else 0
        self.total = int(model.parameters_flat().size)
        self._ranges = [(top, a - self.start, b - self.start) for top, a, b in ranges]
        self._has_params = {id(top) for top, _, _ in ranges}
        self.grad_hooks: list[Callable] = []
        self._params: np.ndarray | None = None  # the stage's own buffers once held
        self._grads: np.ndarray | None = None
        self.held = False
        if lo > 0:
            self.layers[0].need_dx = True  # its dx goes to the stage before
        self.input_shape = self.layers[0].input_shape
        self.output_shape = self.layers[-1].output_shape

    def parameters_flat(self) -> np.ndarray:
        if self._params is not None:
            return self._params
        return self.model.parameters_flat()[self.start:self.stop]

    def gradients_flat(self) -> np.ndarray:
        if self._grads is not None:
            return self._grads
        return self.model.gradients_flat()[self.start:self.stop]

    def hold(self) -> None:
        """Keep only the stage's parameters and gradients (see the class doc); the stage's
        buffers are allocated once (an optimizer keeps views of them), later calls copy
        the model's current values into them. Idempotent."""
        if self.held:
            return
        m = self.model
        if self._params is None:
            self._params = m.parameters_flat()[self.start:self.stop].copy()
            self._grads = np.zeros(self.stop - self.start, dtype=self.dtype)
        else:
            self._params[...] = m.parameters_flat()[self.start:self.stop]
        nan = np.full((), np.nan, dtype=self.dtype)
        for layer, key, off, n in m._layout:
            shape = layer.params[key].shape
            if self.start <= off < self.stop:
                a = off - self.start
                layer.params[key] = self._params[a:a + n].reshape(shape)
                layer.grads[key] = self._grads[a:a + n].reshape(shape)
            else:
                layer.params[key] = np.broadcast_to(nan, shape)
                layer.grads[key] = np.broadcast_to(nan, shape)
        m._params_flat = np.empty(0, dtype=self.dtype)
        m._grads_flat = np.empty(0, dtype=self.dtype)
        from ..nn.allocator import release_freed_memory
        release_freed_memory()  # the whole buffers, kept by distnn's heap thresholds
        self.held = True

    def whole(self, flat: np.ndarray) -> None:
        """Point every layer of the model at ``flat`` (the whole parameter buffer, its
        stage slices filled by their owners) and give it a zeroed gradient buffer."""
        m = self.model
        grads = np.zeros(self.total, dtype=self.dtype)
        for layer, key, off, n in m._layout:
            shape = layer.params[key].shape
            layer.params[key] = flat[off:off + n].reshape(shape)
            layer.grads[key] = grads[off:off + n].reshape(shape)
        m._params_flat, m._grads_flat = flat, grads
        self.held = False

    def layer_ranges(self):
        return list(self._ranges)

    def walk(self) -> Iterator:
        for top in self.layers:
            yield from top.walk()

    def forward(self, x: np.ndarray, training: bool = False) -> np.ndarray:
        if x.dtype != self.dtype:
            x = x.astype(self.dtype)
        return fusion.forward_steps(self.layers, x, training)

    def backward(self, dy: np.ndarray) -> np.ndarray:
        def after(layer):
            if self.grad_hooks and id(layer) in self._has_params:
                for hook in self.grad_hooks:
                    hook(layer)
        return fusion.backward_steps(self.layers, dy, after=after)


class CacheSlots:
    """One set of forward caches per micro-batch for the layers of a stage.

    A layer caches only what the backward of its *last* forward needs; a pipeline runs
    several forwards before their backwards. Each micro-batch gets its own copy of every
    layer's attributes (``enter(i)`` puts micro-batch i's back, ``leave(i)`` keeps them),
    with private dicts of work arrays (a convolution's ``_ws``, batch norm's ``_bufs``) of
    its own, since the caches point into them. Parameters, gradients, buffers (running
    statistics, updated in place) and random generators are the same objects in every
    slot, so they are shared as in an unsplit model. Micro-batch i uses slot
    ``i % live``, ``live`` the most micro-batches in flight on the stage at once (M under
    GPipe, the stages from here to the last under 1F1B); one slot needs none of it.
    """

    def __init__(self, layers, live: int):
        self.live = max(1, int(live))
        self.layers = [l for top in layers for l in top.walk()] if self.live > 1 else []
        self.slots: dict[int, list[dict]] = {}

    def enter(self, i: int) -> None:
        if not self.layers:
            return
        slot = self.slots.get(i % self.live)
        if slot is None:
            slot = [{k: ({} if k.startswith("_") and isinstance(v, dict) else v)
                     for k, v in vars(l).items()} for l in self.layers]
        for layer, state in zip(self.layers, slot):
            vars(layer).update(state)

    def leave(self, i: int) -> None:
        if self.layers:
            self.slots[i % self.live] = [dict(vars(l)) for l in self.layers]


def gpipe_order(stage: int, stages: int, micro_batches: int) -> list[tuple[str, int]]:
    """GPipe: every forward, then every backward (in micro-batch order)."""
    return ([("F", i) for i in range(micro_batches)]
            + [("B", i) for i in range(micro_batches)])


def one_f_one_b_order(stage: int, stages: int, micro_batches: int) -> list[tuple[str, int]]:
    """1F1B (PipeDream-flush): ``stages - stage - 1`` forwards to fill the pipeline, then
    one forward and one backward in turn, then the backwards left; at most
    ``stages - stage`` micro-batches' activations are live on a stage, not M."""
    warm = min(stages - stage - 1, micro_batches)
    order = [("F", i) for i in range(warm)]
    f, b = warm, 0
    while f < micro_batches:
        order += [("F", f), ("B", b)]
        f, b = f + 1, b + 1
    return order + [("B", j) for j in range(b, micro_batches)]


def live_micro_batches(order: list[tuple[str, int]]) -> int:
    """The most micro-batches whose forward is done and backward is not, at any point."""
    live = most = 0
    for op, _ in order:
        live += 1 if op == "F" else -1
        most = max(most, live)
    return most


SCHEDULES: dict[str, Callable[[int, int, int], list[tuple[str, int]]]] = {
    "gpipe": gpipe_order, "1f1b": one_f_one_b_order}
