"""Set-up shared by the ``distnn`` commands: the communicator, collective error checks,
and the dataset splits, model, optimizer, callbacks and augmentation a ``RunConfig``
asks for.
"""
from __future__ import annotations

import contextlib
import inspect
from typing import Any, Callable

import numpy as np

from .config import PRED, TRAIN, ConfigError, RunConfig


class UserError(Exception):
    """An error caused by the user's input, reported in one line with exit status 2."""


def make_comm(parallel: str):
    """LocalComm for 'sequential'; the MPI world (size 1 without mpiexec) otherwise."""
    from .. import distributed as dist
    if parallel == "sequential":
        return dist.init(dist.LocalComm())
    return dist.init()


def _collective(comm, what: str, fn: Callable[[], Any]) -> Any:
    """Run ``fn`` on every rank; if it fails with a user error on any rank, raise
    ``UserError`` on every rank (one all-gather), so no rank waits in a collective."""
    from ..data import DatasetError
    error = None
    result = None
    try:
        result = fn()
    except (DatasetError, ValueError, OSError, KeyError) as exc:
        error = f"{what}: {exc}" if not str(exc).startswith(what) else str(exc)
        if isinstance(exc, KeyError):
            error = f"{what}: missing entry {exc}"
        # The library's messages name its arguments; here the user typed options.
        error = error.replace("pass path=<", "pass --dataset_path <")
    errors = comm.allgather_obj(error) if comm.size > 1 else [error]
    failed = [(r, e) for r, e in enumerate(errors) if e is not None]
    if failed:
        rank, message = failed[0]
        raise UserError(message if comm.size == 1 or rank == comm.rank or len(failed) == comm.size
                        else f"[rank {rank}] {message}")
    return result


def load_splits(cfg: RunConfig, comm):
    """The dataset splits the config asks for (train/val/test; test from
    --dataset_test_path when given)."""
    from ..data import DATASETS, load_dataset
    d = cfg.data
    accepted = set(inspect.signature(DATASETS[d.dataset]).parameters)
    reader_options = {name: getattr(d, name) for name in READER_OPTIONS
                      if name in accepted and getattr(d, name) is not None}
    if "rank" in accepted:  # readers that read only this rank's part (hdf5)
        reader_options.update(rank=comm.rank, size=comm.size)
    from ..nn.losses import CategoricalCrossEntropy, get_loss
    from ..nn.metrics import get_metric, mean_absolute_error, mean_squared_error
    # mse, mae and bce (losses or metrics) compare the outputs with targets of their
    # shape: one-hot labels then (the other losses and metrics take those too).
    one_hot = (not isinstance(get_loss(cfg.optim.loss_func), CategoricalCrossEntropy)
               or any(get_metric(m) in (mean_squared_error, mean_absolute_error)
                      for m in cfg.optim.metrics))
    common = dict(dtype=np.dtype(cfg.model.dtype), normalize=d.normalize, one_hot=one_hot,
                  seed=cfg.model.random_seed, **reader_options)
    training = cfg.command == TRAIN and not cfg.train.evaluate_only
    test_as_val = training and d.test_as_validation
    # predict --split val holds out the same tail of the training set as train did.
    held_out = training or (cfg.command == PRED and cfg.predict.split == "val")
    splits = load_dataset(d.dataset, path=d.dataset_path,
                          validation_split=0.0 if test_as_val or not held_out
                          else d.validation_split or 0.0,
                          test_as_validation=test_as_val, **common)
    if d.dataset_test_path:
        from ..data import Splits
        other = load_dataset(d.dataset, path=d.dataset_test_path, **common)
        # A folder of test files only (PyDTNN's ImageNet validation shards) reads as train.
        test = other.test if other.test is not None else other.train
        splits = Splits(splits.train, test if test_as_val else splits.val, test)
    return splits


def load_data(cfg: RunConfig, comm):
    """``load_splits`` on every rank (a failure on one is an error on all), then datasets
    of which each rank read only its part learn the sizes of the other parts."""
    splits = _collective(comm, "dataset", lambda: load_splits(cfg, comm))
    parts = {id(ds): ds for ds in (splits.train, splits.val, splits.test)
             if getattr(ds, "part_sizes", ()) is None}
    if parts:
        infos = {key: comm.allgather_obj(ds.part_info()) if comm.size > 1
                 else [ds.part_info()] for key, ds in parts.items()}
        num_classes = max(top for info in infos.values() for _, top in info)
        for key, ds in parts.items():
            ds.set_parts([n for n, _ in infos[key]], num_classes)
    return splits


READER_OPTIONS = ("download", "train_list", "val_list", "test_list", "features_name", "labels_name",
                  "input_shape", "num_classes", "num_samples")


def build_model(cfg: RunConfig, dataset):
    from ..models import get_model
    from ..models.files import is_model_spec, load_model_spec
    if is_model_spec(cfg.model.model):
        from .. import distributed as dist
        threads = cfg.parallel.threads or (1 if dist.get_comm().size > 1 else 0)
        model = load_model_spec(cfg.model.model, input_shape=dataset.input_shape,
                                num_classes=dataset.num_classes,
                                dtype=np.dtype(cfg.model.dtype), seed=cfg.model.random_seed,
                                num_threads=threads)
    else:
        model = get_model(cfg.model.model, input_shape=dataset.input_shape,
                          num_classes=dataset.num_classes, dtype=np.dtype(cfg.model.dtype),
                          rng=cfg.model.random_seed)
    if cfg.model.weights_and_bias_filename:
        model.load_weights(cfg.model.weights_and_bias_filename)
    return model


