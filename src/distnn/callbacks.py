"""Callbacks and learning-rate schedulers for ``distnn.train.Trainer``.

A callback sees the trainer at fixed points of the loop (``on_train_begin``,
``on_epoch_begin``, ``on_batch_begin``, ``on_batch_end``, ``on_epoch_end``,
``on_train_end``). Epoch logs are already all-reduced over the ranks when a callback sees
them, so every rank takes the same decision (stop, change the learning rate) without any
extra communication. Callbacks that keep state return it from ``state_dict()`` so a
checkpoint can resume them.

Learning rates: ``trainer.lr`` is the *scheduled* rate (what plateau/step schedules
change); before every batch the trainer sets ``optimizer.lr = trainer.lr`` and then
``WarmUp`` may scale it down for the first steps.

NNLO's string syntax is accepted by ``parse_early_stopping`` ("val_loss,~<,4") and
``parse_target_metric`` ("val_acc,>,0.97").
"""
from __future__ import annotations

import math
import os
from typing import Any, Sequence

import numpy as np

__all__ = [
    "Callback", "WarmUp", "EarlyStopping", "ReduceLROnPlateau", "ReduceLREveryNEpochs",
    "ModelCheckpoint", "TargetMetric", "TrainingCheckpoint", "CALLBACKS",
    "parse_early_stopping", "parse_target_metric", "resolve_key", "metric_mode",
]

# Other spellings of the keys the trainer logs ("loss", "accuracy", "val_loss", ...):
# PyDTNN names the loss after its function, NNLO and Keras 2 abbreviate accuracy.
_ALIASES = {
    "acc": "accuracy", "categorical_accuracy": "accuracy",
    "categorical_cross_entropy": "loss", "binary_cross_entropy": "loss",
    "cross_entropy": "loss", "categorical_crossentropy": "loss", "negative_likelihood": "loss",
    "nll": "loss", "top5_accuracy": "top5", "top_5": "top5",
}
_MAXIMIZED = ("accuracy", "top5", "acc")


def resolve_key(name: str, keys: Sequence[str]) -> str:
    """The log key ``name`` refers to, accepting aliases ("val_acc" -> "val_accuracy").

    Raises:
        ValueError: naming the metric and the keys the run logs.
    """
    if name in keys:
        return name
    prefix = "val_" if name.startswith("val_") else ""
    base = name[len(prefix):]
    key = prefix + _ALIASES.get(base, base)
    if key in keys:
        return key
    raise ValueError(f"metric {name!r} is not logged by this run; it logs {sorted(keys)} "
                     "(validation keys need validation data: --validation_split or "
                     "--test_as_validation)")


def metric_mode(name: str, mode: str = "auto") -> str:
    """'min' or 'max': whether ``name`` improves downwards; "auto" maximizes accuracies."""
    if mode not in ("auto", "min", "max"):
        raise ValueError(f"mode must be 'auto', 'min' or 'max', got {mode!r}")
    if mode != "auto":
        return mode
    base = name[4:] if name.startswith("val_") else name
    base = _ALIASES.get(base, base)
    return "max" if base in _MAXIMIZED else "min"


