"""``pipeline``: pipeline stages (GPipe, 1F1B) times data parallelism, as a 2-D grid.

The ranks form D replicas × S stages (``comm.size = D·S``): rank r is stage ``r % S`` of
replica ``r // S``, so the stages of a replica are neighbouring ranks. A Sequential's
top-level layers are cut into S contiguous stages (``pipeline_stages``: by parameters, by
measured time, or at given layers); a rank keeps only its stage's parameters, gradients
and optimizer state (``StageModel.hold``: the other layers' parameters are dropped after
the initial weights are broadcast), so the training state per rank falls with S. Each
global batch is split over the D replicas (as under ``data``), each replica's share into
M micro-batches; activations go forward and their gradients back
between neighbouring stages as non-blocking point-to-point messages (all receives of a
step posted first, each send started as soon as its array is ready). Loss and metrics are
computed on the last stage. Each stage sums its gradients over the M micro-batches, then
over its D replicas (the ``Reducer`` of a ``DistributedOptimizer`` on the sub-communicator
of that stage's ranks), and steps its own optimizer on its own slice of the flat buffer:
the update of the unsplit model with gradient accumulation over the D·M micro-batches.

Batch norm sees each micro-batch alone (running statistics updated per micro-batch) and
a dropout layer draws from its own generator in micro-batch order under both schedules,
so a run is deterministic and the same under GPipe and 1F1B. Validation, callbacks and
the final model see the whole model on every rank: each stage's weights (and buffers) are
broadcast to the other stages of its replica into a whole buffer made for them (dropped
again after validation; kept at the end).
"""
from __future__ import annotations

import contextlib
import time
from typing import Any, Iterator

import numpy as np

from .. import distributed as dist
from ..distributed.coordination import wait_all
from .base import Rule, RuleArgumentError, whole_argument
from .pipeline_stages import (SCHEDULES, CacheSlots, StageModel, live_micro_batches,
                              stage_starts)

__all__ = ["Pipeline", "StageOptimizer"]

TAG_ACTIVATION, TAG_GRADIENT = 1, 2  # + 4 · micro-batch: one tag per message of a step


