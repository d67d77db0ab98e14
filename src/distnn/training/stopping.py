"""Callbacks that end or save a run: ``EarlyStopping``, ``TargetMetric``,
``ModelCheckpoint`` (weights) and ``TrainingCheckpoint`` (full state), and NNLO's string
syntax for the first two (``parse_early_stopping``, ``parse_target_metric``).
"""
from __future__ import annotations

import os
import sys

import numpy as np

from ..distributed.coordination import on_ranks
from ..fileio import WriteError, guarded_write
from .callback_base import Callback, _Monitor, resolve_key


class EarlyStopping(_Monitor):
    """Stop training when a monitored metric stops improving.

    Args:
        monitor: logged key ("val_loss", "val_accuracy"; aliases like "val_acc" work).
        patience: epochs without improvement after which training stops.
        min_delta: an improvement must beat the reference by more than this.
        mode: "min", "max" or "auto" (accuracies are maximized).
        restore_best_weights: at the end of training, put back the parameters and buffers
            of the best epoch (when that is not the last one).
        smoothed: NNLO's "~" rule: stop when the mean of the last ``patience`` epochs is not
            better than the mean of the ``patience`` epochs before them (needs 2*patience
            epochs). Otherwise the Keras rule: ``patience`` epochs in a row that do not
            beat the best value so far.

    Example:
        EarlyStopping("val_loss", patience=4, smoothed=True)  # NNLO "val_loss,~<,4"
    """

    def __init__(self, monitor: str = "val_loss", patience: int = 10, min_delta: float = 0.0,
                 mode: str = "auto", restore_best_weights: bool = False, smoothed: bool = False):
        super().__init__(monitor, mode, min_delta)
        if int(patience) != patience or patience < 1:
            raise ValueError(f"early stopping patience must be an integer >= 1, got {patience!r}")
        self.patience = int(patience)
        self.restore_best_weights = bool(restore_best_weights)
        self.smoothed = bool(smoothed)
        self.values: list[float] = []
        self.stopped_epoch = -1
        self._best_state: tuple[np.ndarray, dict[str, np.ndarray]] | None = None

    def on_epoch_end(self, trainer, epoch, logs):
        value = self._value(logs)
        if value is None:
            return
        self.values.append(value)
        if self.better(value, self.best):
            self.best, self.best_epoch, self.wait = value, epoch, 0
            if self.restore_best_weights:
                self._best_state = _snapshot(trainer.model)
        else:
            self.wait += 1
        if self.smoothed:
            p = self.patience
            if len(self.values) < 2 * p:
                return
            now = float(np.mean(self.values[-p:]))
            then = float(np.mean(self.values[-2 * p:-p]))
            stop = not self.better(now, then)
            why = (f"mean {self.key} of the last {p} epochs ({now:.6g}) is not better than "
                   f"the {p} before ({then:.6g})")
        else:
            stop = self.wait >= self.patience
            why = (f"{self.key} has not improved on {self.best:.6g} (epoch {self.best_epoch + 1}) "
                   f"for {self.wait} epochs")
        if stop:
            self.stopped_epoch = epoch
            trainer.stop_training = True
            trainer.stop_reason = f"early stopping: {why}"

    def on_train_end(self, trainer):
        if self._best_state is not None and self.best_epoch != trainer.epoch:
            _restore(trainer.model, self._best_state)
            trainer.print(f"early stopping: restored the weights of epoch {self.best_epoch + 1} "
                          f"({self.key}={self.best:.6g})")

    def state_dict(self):
        state = {**super().state_dict(), "values": list(self.values),
                 "stopped_epoch": self.stopped_epoch}
        if self._best_state is not None:
            state["best_params"], state["best_buffers"] = self._best_state
        return state

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.values = [float(v) for v in state["values"]]
        self.stopped_epoch = state["stopped_epoch"]
        if "best_params" in state:
            self._best_state = (np.array(state["best_params"]),
                                {k: np.array(v) for k, v in state["best_buffers"].items()})


def _snapshot(model) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    buffers = {f"{layer.name}/{k}": np.array(v, copy=True)
               for layer in model.walk() for k, v in layer.buffers.items()}
    return model.parameters_flat().copy(), buffers


