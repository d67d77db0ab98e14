"""One pipeline from a ``RunConfig`` to a run: the dataset splits, the model, the optimizer,
the training rule, the callbacks and the ``Trainer``. ``distnn train``, ``evaluate``,
``predict`` and every candidate of ``distnn search`` are built here, and so is a Python
user's run::

    from distnn.run import build_config, build_run
    run = build_run(build_config("train", {"model": "lenet", "num_epochs": 2}))
    history = run.fit()          # under mpiexec -n N: on every rank, data-parallel

Every step that can fail because of the configuration or the files it names fails on
every rank alike (``agreed``), with a ``RunError`` that names the option.
"""
from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from ..distributed.coordination import on_ranks
from .callbacks import build_callbacks, build_optimizer
from .config import PRED, TRAIN, ConfigError, RunConfig

__all__ = ["RunError", "Run", "build_run", "agreed", "load_data", "load_splits",
           "build_model", "build_rule", "build_augment", "rank_path"]


class RunError(ValueError):
    """A run cannot be built or written as configured (a bad file, a missing split...): one
    line naming the option, the same on every rank (exit status 2 in the command)."""

    exit_code = 2


def agreed(comm, what: str | None, fn: Callable[[], Any], *, root: int | None = None,
           describe: Callable[[BaseException], str] = str, lazy: bool = False) -> Any:
    """``fn()`` on every rank (or on ``root``), its errors caused by the configuration
    (``ValueError``, ``OSError``, ``KeyError``, ``DatasetError``) agreed on by all ranks
    (``distributed.coordination.on_ranks``) and raised as one ``RunError`` on every rank:
    "what: message" (``describe(exc)`` gives the message), "[rank r] ..." on the ranks
    that did not fail themselves when not all did, "[rank r on host h] ..." on every rank
    when the job spans several hosts and not all ranks failed."""
    from ..data import DatasetError
    try:
        return on_ranks(comm, fn, root=root, lazy=lazy,
                        catch=(DatasetError, ValueError, OSError, KeyError))
    except (DatasetError, ValueError, OSError, KeyError) as exc:
        text = f"missing entry {exc}" if isinstance(exc, KeyError) else describe(exc)
        message = text if what is None or text.startswith((what, "--")) else f"{what}: {text}"
        ranks = getattr(exc, "ranks", [comm.rank])
        hosts = getattr(exc, "hosts", [])
        where = (f"on host {exc.host} " if len(set(hosts)) > 1 else "")
        if root is None and len(ranks) < comm.size and (where or comm.rank not in ranks):
            # Across hosts a file one host lacks is the usual cause: name the host.
            message = f"[rank {exc.rank} {where}]".replace(" ]", "]") + f" {message}"
        raise RunError(message) from None


def rank_path(path: str, rank: int) -> str:
    """``path`` with '{rank}' replaced by ``rank`` (files every rank writes)."""
    return path.replace("{rank}", str(rank))


# -- data ----------------------------------------------------------------------------------
READER_OPTIONS = ("download", "train_list", "val_list", "test_list", "features_name",
                  "labels_name", "input_shape", "num_classes", "num_samples", "data_layout")


def load_splits(cfg: RunConfig, comm):
    """The dataset splits the config asks for (train/val/test; test from
    ``dataset_test_path`` when given). Reader options go to the readers that take them."""
    from ..data import DATASETS, load_dataset
    d = cfg.data
    accepted = set(inspect.signature(DATASETS[d.dataset]).parameters)
    reader_options = {name: getattr(d, name) for name in READER_OPTIONS
                      if name in accepted and getattr(d, name) is not None}
    if "rank" in accepted:  # readers that read only this rank's part (hdf5)
        reader_options.update(rank=comm.rank, size=comm.size)
        if "train_part" in accepted and cfg.command == TRAIN and comm.size > 1:
            # the training files are split among the ranks that train (the workers)
            reader_options.update(train_part=build_rule(cfg, comm).shard_of(comm))
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
                          else d.validation_split,
                          test_as_validation=test_as_val, **common)
    if d.dataset_test_path:
        from ..data import Splits
        other = load_dataset(d.dataset, path=d.dataset_test_path, **common)
        # A folder of test files only (ImageNet validation shards) reads as train.
        test = other.test if other.test is not None else other.train
        splits = Splits(splits.train, test if test_as_val else splits.val, test)
    return splits


def load_data(cfg: RunConfig, comm):
    """``load_splits`` on every rank (a failure on one is an error on all), then datasets
    of which each rank read only its part learn the sizes of the other parts."""
    splits = agreed(comm, "dataset", lambda: load_splits(cfg, comm))
    parts = {id(ds): ds for ds in (splits.train, splits.val, splits.test)
             if getattr(ds, "part_sizes", ()) is None}
    if parts:
        infos = {key: comm.allgather_obj((ds.rank, *ds.part_info())) if comm.size > 1
                 else [(ds.rank, *ds.part_info())] for key, ds in parts.items()}
        num_classes = max(top for info in infos.values() for _, _, top in info)
        for key, ds in parts.items():
            sizes = [0] * ds.size
            for part, n, _ in infos[key]:
                if part is not None:
                    sizes[part] = n
            ds.set_parts(sizes, num_classes, owners=[p for p, _, _ in infos[key]],
                         job_rank=comm.rank)
    return splits


