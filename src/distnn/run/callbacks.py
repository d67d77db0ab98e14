"""The optimizer and the callbacks a ``RunConfig`` asks for: each optimizer's
hyper-parameters by option name (``OPTIMIZER_OPTIONS``) and each ``--lr_schedulers`` word's
callback (``SCHEDULERS``); both registries, so a new one is one entry.
"""
from __future__ import annotations

import os
from typing import Callable

from .config import ConfigError, RunConfig


# Optimizer hyper-parameters from the option names, per optimizer (None: its default).
def _sgd_options(o):
    return {"momentum": o.momentum, "nesterov": o.nesterov, "weight_decay": o.decay}


def _rmsprop_options(o):
    return {"alpha": o.rho, "eps": o.epsilon, "weight_decay": o.decay}


def _adam_options(o):
    betas = None
    if o.beta1 is not None or o.beta2 is not None:
        betas = (0.9 if o.beta1 is None else o.beta1, 0.999 if o.beta2 is None else o.beta2)
    return {"betas": betas, "eps": o.epsilon, "weight_decay": o.decay}


def _adadelta_options(o):
    return {"rho": o.rho, "eps": o.epsilon, "weight_decay": o.decay}


OPTIMIZER_OPTIONS: dict[str, Callable] = {
    "sgd": _sgd_options, "rmsprop": _rmsprop_options, "adam": _adam_options,
    "adamw": _adam_options, "nadam": _adam_options, "adadelta": _adadelta_options,
}


def lr_factor(cfg: RunConfig, size: int) -> float:
    """What ``--learning_rate`` is multiplied by on ``size`` ranks: ``size`` with
    ``learning_rate_scaling``, divided by the global batch size with ``lr_per_sample``."""
    factor = float(size if cfg.optim.learning_rate_scaling else 1)
    if cfg.optim.lr_per_sample:
        from ..training import resolve_batch_sizes
        factor /= resolve_batch_sizes(cfg.train.batch_size, cfg.train.global_batch_size,
                                      size)[1]
    return factor


def build_optimizer(cfg: RunConfig, model, size: int):
    """The optimizer of ``cfg.optim`` over ``model`` (learning rate times ``lr_factor``:
    ``learning_rate_scaling``, ``lr_per_sample``)."""
    from ..optim import get_optimizer
    o = cfg.optim
    hyper = {k: v for k, v in OPTIMIZER_OPTIONS[o.optimizer](o).items() if v is not None}
    lr = o.learning_rate * lr_factor(cfg, size)
    optimizer = get_optimizer(o.optimizer, model, lr=lr, **hyper)
    optimizer.clip_grad_norm = o.clip_grad_norm
    return optimizer


# LR schedulers and callbacks by --lr_schedulers name.
def _warm_up(s, ctx):
    from ..training.callbacks import WarmUp
    start = 1.0 / ctx["size"] if ctx["scaled"] and ctx["size"] > 1 else 0.0
    return WarmUp(epochs=s.warm_up_epochs, batches=s.warm_up_batches, start_factor=start)


def _early_stopping(s, ctx):
    from ..training.callbacks import EarlyStopping
    return EarlyStopping(s.early_stopping_metric, patience=s.early_stopping_patience,
                         min_delta=s.early_stopping_min_delta,
                         restore_best_weights=s.early_stopping_restore_best)


def _reduce_lr_on_plateau(s, ctx):
    from ..training.callbacks import ReduceLROnPlateau
    return ReduceLROnPlateau(s.reduce_lr_on_plateau_metric, factor=s.reduce_lr_on_plateau_factor,
                             patience=s.reduce_lr_on_plateau_patience,
                             min_lr=s.reduce_lr_on_plateau_min_lr)


def _reduce_lr_every_nepochs(s, ctx):
    from ..training.callbacks import ReduceLREveryNEpochs
    return ReduceLREveryNEpochs(s.reduce_lr_every_nepochs_nepochs,
                                factor=s.reduce_lr_every_nepochs_factor,
                                min_lr=s.reduce_lr_every_nepochs_min_lr)


