"""The search loop: the coordinator hands out trials, blocks train them and report back.

The coordinator (world rank 0) owns the optuna study (ask/tell). Each block's leader asks
for work, its block trains the candidate data-parallel (``train_fn``, once per fold) and
the leader sends the result back with the block's start/end times; after every epoch the
leader reports the objective, and the coordinator answers whether to prune. A block that
finishes gets the next trial at once, whatever the others are doing. A trial that fails
(an exception, or a loss/objective that is no longer finite) is told to optuna as failed
with its message and the search goes on.

With one process (no mpiexec) the coordinator trains the trials itself, one by one.
"""
from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol, TextIO

import numpy as np

from ..training.callback_base import Callback, metric_mode
from ..training.evaluation import metric_key
from ..distributed.coordination import Backoff, lazy_barrier
from ..distributed.stall import PeerFailed
from .blocks import POLL_S, BlockLayout, block_count
from .report import TrialRecord, live_line
from .study import SearchStudy

__all__ = ["SearchSettings", "TrainFn", "TrialWatch", "Coordinator", "parse_objective",
           "execute_trial", "run_search"]


def parse_objective(spec: str) -> tuple[str, str]:
    """("val_loss", "minimize") from "val_loss"; "val_accuracy,max" -> maximize. Without a
    direction, accuracies are maximized and everything else minimized."""
    parts = [p.strip() for p in str(spec).split(",")]
    if len(parts) > 2 or not parts[0]:
        raise ValueError(f"--objective must be 'metric' or 'metric,min|max' (e.g. val_loss or "
                         f"val_accuracy,max), got {spec!r}")
    name = parts[0].lower()
    prefix = "val_" if name.startswith("val_") else ""
    key = prefix + metric_key(name[len(prefix):])
    mode = parts[1].lower() if len(parts) == 2 else "auto"
    mode = {"minimize": "min", "maximize": "max"}.get(mode, mode)
    if mode not in ("auto", "min", "max"):
        raise ValueError(f"--objective: the direction must be min or max, got {parts[1]!r} "
                         f"in {spec!r}")
    return key, "maximize" if metric_mode(key, mode) == "max" else "minimize"


@dataclass(frozen=True)
class SearchSettings:
    """How a search runs.

    Args:
        num_trials: trials in the study in total (a resumed study counts its old ones).
        block_size: ranks per block.
        n_fold: folds per candidate (1: train once, validate on the validation split).
        objective: the logged key scored at the last epoch (e.g. "val_loss").
        direction: "minimize" or "maximize".
        sampler: "tpe", "random" or "grid"; pruner: "none" or "median".
        seed: sampler seed.
        checkpoint: folder of the saved study (None: not saved).
        checkpoint_interval: save after every this many finished trials (and at the end).
    """

    num_trials: int = 10
    block_size: int = 1
    n_fold: int = 1
    objective: str = "val_loss"
    direction: str = "minimize"
    sampler: str = "tpe"
    pruner: str = "none"
    seed: int = 0
    checkpoint: str | None = None
    checkpoint_interval: int = 1

    def __post_init__(self):
        for name in ("num_trials", "block_size", "n_fold", "checkpoint_interval"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"--{name} must be an integer >= 1, got {value!r}")
        if self.direction not in ("minimize", "maximize"):
            raise ValueError(f"direction must be 'minimize' or 'maximize', got "
                             f"{self.direction!r}")


class TrainFn(Protocol):
    """Trains one candidate on ``comm`` (every rank of a block calls it) and returns the
    ``History``. ``fold`` is None without k-fold; ``callbacks`` go to the Trainer."""

    def __call__(self, params: dict[str, Any], comm, fold: int | None,
                 callbacks: list[Callback]) -> Any: ...


