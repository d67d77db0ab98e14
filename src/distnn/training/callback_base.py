"""What every callback builds on: the ``Callback`` hooks, the names of logged metrics
(aliases, which way they improve) and ``_Monitor``, which tracks the best value of one
metric. The callbacks themselves are in ``callbacks`` (LR schedules) and ``stopping``.
"""
from __future__ import annotations

import math
from typing import Any, Sequence


# Other spellings of the keys the trainer logs ("loss", "accuracy", "val_loss", ...):
# PyDTNN names the loss after its function, NNLO and Keras 2 abbreviate accuracy.
_ALIASES = {
    "acc": "accuracy", "categorical_accuracy": "accuracy",
    "categorical_cross_entropy": "loss", "binary_cross_entropy": "loss",
    "cross_entropy": "loss", "categorical_crossentropy": "loss", "negative_likelihood": "loss",
    "nll": "loss", "top5_accuracy": "top5", "top_5": "top5", "ppl": "perplexity",
}
_MAXIMIZED = ("accuracy", "top5", "acc", "token_accuracy")


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
    import difflib
    logged = sorted(k for k in keys if k not in ("time", "samples_per_s"))
    close = difflib.get_close_matches(name, logged, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    if prefix and not any(k.startswith("val_") for k in keys):
        hint += ("validation keys need validation data (--validation_split or "
                 "--test_as_validation); ")
    raise ValueError(f"metric {name!r} is not logged by this run; {hint}it logs "
                     f"{', '.join(logged)}")


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
    ``log_keys``, ``steps_per_epoch``, ``print``).

    ``checkpointed = False`` on a subclass that keeps no state (an event-file writer): a
    resumed run may then add or drop it, as it may a ``TrainingCheckpoint``."""

    checkpointed = True

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