def build_augment(cfg: RunConfig) -> list:
    """The training-time augmentations of ``cfg.data``."""
    from ..data import RandomCrop, RandomFlip
    d = cfg.data
    out = []
    if d.flip_images:
        out.append(RandomFlip(d.flip_images_prob))
    if d.crop_images:
        out.append(RandomCrop(d.crop_images_padding, d.crop_images_prob,
                              d.crop_images_padding_mode))
    return out


# -- model and rule ------------------------------------------------------------------------
def model_from_spec(spec: str, *, input_shape, num_classes: int, dtype=np.float32,
                    seed: int = 0, num_threads: int = 0, model_args=()):
    """The model a model file makes (``models.files.load_model_spec``), a torch module
    wrapped in ``distnn.torch.TorchModel`` with ``num_threads`` intra-op threads (0: torch's
    default), so the Trainer gets a ``distnn.nn.Model`` either way."""
    from ..models.files import ModelFileError, load_model_spec
    model = load_model_spec(spec, input_shape=input_shape, num_classes=num_classes,
                            dtype=dtype, seed=seed, model_args=dict(model_args))
    if hasattr(model, "named_arrays"):
        return model
    import torch

    from ..torch import TorchModel
    if num_threads:
        torch.set_num_threads(int(num_threads))
    try:
        return TorchModel(model, input_shape, dtype=dtype,
                          name=getattr(model, "distnn_label", type(model).__name__))
    except ValueError as exc:
        raise ModelFileError(f"--model {spec!r}: {exc}") from None


def build_model(cfg: RunConfig, dataset, comm):
    """The zoo model or the user's model file of ``cfg.model`` for ``dataset`` (a torch
    module comes wrapped in ``distnn.torch.TorchModel``), with its weights file loaded."""
    from ..distributed import default_threads
    from ..models import get_model
    from ..models.files import is_model_spec
    m = cfg.model
    if is_model_spec(m.model):
        model = model_from_spec(m.model, input_shape=dataset.input_shape,
                                num_classes=dataset.num_classes, dtype=np.dtype(m.dtype),
                                seed=m.random_seed, model_args=m.model_args,
                                num_threads=cfg.parallel.threads or default_threads(comm))
    else:
        if m.model_args:
            given = ",".join(f"{k}={v}" for k, v in m.model_args)
            raise ConfigError(f"--model_args {given}: arguments for a model file's "
                              f"callable; --model {m.model} is a zoo model (give --model "
                              "FILE.py)")
        model = get_model(m.model, input_shape=dataset.input_shape,
                          num_classes=dataset.num_classes, dtype=np.dtype(m.dtype),
                          rng=m.random_seed)
    if m.weights_and_bias_filename:
        model.load_weights(m.weights_and_bias_filename)
    return model


def build_rule(cfg: RunConfig, comm):
    """The training rule of ``cfg.parallel.parallel`` (auto and sequential: data), its
    constructor's arguments read from ``cfg.parallel`` (``rules.build_rule``)."""
    from ..rules import RULES, rule_name
    from ..rules import build_rule as rule_from_options
    p = cfg.parallel
    name = "data" if p.parallel in ("auto", "sequential") else rule_name(p.parallel)
    compressing = p.gradient_compression != "none"
    if compressing and "compression" not in inspect.signature(RULES[name]).parameters:
        raise ConfigError(f"--gradient_compression {p.gradient_compression} compresses the "
                          f"gradient all-reduce of --parallel data; --parallel {p.parallel} "
                          "exchanges no gradients that way: drop --gradient_compression or "
                          "use --parallel data")
    try:
        rule = rule_from_options(name, dataclasses.asdict(p))
    except ValueError as exc:
        raise ConfigError(f"--parallel {p.parallel}: {exc}") from None
    if comm.size < rule.min_ranks:
        raise ConfigError(f"--parallel {p.parallel}: rank 0 is the master and the others are "
                          f"workers, so it needs at least {rule.min_ranks} ranks, got "
                          f"{comm.size}; run it under mpiexec -n 3 (or use --parallel data)")
    if cfg.train.checkpoint_steps and comm.size > 1 and not rule.lockstep:
        raise ConfigError(f"--checkpoint_steps needs a rule whose ranks take every step "
                          f"together (--parallel data); --parallel {p.parallel} does not: "
                          "checkpoint by epochs (--checkpoint_freq) instead")
    return rule