class TrialWatch(Callback):
    """Watches a trial's epochs: stops it when the loss or the objective is no longer
    finite (divergence), else reports the objective to ``decide(step, value)`` and stops
    it when that answers True (pruned). Every rank of a block sees the same all-reduced
    logs, so every rank decides alike."""

    def __init__(self, objective: str, decide: Callable[[int, float], bool],
                 fold: int | None = None, trial: int | None = None):
        self.objective = objective
        self.decide = decide
        self.fold = fold
        self.trial = trial  # the trial's number (a train function may name its outputs)
        self.last: float | None = None
        self.outcome: tuple[str, str] | None = None
        self.logged: list[str] = []

    def on_epoch_end(self, trainer, epoch: int, logs: dict) -> None:
        self.logged = list(logs)
        loss, value = logs.get("loss"), logs.get(self.objective)
        self.last = value
        where = f"epoch {epoch + 1}" + (f" of fold {self.fold + 1}" if self.fold is not None
                                        else "")
        step = (self.fold or 0) * trainer.num_epochs + epoch  # the pruner's step
        bad = [f"{k}={v}" for k, v in (("loss", loss), (self.objective, value))
               if v is not None and not math.isfinite(v)]
        if bad:
            self.outcome = ("fail", f"diverged: {', '.join(bad)} after {where}")
        elif value is not None and self.decide(step, value):
            self.outcome = ("pruned", f"{self.objective}={value:.6g} after {where} is worse "
                            "than the median of earlier trials")
        if self.outcome is not None:
            trainer.stop_training = True
            trainer.stop_reason = self.outcome[1]


def _describe(exc: BaseException) -> str:
    from ..run.errors import TrainingDiverged
    if isinstance(exc, TrainingDiverged) and exc.error is not None:
        exc = exc.error  # the run's one-line message names the command's options
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    if isinstance(exc, FloatingPointError):  # the Trainer's NonFiniteLossError
        return f"diverged: {first}"
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def execute_trial(assignment: dict[str, Any], comm, settings: SearchSettings,
                  train_fn: TrainFn, decide: Callable[[int, float], bool],
                  renew: Callable[[], Any] | None = None,
                  inspector=None) -> dict[str, Any]:
    """Train one candidate on ``comm`` (all folds); every rank returns the same result:
    number, state ("complete", "pruned" or "fail"), value, folds, message, start, end.

    A rank whose trial raises while the others may be waiting for it in a collective tells
    them so (``StallInspector.fail``, when ``inspector``, the one watching ``comm``, is
    interruptible and ``renew`` is given): their waits end with ``PeerFailed`` and every
    rank agrees on the result over ``renew()``, a new communicator of the block."""
    start = time.time()
    state, message, folds = "complete", None, []
    splittable = (renew is not None and inspector is not None
                  and getattr(inspector, "interruptible", False))
    broken = False
    try:
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            for fold in range(settings.n_fold):
                fold_or_none = fold if settings.n_fold > 1 else None
                watch = TrialWatch(settings.objective, decide, fold_or_none,
                                   assignment["number"])
                train_fn(dict(assignment["params"]), comm, fold_or_none, [watch])
                if watch.outcome is not None:
                    state, message = watch.outcome
                    break
                if watch.last is None:
                    raise ValueError(f"--objective {settings.objective!r} is not logged by "
                                     f"this run (logged: {', '.join(watch.logged) or 'none'})")
                folds.append(float(watch.last))
    except PeerFailed:  # another rank of the block failed and said so: it will not join
        state, broken = "peer failed", True
    except Exception as exc:  # noqa: BLE001 - a failing trial is a result, not a crash
        state, message = "fail", _describe(exc)
        if splittable and comm.size > 1:
            inspector.fail()
            broken = True
    if comm.size > 1:
        outcomes = None
        if not broken:
            try:
                outcomes = comm.allgather_obj((state, message))
            except PeerFailed:
                state, broken = "peer failed", True
        if broken:
            outcomes = renew().allgather_obj((state, message))
        for wanted in ("fail", "pruned"):
            found = [(r, o) for r, o in enumerate(outcomes) if o[0] == wanted]
            if found:
                rank, (state, message) = found[0]
                if any(o[0] != wanted for o in outcomes):
                    message = f"[block rank {rank}] {message}"
                break
        else:
            if state == "peer failed":  # (no rank says why: cannot happen, but never hang)
                state, message = "fail", "a rank of the block failed"
    end = time.time()
    value = float(np.mean(folds)) if state == "complete" else None
    return {"number": assignment["number"], "state": state, "value": value, "folds": folds,
            "message": message, "start": start, "end": end}


