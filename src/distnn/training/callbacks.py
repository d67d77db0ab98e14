"""Callbacks and learning-rate schedulers for ``distnn.train.Trainer``.

A callback sees the trainer at fixed points of the loop (``on_train_begin``,
``on_epoch_begin``, ``on_batch_begin``, ``on_batch_end``, ``on_epoch_end``,
``on_train_end``). Epoch logs are already all-reduced over the ranks when a callback sees
them, so every rank takes the same decision (stop, change the learning rate) without any
extra communication. Callbacks that keep state return it from ``state_dict()`` so a
checkpoint can resume them.

Learning rates: the optimizer owns the rate and the schedules are its clients. The
plateau/step schedules read and set ``optimizer.scheduled_lr`` (what a checkpoint keeps);
``WarmUp`` and ``CosineDecay`` set ``optimizer.lr_scale`` before every batch (one of them
per run: the factor has one writer); a step uses ``optimizer.lr``, their product.
``trainer.lr`` reads the scheduled rate.

NNLO's string syntax is accepted by ``parse_early_stopping`` ("val_loss,~<,4") and
``parse_target_metric`` ("val_acc,>,0.97").

The base class and the metric names are in ``callback_base``, the stopping and checkpoint
callbacks in ``stopping``; everything is importable from here.
"""
from __future__ import annotations

from .callback_base import (_ALIASES, Callback, _check_positive, _Monitor,  # noqa: F401
                            metric_mode, resolve_key)
from .stopping import (EarlyStopping, ModelCheckpoint, ProgressFile, TargetMetric,
                       TrainingCheckpoint, parse_early_stopping, parse_target_metric)


__all__ = [
    "Callback", "WarmUp", "CosineDecay", "EarlyStopping", "ReduceLROnPlateau",
    "ReduceLREveryNEpochs",
    "ModelCheckpoint", "TargetMetric", "ProgressFile", "TrainingCheckpoint", "ValidateEvery",
    "RoleFile", "CALLBACKS",
    "parse_early_stopping", "parse_target_metric", "resolve_key", "metric_mode",
]


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
        # every step, so that a later fit (or a resume) past the warm-up runs at full rate
        trainer.optimizer.lr_scale = self.factor(step)


class CosineDecay(Callback):
    """Linear warm-up, then cosine decay of the learning rate to ``min_factor`` of it at the
    last step of training (Loshchilov & Hutter, 2017; GPT-2/3's and nanoGPT's schedule).

    Step i (0-based, counted over the whole run, so a resume continues the curve) uses
    lr * f(i): f = (i + 1) / warmup_steps during the warm-up, then
    min_factor + (1 - min_factor) * (1 + cos(pi * p)) / 2 with
    p = (i - warmup_steps) / (total_steps - warmup_steps), and min_factor past the end.

    Args:
        warmup_steps: steps of linear warm-up (0: none).
        min_factor: the fraction of the rate left at the end, in [0, 1].
        total_steps: the steps the decay spans (default: those of the fit, epochs x steps
            per epoch).

    Example:
        CosineDecay(warmup_steps=100, min_factor=0.1)  # with AdamW(lr=6e-4): 6e-4 -> 6e-5
    """

    def __init__(self, warmup_steps: int = 0, min_factor: float = 0.0,
                 total_steps: int | None = None):
        if isinstance(warmup_steps, bool) or int(warmup_steps) != warmup_steps \
                or warmup_steps < 0:
            raise ValueError(f"warmup_steps must be an integer >= 0, got {warmup_steps!r}")
        if not 0.0 <= min_factor <= 1.0:
            raise ValueError(f"cosine min_factor must be in [0, 1], got {min_factor!r}")
        if total_steps is not None and (int(total_steps) != total_steps or total_steps < 1):
            raise ValueError(f"cosine total_steps must be an integer >= 1, got {total_steps!r}")
        self.warmup_steps, self.min_factor = int(warmup_steps), float(min_factor)
        self.total_steps = None if total_steps is None else int(total_steps)
        self.total = self.total_steps or 0

    def on_train_begin(self, trainer):
        self.total = self.total_steps or trainer.steps_per_epoch * trainer.num_epochs

    def factor(self, step: int) -> float:
        import math
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        span = self.total - self.warmup_steps
        progress = min(1.0, (step - self.warmup_steps) / span) if span > 0 else 1.0
        return self.min_factor + (1.0 - self.min_factor) * 0.5 * (1.0 + math.cos(math.pi
                                                                                  * progress))

    def on_batch_begin(self, trainer, step):
        trainer.optimizer.lr_scale = self.factor(step)


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
        optimizer = trainer.optimizer
        lr = optimizer.scheduled_lr
        if self.wait >= self.patience and lr > self.min_lr:
            new = max(lr * self.factor, self.min_lr)
            trainer.print(f"reduce_lr_on_plateau: {self.key} has not improved for {self.wait} "
                          f"epochs; learning rate {lr:.4g} -> {new:.4g}")
            optimizer.scheduled_lr = new
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
            optimizer = trainer.optimizer
            optimizer.scheduled_lr = max(optimizer.scheduled_lr * self.factor, self.min_lr)