class Callback:
    """Base class: override the hooks you need. ``trainer`` is a ``distnn.train.Trainer``
    (callbacks use ``lr``, ``optimizer``, ``model``, ``stop_training``, ``stop_reason``,
    ``log_keys``, ``steps_per_epoch``, ``print``)."""

    def on_train_begin(self, trainer) -> None: ...
    def on_epoch_begin(self, trainer, epoch: int) -> None: ...
    def on_batch_begin(self, trainer, step: int) -> None: ...
    def on_batch_end(self, trainer, step: int, logs: dict) -> None: ...
    def on_epoch_end(self, trainer, epoch: int, logs: dict) -> None: ...
    def on_train_end(self, trainer) -> None: ...

    def state_dict(self) -> dict[str, Any]:
        """JSON-able state to resume from (arrays allowed too)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


def _check_positive(name, value, allow_zero=False):
    if value is None or not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        rule = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be {rule}, got {value!r}")


class WarmUp(Callback):
    """Linear learning-rate warm-up over the first steps (Goyal et al., 2017).

    Args:
        epochs: warm-up length in epochs (converted with the trainer's steps per epoch).
        batches: warm-up length in batches (used when given, instead of ``epochs``).
        start_factor: the fraction of the scheduled rate the first step uses; the rate
            then grows linearly to the full rate at the last warm-up step. The default 0
            makes step i use lr * (i + 1) / steps.

    Example:
        WarmUp(epochs=5, start_factor=1 / comm.size)  # lr -> lr*size (learning_rate_scaling)
    """

    def __init__(self, epochs: float = 0, batches: int = 0, start_factor: float = 0.0):
        _check_positive("warm_up_epochs", epochs, allow_zero=True)
        _check_positive("warm_up_batches", batches, allow_zero=True)
        if not 0.0 <= start_factor <= 1.0:
            raise ValueError(f"warm-up start_factor must be in [0, 1], got {start_factor!r}")
        self.epochs, self.batches, self.start_factor = epochs, int(batches), float(start_factor)
        self.total = 0

    def on_train_begin(self, trainer):
        self.total = self.batches or int(round(self.epochs * trainer.steps_per_epoch))

    def factor(self, step: int) -> float:
        if step >= self.total:
            return 1.0
        return self.start_factor + (1.0 - self.start_factor) * (step + 1) / self.total

    def on_batch_begin(self, trainer, step):
        if step < self.total:
            trainer.optimizer.lr = trainer.lr * self.factor(step)


class _Monitor(Callback):
    """Tracks the best value of one logged metric."""

    def __init__(self, monitor: str, mode: str, min_delta: float):
        if not isinstance(monitor, str) or not monitor:
            raise ValueError(f"monitor must be a metric name like 'val_loss', got {monitor!r}")
        _check_positive("min_delta", abs(min_delta), allow_zero=True)
        self.monitor = monitor
        self.mode = metric_mode(monitor, mode)
        self.min_delta = abs(float(min_delta))
        self.key = monitor
        self.best: float | None = None
        self.best_epoch = -1
        self.wait = 0

    def on_train_begin(self, trainer):
        self.key = resolve_key(self.monitor, trainer.log_keys)

    def better(self, value: float, reference: float | None) -> bool:
        if reference is None:
            return True
        if self.mode == "min":
            return value < reference - self.min_delta
        return value > reference + self.min_delta

    def _value(self, logs: dict) -> float | None:
        value = logs.get(self.key)
        return None if value is None or not math.isfinite(value) else float(value)

    def state_dict(self):
        return {"best": self.best, "best_epoch": self.best_epoch, "wait": self.wait}

    def load_state_dict(self, state):
        self.best, self.best_epoch, self.wait = state["best"], state["best_epoch"], state["wait"]


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


class ReduceLROnPlateau(_Monitor):
    """Multiply the learning rate by ``factor`` when a metric stops improving.

    Args:
        monitor: logged key to watch.
        factor: new_lr = lr * factor, in (0, 1).
        patience: epochs without improvement before a reduction.
        min_lr: lower bound of the learning rate.
        min_delta: an improvement must beat the best by more than this.
        cooldown: epochs to wait after a reduction before counting again.
        mode: "min", "max" or "auto".
    """

    def __init__(self, monitor: str = "val_loss", factor: float = 0.1, patience: int = 5,
                 min_lr: float = 0.0, min_delta: float = 1e-4, cooldown: int = 0,
                 mode: str = "auto"):
        super().__init__(monitor, mode, min_delta)
        if not 0.0 < factor < 1.0:
            raise ValueError(f"reduce_lr_on_plateau factor must be in (0, 1), got {factor!r}")
        if int(patience) != patience or patience < 1:
            raise ValueError(f"reduce_lr_on_plateau patience must be an integer >= 1, "
                             f"got {patience!r}")
        _check_positive("reduce_lr_on_plateau min_lr", min_lr, allow_zero=True)
        self.factor, self.patience, self.min_lr = float(factor), int(patience), float(min_lr)
        self.cooldown, self.cooldown_left = int(cooldown), 0

    def on_epoch_end(self, trainer, epoch, logs):
        value = self._value(logs)
        if value is None:
            return
        if self.cooldown_left > 0:
            self.cooldown_left -= 1
            self.wait = 0
        if self.better(value, self.best):
            self.best, self.best_epoch, self.wait = value, epoch, 0
            return
        if self.cooldown_left > 0:
            return
        self.wait += 1
        if self.wait >= self.patience and trainer.lr > self.min_lr:
            new = max(trainer.lr * self.factor, self.min_lr)
            trainer.print(f"reduce_lr_on_plateau: {self.key} has not improved for {self.wait} "
                          f"epochs; learning rate {trainer.lr:.4g} -> {new:.4g}")
            trainer.lr = new
            self.wait, self.cooldown_left = 0, self.cooldown

    def state_dict(self):
        return {**super().state_dict(), "cooldown_left": self.cooldown_left}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.cooldown_left = state["cooldown_left"]


class ReduceLREveryNEpochs(Callback):
    """Step schedule: every ``nepochs`` epochs, lr = max(lr * factor, min_lr).

    Args:
        nepochs: period in epochs.
        factor: multiplier in (0, 1].
        min_lr: lower bound.
    """

    def __init__(self, nepochs: int = 5, factor: float = 0.1, min_lr: float = 0.0):
        if int(nepochs) != nepochs or nepochs < 1:
            raise ValueError(f"reduce_lr_every_nepochs nepochs must be an integer >= 1, "
                             f"got {nepochs!r}")
        if not 0.0 < factor <= 1.0:
            raise ValueError(f"reduce_lr_every_nepochs factor must be in (0, 1], got {factor!r}")
        _check_positive("reduce_lr_every_nepochs min_lr", min_lr, allow_zero=True)
        self.nepochs, self.factor, self.min_lr = int(nepochs), float(factor), float(min_lr)

    def on_epoch_end(self, trainer, epoch, logs):
        if (epoch + 1) % self.nepochs == 0:
            trainer.lr = max(trainer.lr * self.factor, self.min_lr)


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

    def on_epoch_end(self, trainer, epoch, logs):
        if (epoch + 1) % self.save_freq:
            return
        if self.save_best_only:
            value = self._value(logs)
            if value is None or not self.better(value, self.best):
                return
            self.best, self.best_epoch = value, epoch
        path = self.filepath.format(epoch=epoch + 1, **logs)
        if trainer.comm.rank == 0:
            trainer.model.save_weights(path)
        self.saved.append(path)

    def state_dict(self):
        return {**super().state_dict(), "saved": list(self.saved)}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.saved = list(state["saved"])


class TrainingCheckpoint(Callback):
    """Write the full training state (``distnn.checkpoint``) every ``every`` epochs so the
    run can continue with ``Trainer.fit(resume=path)`` / ``distnn train --resume``.

    Collective: every rank takes part (RNG states are gathered), rank 0 writes atomically.
    """

    def __init__(self, path: str, every: int = 1):
        if int(every) != every or every < 1:
            raise ValueError(f"checkpoint_freq must be an integer >= 1, got {every!r}")
        if not path:
            raise ValueError("checkpoint needs a file path, got an empty one")
        self.path, self.every = os.fspath(path), int(every)

    def on_epoch_end(self, trainer, epoch, logs):
        # The trainer calls this after the other callbacks so their state is current.
        last = trainer.stop_training or epoch + 1 == trainer.num_epochs
        if (epoch + 1) % self.every == 0 or last:
            from .checkpoint import save_checkpoint
            save_checkpoint(self.path, trainer, epochs_done=epoch + 1)


CALLBACKS: dict[str, type[Callback]] = {
    "warm_up": WarmUp,
    "early_stopping": EarlyStopping,
    "reduce_lr_on_plateau": ReduceLROnPlateau,
    "reduce_lr_every_nepochs": ReduceLREveryNEpochs,
    "stop_at_loss": TargetMetric,
    "model_checkpoint": ModelCheckpoint,
}


def _split_spec(spec: str, option: str, example: str) -> tuple[str, str, str]:
    parts = [p.strip() for p in str(spec).split(",")]
    if len(parts) != 3 or not all(parts):
        raise ValueError(f"{option} must be 'metric,op,value' like {example!r}, got {spec!r}")
    return parts[0], parts[1], parts[2]


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
    try:
        patience = int(value)
    except ValueError:
        raise ValueError(f"--early_stopping patience must be an integer, got {value!r} in "
                         f"{spec!r}") from None
    return EarlyStopping(metric, patience=patience, mode=modes[direction], smoothed=smoothed,
                         **kwargs)


def parse_target_metric(spec: str) -> TargetMetric:
    """NNLO's ``--target-metric "metric,op,value"``, e.g. "val_acc,>,0.97"."""
    metric, op, value = _split_spec(spec, "--target_metric", "val_acc,>,0.97")
    if op not in TargetMetric.OPS:
        raise ValueError(f"--target_metric operator must be one of {sorted(TargetMetric.OPS)}, "
                         f"got {op!r} in {spec!r}")
    try:
        threshold = float(value)
    except ValueError:
        raise ValueError(f"--target_metric value must be a number, got {value!r} in "
                         f"{spec!r}") from None
    return TargetMetric(metric, op, threshold)