def _stop_at_loss(s, ctx):
    from ..training.callbacks import TargetMetric, metric_mode
    if s.stop_at_loss_threshold is None:
        # No default: any fixed one (0 was) is reached at once for accuracies or never.
        raise ValueError(f"--stop_at_loss_threshold: stop_at_loss needs the value of "
                         f"{s.stop_at_loss_metric} to stop at (e.g. 0.9 for an accuracy, 0.3 "
                         "for a loss), got none")
    op = ">=" if metric_mode(s.stop_at_loss_metric) == "max" else "<="
    return TargetMetric(s.stop_at_loss_metric, op, s.stop_at_loss_threshold)


def _model_checkpoint(s, ctx):
    from ..training.callbacks import ModelCheckpoint
    return ModelCheckpoint(s.model_checkpoint_file, monitor=s.model_checkpoint_metric,
                           save_freq=s.model_checkpoint_save_freq,
                           save_best_only=s.model_checkpoint_best_only)


# --lr_schedule: the callback that owns the learning rate's factor (None: none needed).
def _constant(s):
    if not s.warmup_steps:
        return None
    from ..training.callbacks import WarmUp
    return WarmUp(batches=s.warmup_steps)


def _cosine(s):
    from ..training.callbacks import CosineDecay
    return CosineDecay(warmup_steps=s.warmup_steps, min_factor=s.min_lr_ratio)


LR_SCHEDULES: dict[str, Callable] = {"constant": _constant, "cosine": _cosine}


SCHEDULERS: dict[str, Callable] = {
    "warm_up": _warm_up, "early_stopping": _early_stopping,
    "reduce_lr_on_plateau": _reduce_lr_on_plateau,
    "reduce_lr_every_nepochs": _reduce_lr_every_nepochs, "stop_at_loss": _stop_at_loss,
    "model_checkpoint": _model_checkpoint,
}


def build_callbacks(cfg: RunConfig, size: int, summary: dict | None = None) -> list:
    """The callbacks of ``cfg.sched`` (in ``lr_schedulers`` order, then early_stopping and
    target_metric specs) and the checkpoint of ``cfg.train``; ``summary``: the run's
    ``cfg.summary(ranks=size)`` where the caller has it (TensorBoard records it)."""
    from ..training.callbacks import (ProgressFile, RoleFile, TrainingCheckpoint,
                                      parse_early_stopping, parse_target_metric)
    s = cfg.sched
    ctx = {"size": size, "scaled": cfg.optim.learning_rate_scaling}
    names = list(dict.fromkeys(s.lr_schedulers))
    if s.early_stopping and "early_stopping" in names:
        names.remove("early_stopping")
    try:
        callbacks = [SCHEDULERS[name](s, ctx) for name in names]
        schedule = LR_SCHEDULES[s.lr_schedule](s)
        if schedule is not None:
            callbacks.insert(0, schedule)
        if s.early_stopping:
            callbacks.append(parse_early_stopping(
                s.early_stopping, min_delta=s.early_stopping_min_delta,
                restore_best_weights=s.early_stopping_restore_best))
        if s.target_metric:
            callbacks.append(parse_target_metric(s.target_metric))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if cfg.output.tensorboard:
        from ..training.tensorboard import TensorBoard
        callbacks.append(TensorBoard(cfg.output.tensorboard, cfg.output.tensorboard_every,
                                     options=summary or cfg.summary(ranks=size)))
    # resume alone keeps checkpointing to the file it resumed.
    path = cfg.train.checkpoint or cfg.train.resume
    if path:
        callbacks.append(TrainingCheckpoint(path, cfg.train.checkpoint_freq,
                                            steps=cfg.train.checkpoint_steps,
                                            per_node=cfg.train.every_rank_writes))
    if cfg.train.progress_file:
        callbacks.append(ProgressFile(cfg.train.progress_file))
    if os.environ.get("DISTNN_ROLE_FD"):  # the rank's watcher (launch/rankwatch.py)
        callbacks.append(RoleFile(os.environ["DISTNN_ROLE_FD"]))
    return callbacks