def _restore(model, state) -> None:
    params, buffers = state
    model.parameters_flat()[...] = params
    arrays = model.named_arrays()
    for key, value in buffers.items():
        arrays[key][...] = value


class TargetMetric(Callback):
    """Stop as soon as a metric reaches a target (NNLO ``--target-metric``, PyDTNN
    ``stop_at_loss``).

    Args:
        monitor: logged key, e.g. "val_accuracy" ("val_acc" works).
        op: one of ">", ">=", "<", "<=": stop when ``value op threshold``.
        threshold: the target.

    Example:
        TargetMetric("val_acc", ">", 0.97)
    """

    OPS = {">": np.greater, ">=": np.greater_equal, "<": np.less, "<=": np.less_equal}

    def __init__(self, monitor: str = "val_accuracy", op: str = ">", threshold: float = 0.0):
        if op not in self.OPS:
            raise ValueError(f"target metric operator must be one of {sorted(self.OPS)}, "
                             f"got {op!r}")
        if not isinstance(monitor, str) or not monitor:
            raise ValueError(f"target metric must name a metric like 'val_acc', got {monitor!r}")
        self.monitor, self.op, self.threshold = monitor, op, float(threshold)
        self.key = monitor
        self.reached_epoch = -1

    def on_train_begin(self, trainer):
        self.key = resolve_key(self.monitor, trainer.log_keys)

    def on_epoch_end(self, trainer, epoch, logs):
        value = logs.get(self.key)
        if value is not None and bool(self.OPS[self.op](value, self.threshold)):
            self.reached_epoch = epoch
            trainer.stop_training = True
            trainer.stop_reason = (f"target reached: {self.key}={value:.6g} {self.op} "
                                   f"{self.threshold:g}")


class ModelCheckpoint(_Monitor):
    """Save the model's weights (``Sequential.save_weights``, .npz) during training.

    Only rank 0 writes (the replicas are identical); the write is atomic.

    Args:
        filepath: target file; may contain ``{epoch}`` (1-based) and any logged key, e.g.
            "ckpt/simplecnn-{epoch:03d}-{val_loss:.3f}.npz".
        monitor: key compared when ``save_best_only``.
        save_freq: save every this many epochs.
        save_best_only: save only when ``monitor`` improved on the best so far.
        mode: "min", "max" or "auto".
    """

    def __init__(self, filepath: str, monitor: str = "val_loss", save_freq: int = 1,
                 save_best_only: bool = False, mode: str = "auto"):
        super().__init__(monitor, mode, 0.0)
        if int(save_freq) != save_freq or save_freq < 1:
            raise ValueError(f"model_checkpoint save_freq must be an integer >= 1, "
                             f"got {save_freq!r}")
        if not filepath:
            raise ValueError("model_checkpoint needs a file path, got an empty one")
        self.filepath, self.save_freq = os.fspath(filepath), int(save_freq)
        self.save_best_only = bool(save_best_only)
        self.saved: list[str] = []

    def on_train_begin(self, trainer):
        if self.save_best_only:
            super().on_train_begin(trainer)
        self.file_for(0, {k: 0.0 for k in trainer.log_keys})  # a bad pattern fails now

    def file_for(self, epoch: int, logs: dict) -> str:
        """The file name of ``epoch`` (0-based) with ``logs`` filled in.

        Raises:
            ValueError: the pattern names a key the run does not log, or is malformed.
        """
        # The logs carry "epoch" too (1-based, as the history): one value, not two.
        values = {**logs, "epoch": epoch + 1}
        try:
            return self.filepath.format(**values)
        except KeyError as exc:
            raise ValueError(f"model_checkpoint file {self.filepath!r} uses {{{exc.args[0]}}}, "
                             f"which this run does not log; use {{epoch}} or one of "
                             f"{sorted(k for k in values if k != 'epoch')}") from None
        except (ValueError, IndexError) as exc:
            raise ValueError(f"model_checkpoint file {self.filepath!r} is not a valid "
                             f"pattern ({exc}); write e.g. 'weights-{{epoch:03d}}.npz'") from None

    def on_epoch_end(self, trainer, epoch, logs):
        if (epoch + 1) % self.save_freq:
            return
        if self.save_best_only:
            value = self._value(logs)
            if value is None or not self.better(value, self.best):
                return
            self.best, self.best_epoch = value, epoch
        path = self.file_for(epoch, logs)
        on_ranks(trainer.comm, lambda: guarded_write(
            path, lambda: trainer.model.save_weights(path), "model_checkpoint weights"),
            root=0, catch=WriteError)
        self.saved.append(path)

    def state_dict(self):
        return {**super().state_dict(), "saved": list(self.saved)}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.saved = list(state["saved"])