# Optimizer hyper-parameters from PyDTNN's option names, per optimizer (None: its default).
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


def build_optimizer(cfg: RunConfig, model, size: int):
    from ..optim import get_optimizer
    o = cfg.optim
    hyper = {k: v for k, v in OPTIMIZER_OPTIONS[o.optimizer](o).items() if v is not None}
    lr = o.learning_rate * (size if o.learning_rate_scaling else 1)
    return get_optimizer(o.optimizer, model, lr=lr, **hyper)


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


SCHEDULERS: dict[str, Callable] = {
    "warm_up": _warm_up, "early_stopping": _early_stopping,
    "reduce_lr_on_plateau": _reduce_lr_on_plateau,
    "reduce_lr_every_nepochs": _reduce_lr_every_nepochs, "stop_at_loss": _stop_at_loss,
    "model_checkpoint": _model_checkpoint,
}


def build_callbacks(cfg: RunConfig, size: int) -> list:
    from ..training.callbacks import (TrainingCheckpoint, parse_early_stopping, parse_target_metric)
    s = cfg.sched
    ctx = {"size": size, "scaled": cfg.optim.learning_rate_scaling}
    names = list(dict.fromkeys(s.lr_schedulers))
    if s.early_stopping and "early_stopping" in names:
        names.remove("early_stopping")
    try:
        callbacks = [SCHEDULERS[name](s, ctx) for name in names]
        if s.early_stopping:
            callbacks.append(parse_early_stopping(
                s.early_stopping, min_delta=s.early_stopping_min_delta,
                restore_best_weights=s.early_stopping_restore_best))
        if s.target_metric:
            callbacks.append(parse_target_metric(s.target_metric))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    # --resume alone keeps checkpointing to the file it resumed.
    path = cfg.train.checkpoint or cfg.train.resume
    if path:
        callbacks.append(TrainingCheckpoint(path, cfg.train.checkpoint_freq))
    return callbacks


# Training-rule options by --parallel word (the rule's constructor arguments).
RULE_OPTIONS: dict[str, Callable] = {
    "data": lambda p: {"bucket_size_mb": p.bucket_size_mb, "non_blocking": p.non_blocking_mpi,
                       "compression": None if p.gradient_compression == "none"
                       else p.gradient_compression},
    "localsgd": lambda p: {"sync_every": p.sync_every},
    "downpour": lambda p: {"sync_every": p.sync_every, "synchronous": p.synchronous},
    "easgd": lambda p: {"sync_every": p.sync_every, "synchronous": p.synchronous,
                        "elastic_force": p.elastic_force, "elastic_lr": p.elastic_lr,
                        "elastic_momentum": p.elastic_momentum,
                        "worker_optimizer": p.worker_optimizer},
    "gossip": lambda p: {"probability": p.gossip_probability, "alpha": p.gossip_alpha,
                         "synchronous": p.synchronous},
    "gem": lambda p: {"sync_every": p.sync_every, "synchronous": p.synchronous,
                      "gem_lr": p.gem_lr, "gem_momentum": p.gem_momentum,
                      "gem_kappa": p.gem_kappa},
}


def build_rule(cfg: RunConfig, comm):
    """The training rule of --parallel (auto and sequential: data)."""
    from ..rules import get_rule, rule_name
    p = cfg.parallel
    name = "data" if p.parallel in ("auto", "sequential") else rule_name(p.parallel)
    needs = {"downpour": 2, "gem": 2, "easgd": 1 if p.synchronous else 2}.get(name, 1)
    if comm.size < needs:
        raise ConfigError(f"--parallel {p.parallel}: rank 0 is the master and the others are "
                          f"workers, so it needs at least 2 ranks, got {comm.size}; run it "
                          f"under mpiexec -n 3 (or use --parallel data)")
    try:
        return get_rule(name, **RULE_OPTIONS[name](p))
    except ValueError as exc:
        raise ConfigError(f"--parallel {p.parallel}: {exc}") from None


def build_augment(cfg: RunConfig) -> list:
    from ..data import RandomCrop, RandomFlip
    d = cfg.data
    out = []
    if d.flip_images:
        out.append(RandomFlip(d.flip_images_prob))
    if d.crop_images:
        out.append(RandomCrop(d.crop_images_padding, d.crop_images_prob))
    return out


@contextlib.contextmanager
def threads(cfg: RunConfig, comm):
    """``--threads`` for the run: the BLAS pools (threadpoolctl) and the compiled kernels'
    loops; 0 means this rank's cores shared among the ranks of its node that use them
    (``distributed.default_threads``)."""
    from threadpoolctl import threadpool_limits

    from .. import kernels
    from ..distributed import default_threads
    n = cfg.parallel.threads or default_threads(comm)
    before = kernels.get_num_threads()
    kernels.set_num_threads(n)
    try:
        with threadpool_limits(limits=n):
            yield
    finally:
        kernels.set_num_threads(before)

