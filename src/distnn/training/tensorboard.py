"""``TensorBoard``: a callback that writes a run's curves as TensorBoard event files, like
Keras's ``TensorBoard`` callback or PyTorch's ``SummaryWriter`` (written with tensorboardX,
the optional ``tensorboard`` extra: ``pip install 'distnn[tensorboard]'``).

Rank 0 writes; the other ranks only take part in the few collectives (opening the writers
agrees on an error; each epoch gathers every rank's communication counters). Layout of
``log_dir`` (Keras's): ``train/`` and ``validation/`` runs, so TensorBoard draws the
training and validation values of a metric on one chart; the x axis is the global step
(optimizer updates), also for the per-epoch values (at the step that ended the epoch), so
a resumed run continues the same curves: its writers start with ``purge_step`` = the
checkpoint's global step + 1, and TensorBoard hides whatever an interrupted run wrote
after the checkpoint.

Tags (``train/``): ``batch/loss``, ``batch/<metric>`` (the mean over rank 0's samples since
the last point or the epoch's start), ``batch/lr``, ``batch/samples_per_s`` every ``every``
global steps; ``comm/wait_ms``, ``comm/bytes``, ``comm/messages`` per step (the training rule's
counters on rank 0: all-reduce or point-to-point); ``epoch/<key>`` for every logged key
of the epoch (``validation/epoch/<key>`` for the ``val_`` ones), ``comm/epoch_wait_s/rank<r>``
and ``comm/epoch_mb/rank<r>`` for every rank; the text ``options``. With ``hparams``, the
``log_dir`` run carries TensorBoard's HParams session and ``hparams/<key>`` metrics.
"""
from __future__ import annotations

import math
import os
import time
from typing import Any

from ..distributed.coordination import on_ranks
from .callback_base import Callback

__all__ = ["TensorBoard", "INSTALL", "tensorboard_missing"]

INSTALL = "pip install 'distnn[tensorboard]' (or: pip install tensorboardX)"


def tensorboard_missing() -> str | None:
    """Why event files cannot be written here (the writer library is not installed), or
    None when they can."""
    try:
        import tensorboardX  # noqa: F401
    except ImportError:
        return f"writing TensorBoard event files needs tensorboardX: {INSTALL}"
    return None


def _scalar(value) -> float | None:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def options_markdown(options: dict[str, Any]) -> str:
    """A two-column markdown table of ``options`` (TensorBoard's text view renders it)."""
    rows = ["| option | value |", "|---|---|"]
    for key, value in options.items():
        if isinstance(value, (list, tuple)):
            value = ",".join(map(str, value))
        rows.append(f"| {key} | {value} |")
    return "\n".join(rows)