# -- the run -------------------------------------------------------------------------------
@dataclass
class Run:
    """A built run: its configuration, communicator, data, model, optimizer and trainer.
    ``train``/``val``: what ``fit`` trains on and validates with (the splits', or a fold's).
    """

    cfg: RunConfig
    comm: Any
    splits: Any
    model: Any
    trainer: Any
    train: Any
    val: Any
    profiler: Any = None
    callbacks: list = field(default_factory=list)

    @property
    def eval_batch_size(self) -> int:
        return max(self.cfg.train.batch_size, 256)

    def history_file(self) -> str | None:
        path = self.cfg.train.history_file
        return path and rank_path(path, self.comm.rank)

    def fit(self, *, resume=None, global_batch_size: int | None = None):
        """``Trainer.fit`` with the configuration's settings; ``resume``: a loaded
        ``Checkpoint``; ``global_batch_size``: instead of the configuration's (a resumed
        run keeps its checkpoint's). Returns the ``History``."""
        t = self.cfg.train
        history_file = self.history_file()
        history = self.trainer.fit(
            self.train, epochs=t.num_epochs, batch_size=t.batch_size,
            global_batch_size=global_batch_size or t.global_batch_size, validation=self.val,
            steps_per_epoch=t.steps_per_epoch, validation_steps=t.steps_per_epoch,
            shuffle=t.shuffle, augment=build_augment(self.cfg) or None,
            prefetch=self.cfg.data.prefetch, history_file=history_file, resume=resume,
            eval_batch_size=self.eval_batch_size)
        if t.every_rank_writes and history_file:  # rank 0 wrote it in fit
            comm = self.comm
            agreed(comm, "--history_file",
                   lambda: comm.rank == 0 or self.trainer.history.save(history_file))
        return history

    def save_weights(self, path: str) -> str:
        """Write the model's weights to ``path`` (rank 0; every rank with
        ``every_rank_writes``, '{rank}' replaced); returns this rank's file."""
        from ..fileio import describe_write_failure
        target = rank_path(path, self.comm.rank)
        every = self.cfg.train.every_rank_writes

        def write() -> None:
            if self.cfg.train.weights_layout == "pydtnn":
                from ..nn.pydtnn_weights import save_pydtnn_weights
                save_pydtnn_weights(self.model, target)
            else:
                self.model.save_weights(target)

        agreed(self.comm, "--save_weights", write,
               root=None if every else 0, describe=str if every else describe_write_failure)
        return target


def build_run(cfg: RunConfig, comm=None, *, splits=None, train=None, val=None,
              callbacks: Sequence = ()) -> Run:
    """Build the run ``cfg`` describes on every rank of ``comm`` (default: the
    communicator of ``distnn.distributed.init()``).

    Args:
        splits: dataset splits already read (default: read them, ``load_data``).
        train, val: train on / validate with these instead of the splits' (a fold).
        callbacks: more callbacks, after the configuration's.
    """
    if comm is None:
        from .. import distributed as dist
        comm = dist.init()
    if cfg.command == TRAIN and comm.size > 1:
        from ..distributed.stall import watch_stalls
        ck = cfg.train.checkpoint or cfg.train.resume
        watch_stalls(comm, cfg.parallel.stall_warning, cfg.parallel.stall_timeout,
                     hint=f"the last checkpoint: --resume {ck}" if ck else "")
    if splits is None:
        splits = load_data(cfg, comm)
    train = splits.train if train is None else train
    val = splits.val if val is None else val
    what = "model" if cfg.command == TRAIN else "--weights_and_bias_filename"
    model = agreed(comm, what, lambda: build_model(cfg, train, comm))
    if cfg.parallel.sync_batchnorm:
        from .. import distributed as dist
        dist.sync_batchnorm(model, comm)
    optimizer = agreed(comm, "optimizer", lambda: build_optimizer(cfg, model, comm.size))
    configured = build_callbacks(cfg, comm.size) if cfg.command == TRAIN else []
    validate = []
    if cfg.command == TRAIN and cfg.train.validate_every:  # a callback: --resume expects it
        if val is None:
            raise RunError("--validate_every needs validation data: --validation_split, "
                           "--test_as_validation or --val_list")
        from ..training.callbacks import ValidateEvery
        validate = [ValidateEvery(cfg.train.validate_every, val,
                                  max(cfg.train.batch_size, 256) * comm.size,
                                  cfg.train.steps_per_epoch)]
    profiler = None
    if cfg.output.profile or cfg.output.trace:
        from ..training.profiler import Profiler
        profiler = Profiler(trace=bool(cfg.output.trace), report=cfg.output.profile)
    from ..training import Trainer
    rule = build_rule(cfg, comm) if cfg.command == TRAIN else None
    try:
        trainer = Trainer(model, optimizer, loss=cfg.optim.loss_func,
                          metrics=cfg.optim.metrics, comm=comm,
                          callbacks=[*validate, *configured, *callbacks],
                          progress=not cfg.output.quiet, verbose=not cfg.output.quiet,
                          seed=cfg.model.random_seed, profiler=profiler, rule=rule,
                          ignore_nan=cfg.train.ignore_nan)
    except ValueError as exc:  # the rule does not fit the model (same on every rank)
        raise ConfigError(f"--parallel {cfg.parallel.parallel}: {exc}") from None
    trainer.run_info = cfg.summary(ranks=comm.size)  # recorded in the history file
    return Run(cfg, comm, splits, model, trainer, train, val, profiler, configured)