class StageOptimizer(dist.DistributedOptimizer):
    """A stage's ``DistributedOptimizer`` (its gradients all-reduced over the stage's
    replicas) that checkpoints as sharded state: every rank writes its stage's slice
    [lo, hi) of the parameters and of the optimizer's state arrays to its own file
    (``training.checkpoint_shards``), so no rank gathers the model, and a resume fills
    each rank's stage from the files that overlap it (any stage count; the replicas of a
    stage write the same slice).

    Args:
        bounds: every rank's [lo, hi) of the model's flat buffers (its stage's), by its
            rank in the world.
        rank: this rank in the world (``comm`` is the stage's replicas).
        *args, **kwargs: ``DistributedOptimizer``'s.
    """

    stage = 0  # no ZeRO stage: each rank's slice is its pipeline stage's

    def __init__(self, *args, bounds: list[tuple[int, int]], rank: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.bounds = [tuple(map(int, b)) for b in bounds]
        self.lo, self.hi = self.bounds[rank]
        self.total = int(self.model.total)

    def shard_arrays(self) -> dict[str, np.ndarray]:
        """The stage's parameters and optimizer state arrays, by name (its shard file)."""
        out = {"params": np.ascontiguousarray(self.model.parameters_flat())}
        for key, arr in self.optimizer.state[0].items():
            out[f"state/{key}"] = arr
        return out

    def load_shard_arrays(self, pieces) -> None:
        """Fill the stage's parameters and optimizer state from ``pieces``: [(lo, hi,
        read)] of the slices a checkpoint's ranks wrote (``read(name)``: an array of that
        rank's file)."""
        params, state = self.model.parameters_flat(), self.optimizer.state[0]
        for lo, hi, read in pieces:
            a, b = max(lo, self.lo), min(hi, self.hi)
            if a < b:
                params[a - self.lo:b - self.lo] = read("params")[a - lo:b - lo]
                for key, arr in state.items():
                    arr[a - self.lo:b - self.lo] = read(f"state/{key}")[a - lo:b - lo]

    def state_dict(self) -> dict[str, Any]:
        """The optimizer's scalars; its state arrays are per stage (``shard_arrays``)."""
        d = self.optimizer.state_dict()
        d["state"] = []
        return d

    def load_state_dict(self, d: dict[str, Any]) -> None:
        d = dict(d)
        if not d.get("state"):  # the arrays come from the shard files
            d["state"] = [{k: v.copy() for k, v in self.optimizer.state[0].items()}]
        self.optimizer.load_state_dict(d)


class _StepState:
    """One step's messages in flight, arrays kept until sent, and its times and sums."""

    def __init__(self, boxes: tuple[dict, dict], n_sums: int):
        self.inbox, self.gradbox = boxes
        self.sends: list = []
        self.upstream: dict = {}
        self.delta = np.zeros(n_sums + 1)  # the last stage's metric sums, then the loss
        self.wait = self.compute = 0.0
        self.sent = 0


class Pipeline(Rule):
    """Pipeline parallelism over a Sequential's layers, with data parallelism around it.

    Args:
        stages: S, the number of stages (ranks must be a multiple of it).
        micro_batches: M, the micro-batches of each replica's share of a batch (it must
            divide that share; a short last batch is split as evenly as it goes).
        schedule: "gpipe" (all forwards, then all backwards) or "1f1b" (one forward, one
            backward in turn once the pipeline is full: fewer live activations).
        balance: "time" (each top-level layer's forward and backward timed on one
            micro-batch at bind, then the cut that makes the slowest stage fastest),
            "params" (the same over parameter counts: reproducible), or the first layer
            of each stage after the first (e.g. "2,5" or (2, 5)).
        probe_rows: the rows of the micro-batch ``balance="time"`` times (the run passes
            its batch size / M).
        bucket_size_mb: bucket size of each stage's gradient all-reduce over its replicas.

    Example:
        rule = Pipeline(stages=2, micro_batches=4, schedule="1f1b", balance="params")
        Trainer(model, SGD(model, lr=0.1), rule=rule).fit(train, batch_size=64)
    """

    name = "pipeline_stages"
    chosen_by_name = False  # the run picks it by its stage count (run/rule.py)
    lockstep = True

    def __init__(self, *, stages: int = 2, micro_batches: int = 1, schedule: str = "gpipe",
                 balance: Any = "time", probe_rows: int = 16, bucket_size_mb: float = 4.0):
        for arg, value in (("stages", stages), ("micro_batches", micro_batches),
                           ("probe_rows", probe_rows)):
            whole_argument(self.name, arg, value)
        if schedule not in SCHEDULES:
            raise RuleArgumentError("schedule", f"pipeline schedule must be one of "
                                    f"{sorted(SCHEDULES)}, got {schedule!r}")
        self.stages, self.micro_batches = int(stages), int(micro_batches)
        self.schedule, self.balance = schedule, balance
        self.probe_rows, self.bucket_size_mb = int(probe_rows), float(bucket_size_mb)
        self.starts: tuple[int, ...] = ()
        self.counters = {"messages": 0, "bytes": 0, "wait_s": 0.0, "compute_s": 0.0,
                         "steps": 0, "step_s": 0.0}

    # -- the grid ------------------------------------------------------------------------
    def shard_of(self, comm) -> tuple[int | None, int]:
        return comm.rank // self.stages, max(1, comm.size // self.stages)

    def role(self, rank: int) -> str:
        if not self.starts:
            return ""
        s, d = rank % self.stages, rank // self.stages
        lo, hi = self._layers_of(s)
        return (f"pipeline stage {s} of {self.stages} (layers {lo}..{hi - 1}), replica {d} "
                f"of {self._replicas}")

    def _layers_of(self, s: int) -> tuple[int, int]:
        ends = (*self.starts[1:], self._n_layers)
        return self.starts[s], ends[s]

    def bind(self, trainer, optimizer):
        comm, model, S = trainer.comm, trainer.model, self.stages
        if not hasattr(model, "layers") or not hasattr(model, "layer_ranges"):
            raise RuleArgumentError("stages", f"pipeline stages cut a distnn Sequential's "
                                    f"layers; got a {type(model).__name__}")
        if S > len(model.layers):
            raise RuleArgumentError(
                "stages", f"{S} pipeline stages need at least {S} top-level layers; the "
                f"model has {len(model.layers)}: use at most {len(model.layers)} stages")
        if comm.size % S:
            raise RuleArgumentError(
                "stages", f"{comm.size} ranks are not a multiple of {S} pipeline stages; run "
                f"a multiple of {S} ranks (replicas x stages) or change the stages")
        if isinstance(optimizer, dist.DistributedOptimizer):
            raise RuleArgumentError("stages", "the pipeline builds each stage's "
                                    "DistributedOptimizer itself: pass the plain optimizer")
        if any(getattr(l, "stat_reducer", None) is not None for l in model.walk()):
            raise RuleArgumentError("stages", "synchronised batch norm reduces over all "
                                    "ranks inside forward; pipeline stages normalise per "
                                    "micro-batch: drop sync_batchnorm")
        self._n_layers, self._replicas = len(model.layers), comm.size // S
        self.stage, self.replica = comm.rank % S, comm.rank // S
        self.starts = stage_starts(model, S, self.balance, self.probe_rows, comm)
        self._stage_comm = comm.split(self.replica, self.stage)   # this replica's stages
        self._replica_comm = comm.split(self.stage, self.replica)  # this stage's replicas
        self._stages = [StageModel(model, *self._layers_of(s)) for s in range(S)]
        self.model = self._stages[self.stage]
        # the initial weights while every rank still has them all; then only the stage's
        dist.broadcast_parameters(model, comm=comm)
        if S > 1:
            self.model.hold()
        self.order = SCHEDULES[self.schedule](self.stage, S, self.micro_batches)
        self._slots = CacheSlots(self.model.layers, live_micro_batches(self.order))
        base = type(optimizer)(self.model, lr=optimizer.scheduled_lr,
                               **optimizer.hyperparameters())
        base.lr_scale = optimizer.lr_scale
        # op="sum": the loss of every micro-batch is already divided by the global batch.
        ranges = [(self._stages[r % S].start, self._stages[r % S].stop)
                  for r in range(comm.size)]
        return StageOptimizer(base, self.model, comm=self._replica_comm, op="sum",
                              bucket_size_mb=self.bucket_size_mb, non_blocking=False,
                              stall=trainer.stall, bounds=ranges, rank=comm.rank)

    # -- hooks ---------------------------------------------------------------------------
    def begin(self, trainer) -> None:
        if self.stages > 1:
            self.model.hold()  # a second fit: the model was made whole at the first's end
        from ..nn.allocator import release_freed_memory
        release_freed_memory()  # the template optimizer's whole-model state, dropped
        share = trainer.global_batch_size // self._replicas
        if self.micro_batches > share or share % self.micro_batches:
            raise RuleArgumentError(
                "micro_batches", f"{self.micro_batches} micro-batches do not divide a "
                f"replica's batch of {share} samples (global batch "
                f"{trainer.global_batch_size} over {self._replicas} replicas); use a "
                f"divisor of {share}")

    def train_batch(self, trainer, batch, sums: np.ndarray) -> float:
        t_step = time.perf_counter()
        S = self.stages
        n, denom = len(batch.x), self.loss_denominator(batch)
        bounds = np.linspace(0, n, self.micro_batches + 1).round().astype(int)
        pieces = [(a, b) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]
        m = len(pieces)
        grads = self.model.gradients_flat()
        st = _StepState(self._post_receives(pieces), len(sums))
        acc = np.zeros_like(grads) if m > 1 else None
        try:
            for op, i in (step for step in self.order if step[1] < m):
                if op == "F":
                    self._forward_piece(trainer, batch, pieces[i], i, denom, st)
                else:
                    self._backward_piece(i, st, acc)
            st.wait += wait_all(st.sends, max_sleep=2e-4)
        except Exception as exc:
            exc.add_note(f"[{self.role(trainer.comm.rank)}]")
            raise
        if acc is not None:
            grads[...] = acc
        elif m == 0:
            grads[...] = 0  # no samples for this replica: still take part in the all-reduce
        delta = st.delta
        if S > 1:
            self._stage_comm.bcast_(delta, root=S - 1)
        sums += delta[:-1]
        c = self.counters
        c["messages"] += len(st.sends)
        c["bytes"] += st.sent
        c["wait_s"] += st.wait
        c["compute_s"] += st.compute
        c["steps"] += 1
        c["step_s"] += time.perf_counter() - t_step
        return float(delta[-1])

    def _post_receives(self, pieces) -> tuple[dict, dict]:
        """(activations in, gradients in): every receive of the step, posted first."""
        s, comm, dtype = self.stage, self._stage_comm, self.model.dtype
        inbox, gradbox = {}, {}
        for i, (a, b) in enumerate(pieces):
            if s > 0:
                inbox[i] = comm.irecv_(np.empty((b - a, *self.model.input_shape), dtype),
                                       s - 1, TAG_ACTIVATION + 4 * i)
            if s < self.stages - 1:
                gradbox[i] = comm.irecv_(np.empty((b - a, *self.model.output_shape), dtype),
                                         s + 1, TAG_GRADIENT + 4 * i)
        return inbox, gradbox

    def _forward_piece(self, trainer, batch, piece, i: int, denom, st: _StepState) -> None:
        """Micro-batch i forward: its input from the batch or the stage before, its output
        to the stage after, or (last stage) its loss, metrics and loss gradient."""
        s, (a, b) = self.stage, piece
        if s == 0:
            x = batch.x[a:b]
        else:
            st.wait += wait_all([st.inbox[i]], max_sleep=2e-4)
            x = st.inbox.pop(i).wait()
        t0 = time.perf_counter()
        self._slots.enter(i)
        y = self.model.forward(x, True)
        self._slots.leave(i)
        if s == self.stages - 1:
            loss, st.upstream[i] = trainer.loss_fn(y, batch.y[a:b], denom=denom)
            trainer.metrics.accumulate(st.delta[:-1], y, batch.y[a:b], loss, denom)
            st.delta[-1] += float(loss)
        else:
            st.upstream[i] = y = np.ascontiguousarray(y)  # kept until sent
            st.sends.append(self._stage_comm.isend_(y, s + 1, TAG_ACTIVATION + 4 * i))
            st.sent += y.nbytes
        st.compute += time.perf_counter() - t0

    def _backward_piece(self, i: int, st: _StepState, acc: np.ndarray | None) -> None:
        """Micro-batch i backward: dy from the stage after (or the loss), dx to the stage
        before; its gradients added into acc where the step has several micro-batches."""
        s = self.stage
        if s < self.stages - 1:
            st.wait += wait_all([st.gradbox[i]], max_sleep=2e-4)
            dy = st.gradbox.pop(i).wait()
        else:
            dy = st.upstream[i]
        t0 = time.perf_counter()
        self._slots.enter(i)
        dx = self.model.backward(dy)
        self._slots.leave(i)
        st.upstream.pop(i, None)
        if acc is not None:
            np.add(acc, self.model.gradients_flat(), out=acc)
        if s > 0:
            dx = np.ascontiguousarray(dx)
            st.upstream[("dx", i)] = dx
            st.sends.append(self._stage_comm.isend_(dx, s - 1, TAG_GRADIENT + 4 * i))
            st.sent += dx.nbytes
        st.compute += time.perf_counter() - t0

    def end_epoch(self, trainer, epoch: int) -> None:
        # Every stage added the last stage's sums (so its bar and batch logs are right);
        # only the last stage's count in the epoch's all-reduce, once per replica.
        if self.stage != self.stages - 1 and trainer.epoch_sums is not None:
            trainer.epoch_sums[...] = 0

    def prepare_checkpoint(self, trainer) -> None:
        """Every stage's layer buffers (batch-norm statistics) to the ranks of its
        replica, so rank 0's main file holds them all (the parameters and optimizer
        state go to each rank's shard file: ``StageOptimizer``)."""
        if self.stages > 1:
            self._share_buffers()

    def _share_buffers(self) -> None:
        for s, stage in enumerate(self._stages):
            for layer in stage.walk():
                for key in sorted(layer.buffers):
                    self._stage_comm.bcast_(layer.buffers[key], root=s)

    def _share_stages(self, trainer) -> None:
        """The whole model on every rank of a replica: a whole parameter buffer, each
        stage's slice (and its layers' buffers) broadcast by the stage that holds it."""
        if self.stages == 1:
            return
        mine = self.model
        flat = np.empty(mine.total, dtype=mine.dtype)
        flat[mine.start:mine.stop] = mine.parameters_flat()
        for s, stage in enumerate(self._stages):
            if stage.stop > stage.start:
                self._stage_comm.bcast_(flat[stage.start:stage.stop], root=s)
        self._share_buffers()
        mine.whole(flat)

    @contextlib.contextmanager
    def evaluation_weights(self, trainer) -> Iterator[None]:
        self._share_stages(trainer)
        try:
            yield
        finally:
            if self.stages > 1:
                self.model.hold()

    def end(self, trainer) -> None:
        self._share_stages(trainer)

    def stats(self) -> dict[str, float]:
        """Messages and bytes this rank sent, seconds it waited for its neighbours and
        computed, and its mean step time (``bubble`` = waiting / step time)."""
        c = self.counters
        out = {k: float(v) for k, v in c.items()}
        out["bubble"] = c["wait_s"] / c["step_s"] if c["step_s"] else float("nan")
        return out

    def __repr__(self) -> str:
        return (f"Pipeline(stages={self.stages}, micro_batches={self.micro_batches}, "
                f"schedule={self.schedule!r}, balance={self.balance!r})")