class TrainingCheckpoint(Callback):
    """Write the full training state (``distnn.checkpoint``) every ``every`` epochs (and,
    with ``steps``, every ``steps`` training steps) so the run can continue with
    ``Trainer.fit(resume=path)`` / ``distnn train --resume``.

    Collective: every rank takes part (RNG states are gathered), rank 0 writes atomically,
    keeping the file it replaces as the previous checkpoint (``ck.prev.npz``).
    A step checkpoint records the position in the epoch (batches done, partial metric
    sums); a resume skips those batches of the same shuffle, so it redoes at most ``steps``.

    A write that fails (a full disk, a quota, an I/O error) leaves no partial file and the
    previous checkpoints intact; every rank learns it (the error is agreed) and training
    goes on: rank 0 prints one warning line naming the file, the error, what to do and the
    last good checkpoint, and the next checkpoint tries again (a warning each time it
    fails). The last save of a run (after its last epoch, or when it stops early) is
    never given up silently: its failure raises ``WriteError`` on every rank, naming the
    last good checkpoint (``distnn train``: exit 2).

    Args:
        path: the checkpoint file (replaced atomically at every save).
        every: save every this many epochs (and after the last one).
        run: JSON-able settings of the run, stored in the checkpoint (``meta["run"]``).
        steps: also save every this many steps (0: only at epoch ends); needs a rule whose
            ranks take every step together (``Rule.lockstep``, e.g. data).
        per_node: the first rank of every node writes its node's copy (node-local disks).
    """

    def __init__(self, path: str, every: int = 1, run: dict | None = None, steps: int = 0,
                 per_node: bool = False):
        if int(every) != every or every < 1:
            raise ValueError(f"checkpoint_freq must be an integer >= 1, got {every!r}")
        if isinstance(steps, bool) or int(steps) != steps or steps < 0:
            raise ValueError(f"checkpoint_steps must be an integer >= 0, got {steps!r}")
        if not path:
            raise ValueError("checkpoint needs a file path, got an empty one")
        self.path, self.every, self.steps = os.fspath(path), int(every), int(steps)
        self.run = dict(run or {})
        self.per_node = bool(per_node)
        self.failures = 0          # writes failed in a row
        self.fresh = True
        self.last_good: str | None = None

    def on_train_begin(self, trainer):
        resumed = getattr(trainer, "resumed", None)
        self.failures = 0
        self.fresh = resumed is None  # its first write drops a ck.prev.npz of another run
        self.last_good = (f"{resumed.path} ({resumed.where()}, global step "
                          f"{resumed.global_step})" if resumed is not None else None)

    def on_batch_end(self, trainer, step, logs):
        if not self.steps or (step + 1) % self.steps:
            return
        done = trainer.epoch_step
        if done >= trainer.steps_per_epoch:
            return  # the epoch-end save follows, with the epoch's metrics
        self._save(trainer, False, epochs_done=trainer.epoch, epoch_step=done)

    def on_epoch_end(self, trainer, epoch, logs):
        # The trainer calls this after the other callbacks so their state is current.
        last = trainer.stop_training or epoch + 1 == trainer.num_epochs
        if (epoch + 1) % self.every == 0 or last:
            self._save(trainer, last, epochs_done=epoch + 1)

    def _save(self, trainer, last: bool, **where) -> None:
        from .checkpoint import save_checkpoint
        try:
            save_checkpoint(self.path, trainer, run=self.run, per_node=self.per_node,
                            keep_previous=not self.fresh, **where)
        except WriteError as exc:  # the same on every rank (agreed in save_checkpoint)
            self.failures += 1
            good = f"--resume {self.last_good}" if self.last_good else "none yet"
            if last:
                raise WriteError(exc.path, f"{exc.reason}; the last good checkpoint: {good}",
                                 exc.what) from None
            if trainer.comm.rank == 0:
                at = f"[rank {exc.rank} on host {exc.host}] " if self.per_node and \
                    getattr(exc, "host", None) else ""
                print(f"warning: {at}could not write checkpoint {exc.path!r} at global step "
                      f"{trainer.global_step}: {exc.reason}; training goes on and the next "
                      f"checkpoint tries again ({self.failures} failed in a row); the last "
                      f"good checkpoint: {good}", file=sys.stderr, flush=True)
            return
        self.failures, self.fresh = 0, False
        done, step = where["epochs_done"], where.get("epoch_step", 0)
        at = f"epoch {done + 1} step {step}" if step else f"epoch {done}"
        self.last_good = f"{self.path} ({at}, global step {trainer.global_step})"