class ValidateEvery(Callback):
    """Evaluate ``validation`` after every ``every`` optimizer updates (NNLO's
    --validate-every; collective: every rank calls it at the same step) and print the
    result on rank 0; ``records`` keeps them.

    Example:
        ValidateEvery(100, val, batch_size=256 * comm.size, steps=0)
    """

    def __init__(self, every: int, validation, batch_size: int, steps: int = 0):
        self.every, self.validation = int(every), validation
        self.batch_size, self.steps = int(batch_size), int(steps)
        self.records: list[dict[str, float]] = []

    def on_batch_end(self, trainer, step, logs):
        if (step + 1) % self.every:
            return
        result = trainer.evaluate(self.validation, global_batch_size=self.batch_size,
                                  steps=self.steps, prefix="val_")
        self.records.append({"step": step + 1, **result})
        text = " ".join(f"{k}={v:.4f}" for k, v in result.items())
        trainer.print(f"Validation after {step + 1} updates: {text}", force=True)


class RoleFile(Callback):
    """This rank writes its role (``Rule.role``, e.g. "sub-master of worker 4 (master group
    1 of 2)"), one line, to its watcher's pipe at the start of training, so that the watcher
    (``distnn.launch.rankwatch``, which every rank of ``distnn launch`` runs under) can
    name it if a signal ends it. Local: no communication.

    Args:
        spec: ``FD:INODE``, the pipe's write end and its inode (``DISTNN_ROLE_FD``); a
            descriptor that is not that pipe (a process that inherited the variable but not
            the descriptor) is left alone.
    """

    checkpointed = False  # a run under the watcher resumes a checkpoint of one without it

    def __init__(self, spec: str):
        fd, _, inode = str(spec).partition(":")
        self.fd = int(fd) if fd.isdigit() and inode.isdigit() else -1
        self.inode = int(inode) if inode.isdigit() else -1

    def on_train_begin(self, trainer):
        import os
        import stat
        try:
            st = os.fstat(self.fd)
            if stat.S_ISFIFO(st.st_mode) and st.st_ino == self.inode:
                os.write(self.fd, (trainer.rule.role(trainer.comm.rank) + "\n").encode())
        except OSError:
            pass  # only the role is missing from the line that names a lost rank


CALLBACKS: dict[str, type[Callback]] = {
    "warm_up": WarmUp,
    "early_stopping": EarlyStopping,
    "reduce_lr_on_plateau": ReduceLROnPlateau,
    "reduce_lr_every_nepochs": ReduceLREveryNEpochs,
    "stop_at_loss": TargetMetric,
    "model_checkpoint": ModelCheckpoint,
}