class Coordinator:
    """The optuna side of the loop: hands out trials (``assign``), answers epoch reports
    (``epoch``), records results (``done``) and saves the study.

    Args:
        study: a ``SearchStudy`` (or a plain optuna study, saved the slow way).
        space: the ``SearchSpace``.
        settings: the ``SearchSettings``.
        out: where the live lines go (default stdout).

    Attributes:
        records: a ``TrialRecord`` per trial finished in this run.
        loop_wall_s, loop_cpu_s: wall-clock and CPU time of this process while it handed
            out trials (with blocks: waiting, so the CPU time stays a small part).
    """

    def __init__(self, study, space, settings: SearchSettings, out: TextIO | None = None):
        if not isinstance(study, SearchStudy):
            study = SearchStudy(study)
        self.saver = study
        self.study = study.study
        self.space = space
        self.settings = settings
        self.out = out if out is not None else sys.stdout
        self.running: dict[int, Any] = {}
        trials = self.study.get_trials(deepcopy=False)
        self.finished = sum(t.state.is_finished() for t in trials)
        self.target = settings.num_trials
        if settings.sampler == "grid":
            self.target = min(self.target, space.grid_size())
        self._unsaved = 0
        self.records: list[TrialRecord] = []
        self.loop_wall_s = 0.0
        self.loop_cpu_s = 0.0

    @property
    def pending(self) -> int:
        """Trials still to hand out."""
        return max(0, self.target - self.finished - len(self.running))

    def assign(self, block: int) -> dict[str, Any] | None:
        """The next trial for ``block`` ({"number", "params"}), None when none is left."""
        if not self.pending:
            return None
        trial = self.study.ask()
        params = self.space.suggest(trial)
        trial.set_user_attr("block", block)
        self.running[trial.number] = trial
        return {"number": trial.number, "params": params}

    def epoch(self, number: int, step: int, value: float) -> bool:
        """Record an intermediate objective; True when the trial should be pruned."""
        trial = self.running[number]
        trial.report(float(value), step)
        return self.settings.pruner != "none" and trial.should_prune()

    def done(self, result: dict[str, Any], block: int) -> TrialRecord:
        """Tell optuna a trial's result and print its live line."""
        from optuna.trial import TrialState
        trial = self.running.pop(result["number"])
        seconds = result["end"] - result["start"]
        for key in ("start", "end", "folds", "message"):
            trial.set_user_attr(key, result[key])
        trial.set_user_attr("seconds", seconds)
        if result["state"] == "complete":
            self.study.tell(trial, result["value"])
        else:
            state = TrialState.PRUNED if result["state"] == "pruned" else TrialState.FAIL
            self.study.tell(trial, state=state)
        record = TrialRecord(number=trial.number, state=result["state"], params=trial.params,
                             value=result["value"], folds=result["folds"], block=block,
                             start=result["start"], end=result["end"], seconds=seconds,
                             message=result["message"])
        self.records.append(record)
        self.finished += 1
        self._unsaved += 1
        self.out.write(live_line(record, self.settings.objective) + "\n")
        self.out.flush()
        return record

    def checkpoint(self, force: bool = False) -> None:
        """Save the study every ``checkpoint_interval`` finished trials (or now)."""
        folder = self.settings.checkpoint
        if folder and (self._unsaved >= self.settings.checkpoint_interval
                       or (force and self._unsaved)):
            self.saver.save(folder)
            self._unsaved = 0