class ProgressFile(Callback):
    """Rank 0 keeps ``path`` holding one line "global_step epoch epoch_step global_batch"
    after every step (one ``pwrite`` of 64 bytes, no rename), so a supervisor that sees
    the job die knows how far it got (``distnn launch``: the samples a restart redoes).

    Args:
        path: the file (created or truncated at the start of training).
    """

    def __init__(self, path: str):
        self.path, self.fd = os.fspath(path), None

    def on_train_begin(self, trainer):
        if trainer.comm.rank == 0:
            self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)

    def on_batch_end(self, trainer, step, logs):
        if self.fd is not None:
            line = (f"{trainer.global_step} {trainer.epoch} {trainer.epoch_step} "
                    f"{trainer.global_batch_size}")
            os.pwrite(self.fd, line.ljust(63).encode() + b"\n", 0)

    def on_train_end(self, trainer):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _split_spec(spec: str, option: str, example: str) -> tuple[str, str, str]:
    parts = [p.strip() for p in str(spec).split(",")]
    if len(parts) != 3 or not all(parts):
        raise ValueError(f"{option} must be 'metric,op,value' like {example!r}, got {spec!r}")
    return parts[0], parts[1], parts[2]


def _spec_value(convert, value: str, spec: str, must: str):
    """``convert(value)`` (the value field of ``spec``), else a ValueError that says
    ``must`` and what it got."""
    try:
        return convert(value)
    except ValueError:
        raise ValueError(f"{must}, got {value!r} in {spec!r}") from None


def parse_early_stopping(spec: str, **kwargs) -> EarlyStopping:
    """NNLO's ``--early-stopping "metric,op,patience"``.

    op is "<" (metric should decrease) or ">" (increase): stop after ``patience`` epochs
    without beating the best value; a leading "~" ("~<", "~>") compares the mean of the
    last ``patience`` epochs with the mean of the ``patience`` before them.

    Example:
        parse_early_stopping("val_loss,~<,4")
    """
    metric, op, value = _split_spec(spec, "--early_stopping", "val_loss,~<,4")
    smoothed = op.startswith("~")
    direction = op[1:] if smoothed else op
    modes = {"<": "min", ">": "max"}
    if direction not in modes:
        raise ValueError(f"--early_stopping operator must be '<', '>', '~<' or '~>', got {op!r} "
                         f"in {spec!r}")
    patience = _spec_value(int, value, spec, "--early_stopping patience must be an integer")
    return EarlyStopping(metric, patience=patience, mode=modes[direction], smoothed=smoothed,
                         **kwargs)


def parse_target_metric(spec: str) -> TargetMetric:
    """NNLO's ``--target-metric "metric,op,value"``, e.g. "val_acc,>,0.97"."""
    metric, op, value = _split_spec(spec, "--target_metric", "val_acc,>,0.97")
    if op not in TargetMetric.OPS:
        raise ValueError(f"--target_metric operator must be one of {sorted(TargetMetric.OPS)}, "
                         f"got {op!r} in {spec!r}")
    threshold = _spec_value(float, value, spec, "--target_metric value must be a number")
    return TargetMetric(metric, op, threshold)