class TensorBoard(Callback):
    """Write loss, metrics, learning rate, throughput and communication as TensorBoard
    event files (rank 0; see the module doc for the tags).

    Args:
        log_dir: folder of the run (``train/``, ``validation/`` are made under it).
        every: write the per-step scalars every this many steps (0: only per epoch).
        options: the run's settings, written once as the text ``options``.
        hparams: this run's hyper-parameters (str, bool, int or float values), shown in
            TensorBoard's HParams view with the epoch's values as ``hparams/<key>``.
        flush_secs: seconds between flushes to disk (and at every epoch end).

    Example:
        trainer = Trainer(model, opt, callbacks=[TensorBoard("runs/lenet", every=10)])
        # tensorboard --logdir runs
    """

    checkpointed = False  # keeps no state: a resume may add or drop it

    def __init__(self, log_dir: str | os.PathLike, every: int = 10,
                 options: dict[str, Any] | None = None, hparams: dict[str, Any] | None = None,
                 flush_secs: float = 10.0):
        if isinstance(every, bool) or int(every) != every or every < 0:
            raise ValueError(f"tensorboard every must be an integer >= 0 (0: per epoch only), "
                             f"got {every!r}")
        self.log_dir = os.fspath(log_dir)
        self.every = int(every)
        self.options = dict(options or {})
        self.hparams = {k: v for k, v in (hparams or {}).items() if v is not None}
        self.flush_secs = float(flush_secs)
        self._writers: dict[str, Any] = {}

    # -- writers --------------------------------------------------------------------------
    def _open(self, step: int) -> None:
        from tensorboardX import SummaryWriter
        # A resumed run: whatever an earlier run wrote after the checkpoint's step is hidden.
        purge = step + 1 if step > 0 else None
        os.makedirs(self.log_dir, exist_ok=True)
        names = {"train": "train", "validation": "validation"}
        if self.hparams:
            names["root"] = ""
        for key, sub in names.items():
            self._writers[key] = SummaryWriter(os.path.join(self.log_dir, sub),
                                               purge_step=purge, flush_secs=self.flush_secs)

    def _add(self, run: str, tag: str, value, step: int) -> None:
        value = _scalar(value)
        if value is not None and run in self._writers:
            self._writers[run].add_scalar(tag, value, step)

    def on_train_begin(self, trainer) -> None:
        self._root = trainer.comm.rank == 0
        missing = tensorboard_missing() if self._root else None

        def open_writers():
            if missing:
                raise ImportError(missing)
            self._open(trainer.global_step)

        # An error on rank 0 (no tensorboardX, a folder that cannot be made) on every rank.
        on_ranks(trainer.comm, open_writers, root=0, catch=(ImportError, OSError))
        self._reset_interval(trainer)
        self._epoch_stats = trainer.rule.stats()
        if not self._root:
            return
        step = trainer.global_step
        if self.options:
            self._writers["train"].add_text("options", options_markdown(self.options), step)
        if self.hparams:
            from tensorboardX.summary import hparams
            metrics = {f"hparams/{k}": 0.0 for k in trainer.log_keys
                       if k not in ("time", "samples_per_s", "lr")}
            exp, ssi, self._sei = hparams(self.hparams, metrics)
            for summary in (exp, ssi):
                self._writers["root"].file_writer.add_summary(summary, step)

    def _reset_interval(self, trainer) -> None:
        self._t = time.perf_counter()
        self._steps = 0
        self._samples = 0
        self._local = 0
        self._stats = trainer.rule.stats()

    def on_epoch_begin(self, trainer, epoch: int) -> None:
        self._reset_interval(trainer)
        self._seen: dict[str, float] = {}
        self._seen_count = 0

    def on_batch_end(self, trainer, step: int, logs: dict) -> None:
        if not self._root:
            return
        self._steps += 1
        self._samples += getattr(trainer, "batch_global_size", trainer.global_batch_size)
        # ``logs`` are rank 0's means over the epoch so far: keep sums to get the means over
        # the steps since the last point.
        self._local += getattr(trainer, "batch_samples", 0)
        if not self.every or (step + 1) % self.every:
            return
        self._write_interval(trainer, step + 1, logs)

    def _write_interval(self, trainer, step: int, logs: dict) -> None:
        count = self._seen_count + self._local
        if self._local:
            for key, mean in logs.items():
                total = mean * count
                if self._seen_count:
                    total -= self._seen.get(key, 0.0) * self._seen_count
                self._add("train", f"batch/{key}", total / self._local, step)
        self._seen, self._seen_count = dict(logs), count
        elapsed = time.perf_counter() - self._t
        self._add("train", "batch/lr", trainer.optimizer.lr, step)
        if elapsed > 0:
            self._add("train", "batch/samples_per_s", self._samples / elapsed, step)
        self._write_comm(trainer, step)
        self._t, self._steps, self._samples, self._local = time.perf_counter(), 0, 0, 0

    def _write_comm(self, trainer, step: int) -> None:
        now = trainer.rule.stats()
        steps = max(self._steps, 1)
        if now and trainer.comm.size > 1:  # one process communicates nothing
            before = self._stats
            self._add("train", "comm/wait_ms", 1e3 * (now.get("wait_s", 0.0)
                                                      - before.get("wait_s", 0.0)) / steps, step)
            for key in ("bytes", "messages"):
                self._add("train", f"comm/{key}", (now.get(key, 0.0) - before.get(key, 0.0))
                          / steps, step)
        self._stats = now

    def on_epoch_end(self, trainer, epoch: int, logs: dict) -> None:
        # Collective: every rank's counters of this epoch.
        now = trainer.rule.stats()
        before, self._epoch_stats = self._epoch_stats, now
        mine = {k: now.get(k, 0.0) - before.get(k, 0.0) for k in ("wait_s", "bytes")} \
            if now else {}
        ranks = trainer.comm.allgather_obj(mine) if trainer.comm.size > 1 else [mine]
        if not self._root:
            return
        step = trainer.global_step
        if self._steps == 0 and not self._seen_count:
            self._steps = trainer.steps_per_epoch  # rank 0 trained nothing (a master)
        if self._steps:  # the steps no per-step point covered
            self._write_comm(trainer, step)
        for key, value in logs.items():
            if key == "epoch":
                continue
            if key.startswith("val_"):
                self._add("validation", f"epoch/{key[4:]}", value, step)
            else:
                self._add("train", f"epoch/{key}", value, step)
            if self.hparams and key not in ("time", "samples_per_s", "lr"):
                self._add("root", f"hparams/{key}", value, step)
        for r, counters in enumerate(ranks):
            if counters and len(ranks) > 1:
                self._add("train", f"comm/epoch_wait_s/rank{r}", counters["wait_s"], step)
                self._add("train", f"comm/epoch_mb/rank{r}", counters["bytes"] / 2**20, step)
        for writer in self._writers.values():
            writer.flush()

    def on_train_end(self, trainer) -> None:
        self.close()

    def close(self) -> None:
        """Flush and close the event files (``fit`` does it at its end)."""
        if self._writers.get("root") is not None and getattr(self, "_sei", None) is not None:
            self._writers["root"].file_writer.add_summary(self._sei)
        for writer in self._writers.values():
            writer.close()
        self._writers = {}