def _serve_block(layout: BlockLayout, settings: SearchSettings, train_fn: TrainFn) -> None:
    layout.watch()
    message: tuple = ("ready",)
    while True:
        comm = layout.comm  # a new one after a trial that failed on some ranks only
        assignment = layout.channel.request(message) if layout.is_leader else None
        lazy_barrier(comm)
        assignment = comm.bcast_obj(assignment, 0)
        if assignment is None:
            return
        number = assignment["number"]

        def decide(step: int, value: float, number=number, comm=comm) -> bool:
            answer = (layout.channel.request(("epoch", number, step, value))
                      if layout.is_leader else None)
            lazy_barrier(comm)
            return bool(comm.bcast_obj(answer, 0))

        message = ("done", execute_trial(assignment, comm, settings, train_fn, decide,
                                         layout.renew, layout.inspector))


def _coordinate(layout: BlockLayout, coordinator: Coordinator) -> None:
    for channel in layout.channels:
        channel.listen()
    active = set(range(layout.n_blocks))
    backoff = Backoff(POLL_S, min_sleep=POLL_S)
    while active:
        served = False
        for block in sorted(active):
            channel = layout.channels[block]
            if not channel.ready():
                continue
            served = True
            kind, *payload = channel.receive()
            if kind == "epoch":
                channel.reply(coordinator.epoch(*payload))
                channel.listen()
                continue
            if kind == "done":
                coordinator.done(payload[0], block)
            reply = coordinator.assign(block)
            channel.reply(reply)
            if reply is None:
                active.discard(block)
            else:
                channel.listen()
            coordinator.checkpoint()
        if not served:
            backoff.pause()


def _run_sequential(coordinator: Coordinator, comm, settings: SearchSettings,
                    train_fn: TrainFn) -> None:
    while (assignment := coordinator.assign(0)) is not None:
        number = assignment["number"]
        result = execute_trial(assignment, comm, settings, train_fn,
                               lambda step, value, n=number: coordinator.epoch(n, step, value))
        coordinator.done(result, 0)
        coordinator.checkpoint()


def run_search(world, settings: SearchSettings, space, train_fn: TrainFn, *, study=None,
               out: TextIO | None = None,
               finalize: Callable[[Coordinator], None] | None = None) -> Coordinator | None:
    """Run a search on ``world`` (collective: every rank calls it).

    Args:
        world: the communicator of all ranks: rank 0 coordinates, the others form blocks
            of ``settings.block_size`` ranks (a single process runs trials itself).
        settings: ``SearchSettings``.
        space: the ``SearchSpace``.
        train_fn: trains one candidate on a block (see ``TrainFn``).
        study: the ``SearchStudy`` or optuna study (coordinator only; ignored elsewhere).
        out: where the coordinator prints the live lines.
        finalize: called on the coordinator after the last trial (e.g. to write reports),
            while the other ranks wait without spinning.

    Returns:
        the ``Coordinator`` on world rank 0, None on the other ranks.

    Raises:
        LayoutError: the ranks do not split into 1 + blocks (on every rank, before
            anything starts).
    """
    block_count(world.size, settings.block_size)
    layout = BlockLayout(world, settings.block_size)
    coordinator = None
    if layout.is_coordinator:
        if study is None:
            raise ValueError("run_search needs the study on the coordinator (world rank 0)")
        coordinator = Coordinator(study, space, settings, out)
        wall, cpu = time.perf_counter(), time.process_time()
        if layout.sequential:
            _run_sequential(coordinator, world, settings, train_fn)
        else:
            _coordinate(layout, coordinator)
        coordinator.loop_wall_s = time.perf_counter() - wall
        coordinator.loop_cpu_s = time.process_time() - cpu
        coordinator.checkpoint(force=True)
        if finalize is not None:
            finalize(coordinator)
    else:
        _serve_block(layout, settings, train_fn)
    lazy_barrier(world)
    return coordinator
