"""One pipeline from a ``RunConfig`` to a run: threads, the checks made before any data is
read, the dataset splits, the model, the optimizer, the training rule, the callbacks, the
``Trainer`` and, for a resumed run, what it keeps from its checkpoint. ``distnn train``,
``evaluate``, ``predict`` and every candidate of ``distnn search`` are built here, and so is
a Python user's run, which is the command's run::

    from distnn.run import build_config, build_run
    run = build_run(build_config("train", {"model": "lenet", "num_epochs": 2}))
    history = run.fit()          # under mpiexec -n N: on every rank, data-parallel

Every step that can fail because of the configuration or the files it names fails on
every rank alike (``agreed``), with a ``RunError`` that names the option.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np

from . import preflight
from .callbacks import build_callbacks, build_optimizer
from .config import EVAL, PRED, TRAIN, ConfigError, RunConfig, build_config, rule_error
from .datasets import READER_OPTIONS, build_augment, load_data, load_splits
from .errors import RunError, TrainingDiverged, agreed, rank_path
from .rule import build_rule
from .threads import apply_kernel_plan, apply_threads

__all__ = ["RunError", "TrainingDiverged", "Run", "build_run", "agreed", "load_data",
           "load_splits", "build_model", "build_rule", "build_augment", "rank_path",
           "model_from_spec", "given_options", "READER_OPTIONS"]


# -- model -------------------------------------------------------------------------------
def model_from_spec(spec: str, *, input_shape, num_classes: int, dtype=np.float32,
                    seed: int = 0, num_threads: int = 0, model_args=(), engine: str = "auto"):
    """The model a model file makes (``models.files.load_model_spec``), a torch module
    wrapped in ``distnn.torch.TorchModel`` with ``num_threads`` intra-op threads (0: torch's
    default), so the Trainer gets a ``distnn.nn.Model`` either way; with ``engine="distnn"``
    a torch module's layers converted to distnn's (``models/from_torch.py``)."""
    from ..models.files import ModelFileError, load_model_spec
    model = load_model_spec(spec, input_shape=input_shape, num_classes=num_classes,
                            dtype=dtype, seed=seed, model_args=dict(model_args))
    if hasattr(model, "named_arrays"):
        return model
    if engine == "distnn":
        from ..models.from_torch import sequential_from_torch
        from ..models.onnx_import import ModelFileError as ImportFailed
        try:
            return sequential_from_torch(model, input_shape, dtype=dtype,
                                         label=getattr(model, "distnn_label", None))
        except ImportFailed as exc:
            raise ModelFileError(f"--model {spec!r}: {exc}") from None
    import torch

    from ..torch import TorchModel
    from ..torch.keras import KerasModel, is_keras_model
    if num_threads:
        torch.set_num_threads(int(num_threads))
    wrap = KerasModel if is_keras_model(model) else TorchModel  # Keras 3, torch backend
    try:
        return wrap(model, input_shape, dtype=dtype,
                    name=getattr(model, "distnn_label", type(model).__name__))
    except ValueError as exc:
        raise ModelFileError(f"--model {spec!r}: {exc}") from None


def build_model(cfg: RunConfig, dataset, comm, threads: int | None = None, *,
                sliced: bool = False):
    """The zoo model or the user's model file of ``cfg.model`` for ``dataset`` (a torch
    module comes wrapped in ``distnn.torch.TorchModel`` with ``threads`` intra-op threads;
    None: ``distributed.threads_per_rank``), with its weights file loaded. ``sliced``
    (``--shard 3``): a zoo model with neither weights file nor torch engine is built with
    this rank's slice of its parameters only (``distributed.build_sliced``)."""
    from ..models import get_model
    from ..models.files import is_model_spec
    m = cfg.model
    if is_model_spec(m.model):
        model = model_from_spec(m.model, input_shape=dataset.input_shape,
                                num_classes=dataset.num_classes, dtype=np.dtype(m.dtype),
                                seed=m.random_seed, model_args=m.model_args,
                                num_threads=_threads(cfg, comm, threads), engine=m.engine)
    else:
        if m.model_args:
            given = ",".join(f"{k}={v}" for k, v in m.model_args)
            raise ConfigError(f"--model_args {given}: arguments for a model file's "
                              f"callable; --model {m.model} is a zoo model (give --model "
                              "FILE.py)")
        sliced = (sliced and dataset.input_shape is not None and m.engine != "torch"
                  and not m.weights_and_bias_filename)
        try:
            model = get_model(m.model, input_shape=dataset.input_shape,
                              num_classes=dataset.num_classes, dtype=np.dtype(m.dtype),
                              rng=m.random_seed, build=not sliced)
            if sliced:
                from ..distributed import build_sliced
                model = build_sliced(model, dataset.input_shape, rng=m.random_seed,
                                     dtype=np.dtype(m.dtype), comm=comm)
        except ValueError as exc:
            if cfg.data.input_shape is None:
                raise
            # the shape the user gave does not fit the model: say which option set it
            shape = ",".join(map(str, cfg.data.input_shape))
            raise ConfigError(f"--input_shape {shape} does not fit --model {m.model}: "
                              f"{exc}") from None
    if m.weights_and_bias_filename:
        model.load_weights(m.weights_and_bias_filename)
    if m.engine == "torch" and hasattr(model, "to_torch"):  # distnn's layers on PyTorch
        from ..torch import TorchModel
        model = TorchModel(model.to_torch().train(), model.input_shape, dtype=model.dtype,
                           name=model.name)
    return model


def _threads(cfg: RunConfig, comm, threads: int | None) -> int:
    from ..distributed import threads_per_rank
    return threads if threads is not None else threads_per_rank(comm, cfg.parallel.threads)


# -- the run -------------------------------------------------------------------------------
# Which option names the file a collective write could not write.
_WRITE_OPTIONS = {"checkpoint": "--checkpoint", "history": "--history_file",
                  "model_checkpoint weights": "--model_checkpoint_file"}


@dataclass
class Run:
    """A built run: its configuration, communicator, data, model, optimizer and trainer.
    ``train``/``val``: what ``fit`` trains on and validates with (the splits', or a fold's).
    ``threads``: the threads per rank it applied. ``resume``: the loaded checkpoint of
    ``--resume``; ``batch_size``, ``global_batch_size``, ``lr``: what the run uses (a
    resumed run keeps its checkpoint's global batch); ``effective``: the configuration with
    those values (what a header shows); ``notes``: what the resume kept or applied, printed
    once on rank 0 (``announce``, or at the start of ``fit``) unless quiet.
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
    threads: int = 1
    resume: Any = None
    batch_size: int = 0
    global_batch_size: int = 0
    lr: float = 0.0
    effective: RunConfig | None = None
    notes: list = field(default_factory=list)
    _announced: bool = field(default=False, repr=False)

    @property
    def eval_batch_size(self) -> int:
        return max(self.cfg.train.batch_size, 256)

    def history_file(self) -> str | None:
        path = self.cfg.train.history_file
        return path and rank_path(path, self.comm.rank)

    def announce(self) -> None:
        """Print the resume notes ("resume: ...") on rank 0 unless quiet, once."""
        if not self._announced and self.comm.rank == 0 and not self.cfg.output.quiet:
            for note in self.notes:
                print(f"resume: {note}", flush=True)
        self._announced = True

    def fit(self, *, resume=None, global_batch_size: int | None = None):
        """Train as ``distnn train`` does: ``Trainer.fit`` with the configuration's settings
        (from ``--resume``'s checkpoint, keeping its global batch), then the files the
        configuration asks for after training (``--save_weights``, ``--plot``). ``resume``:
        another loaded ``Checkpoint``; ``global_batch_size``: instead of the run's. Errors a
        user can cause are ``RunError``s naming the option. Returns the ``History``."""
        from ..fileio import WriteError
        from ..rules import RuleStateError
        from ..training.checkpoint import CheckpointError
        from ..training.trainer import NonFiniteLossError
        self.announce()
        t = self.cfg.train
        if resume is None:
            resume = self.resume
        planned = resume is not None and resume is self.resume
        if global_batch_size is None and planned:
            global_batch_size = self.global_batch_size
        history_file = self.history_file()
        try:
            history = self.trainer.fit(
                self.train, epochs=t.num_epochs, batch_size=t.batch_size,
                global_batch_size=global_batch_size or t.global_batch_size,
                validation=self.val, steps_per_epoch=t.steps_per_epoch,
                validation_steps=t.steps_per_epoch, shuffle=t.shuffle,
                augment=build_augment(self.cfg) or None, prefetch=self.cfg.data.prefetch,
                history_file=history_file, resume=resume,
                eval_batch_size=self.eval_batch_size,
                resume_lr=self.lr if planned else None)
        except (CheckpointError, RuleStateError) as exc:
            raise RunError(f"--resume: {exc}") from None
        except WriteError as exc:
            raise RunError(f"{_WRITE_OPTIONS.get(exc.what, '--checkpoint')}: {exc}") from None
        except NonFiniteLossError as exc:
            raise TrainingDiverged(f"training diverged: {exc.where}; lower --learning_rate, "
                                   "or pass --ignore_nan to keep training", exc) from None
        comm = self.comm
        if t.every_rank_writes and history_file:  # rank 0 wrote it in fit
            agreed(comm, "--history_file",
                   lambda: comm.rank == 0 or self.trainer.history.save(history_file))
        if t.save_weights:
            self.save_weights(t.save_weights)
        if self.cfg.output.plot and len(history):
            from ..fileio import describe_write_failure
            from ..training.plots import plot_history
            agreed(comm, "--plot", lambda: plot_history(self.cfg.output.plot, history),
                   root=0, describe=describe_write_failure)
        return history

    def evaluate(self, dataset=None) -> dict:
        """The loss and metrics on ``dataset`` (default: the test split), as the command
        reports them."""
        dataset = self.splits.test if dataset is None else dataset
        return self.trainer.evaluate(dataset, batch_size=self.eval_batch_size,
                                     steps=self.cfg.train.steps_per_epoch)

    def predict(self):
        """``distnn predict``: the logits and labels of ``--split``, written to ``--output``
        (rank 0). Returns (logits, labels)."""
        from ..fileio import describe_write_failure
        from .outputs import write_predictions
        p = self.cfg.predict
        data = getattr(self.splits, p.split)
        if p.predictions_per_rank:  # each rank writes its own rows, nothing gathered
            from .outputs import per_rank_path
            logits, labels, index = self.trainer.predict(
                data, batch_size=self.eval_batch_size, steps=self.cfg.train.steps_per_epoch,
                gather=False)
            target = per_rank_path(p.output, self.comm.rank)
            agreed(self.comm, "--output",
                   lambda: write_predictions(target, logits, labels, index),
                   describe=describe_write_failure)
            return logits, labels
        logits, labels = self.trainer.predict(data, batch_size=self.eval_batch_size,
                                              steps=self.cfg.train.steps_per_epoch,
                                              return_labels=True)
        agreed(self.comm, "--output", lambda: write_predictions(p.output, logits, labels),
               root=0, describe=describe_write_failure)
        return logits, labels

    def write_trace(self) -> list:
        """With ``--trace``, the profiler's trace files (collective); their names."""
        if self.profiler is None or not self.cfg.output.trace:
            return []
        o, comm = self.cfg.output, self.comm
        return agreed(comm, "--trace", lambda: self.profiler.write_trace(
            o.trace, comm, merged=o.trace_merged)) or []

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


def run_metrics(cfg: RunConfig, dataset) -> list[str]:
    """``--metrics``, then those its dataset implies (``implied_metrics``: a text run logs
    its perplexity) that they lack."""
    from ..training.evaluation import metric_key
    keys = {metric_key(m) for m in cfg.optim.metrics}
    implied = [m for m in getattr(dataset, "implied_metrics", ()) if metric_key(m) not in keys]
    return [*cfg.optim.metrics, *implied]


def given_options(cfg: RunConfig) -> frozenset[str]:
    """The options whose values in ``cfg`` differ from their defaults: what a user gave,
    as far as the configuration shows (the command knows exactly: ``explicit``)."""
    default = build_config(TRAIN, {})
    out = set()
    for f in dataclasses.fields(cfg):
        section, base = getattr(cfg, f.name), getattr(default, f.name, None)
        if not dataclasses.is_dataclass(section) or base is None:
            continue
        out |= {g.name for g in dataclasses.fields(section)
                if getattr(section, g.name) != getattr(base, g.name, None)}
    return frozenset(out)


def _say_unavailable_methods(cfg: RunConfig) -> None:
    """Under --kernels measure or a plan file: one line naming the kernel methods that
    cannot run here and why (oneDNN's without its library); the run goes on without them."""
    from .. import kernels
    from ..kernels import registry
    line = registry.unavailable_line(kernels.backend() == "numba")
    if line and not cfg.output.quiet:
        print(line, flush=True)


def _check_predictions_file(cfg: RunConfig) -> None:
    """``distnn predict``'s --output names a file it can write."""
    output = cfg.predict.output
    if not output.lower().endswith((".npy", ".npz", ".csv")):
        raise RunError(f"--output: the file name must end in .npy, .npz or .csv, got "
                       f"{output!r}")
    if cfg.predict.predictions_per_rank and output.lower().endswith(".npy"):
        raise RunError(f"--output {output}: --predictions_per_rank writes each row's dataset "
                       "index too: give a .npz or .csv file")


def build_run(cfg: RunConfig, comm=None, *, splits=None, train=None, val=None,
              callbacks: Sequence = (), explicit: Iterable[str] | None = None,
              threads: int | None = None) -> Run:
    """Build the run ``cfg`` describes on every rank of ``comm`` (default: the
    communicator of ``distnn.distributed.init()``), as ``distnn train``, ``evaluate`` or
    ``predict`` does: threads per rank applied (``distributed.threads_per_rank``), the
    outputs and files checked (``preflight``), ``--resume``'s checkpoint read and compared.

    Args:
        splits: dataset splits already read (default: read them, ``load_data``).
        train, val: train on / validate with these instead of the splits' (a fold).
        callbacks: more callbacks, after the configuration's.
        explicit: the options the user gave, which a resumed run applies or refuses
            instead of taking the checkpoint's (default: those not at their default).
        threads: threads per rank decided by the caller (a search block takes the job's).
    """
    if comm is None:
        from .. import distributed as dist
        comm = dist.init()
    threads = _threads(cfg, comm, threads)
    apply_threads(threads)
    if apply_kernel_plan(cfg.parallel.kernels) != "fixed" and comm.rank == 0:
        _say_unavailable_methods(cfg)
    t = cfg.train
    training = cfg.command == TRAIN
    # Cheap checks first: a bad path or file ends the run before any data is read.
    state = None
    if training and t.resume:
        from .resume import load_resume
        state = load_resume(comm, t.resume, t.every_rank_writes)
    if cfg.command == PRED:
        _check_predictions_file(cfg)
    preflight.check_outputs(cfg, comm)
    rule = build_rule(cfg, comm) if training else None  # once: the readers ask it too
    if splits is None:
        splits = load_data(cfg, comm, rule)
    preflight.check_weights_file(cfg, comm)
    if cfg.command == PRED and getattr(splits, cfg.predict.split) is None:
        raise RunError(f"--split: dataset {cfg.data.dataset!r} has no {cfg.predict.split!r} "
                       "split (a val split needs --validation_split)")
    inspector = None
    if training and comm.size > 1:
        from ..distributed.stall import watch_stalls
        ck = t.checkpoint or t.resume
        inspector = watch_stalls(comm, cfg.parallel.stall_warning, cfg.parallel.stall_timeout,
                                 hint=f"the last checkpoint: --resume {ck}" if ck else "")
    train = splits.train if train is None else train
    val = splits.val if val is None else val
    what = "model" if training else "--weights_and_bias_filename"
    sliced = training and getattr(rule, "shard", 0) == 3 and not t.resume  # rank's slice only
    model = agreed(comm, what, lambda: build_model(cfg, train, comm, threads, sliced=sliced))
    if cfg.parallel.sync_batchnorm:
        from .. import distributed as dist
        dist.sync_batchnorm(model, comm)
    optimizer = agreed(comm, "optimizer", lambda: build_optimizer(cfg, model, comm.size))
    summary = cfg.summary(ranks=comm.size)  # recorded in the history file and TensorBoard
    configured = build_callbacks(cfg, comm.size, summary) if training else []
    validate = []
    if training and t.validate_every:  # a callback: --resume expects it
        if val is None:
            raise RunError("--validate_every needs validation data: --validation_split, "
                           "--test_as_validation or --val_list")
        from ..training.callbacks import ValidateEvery
        validate = [ValidateEvery(t.validate_every, val, max(t.batch_size, 256) * comm.size,
                                  t.steps_per_epoch)]
    profiler = None
    if cfg.output.profile or cfg.output.trace:
        from ..training.profiler import Profiler
        profiler = Profiler(trace=bool(cfg.output.trace), report=cfg.output.profile)
    from ..training import Trainer
    try:
        trainer = Trainer(model, optimizer, loss=cfg.optim.loss_func,
                          metrics=run_metrics(cfg, train), comm=comm,
                          callbacks=[*validate, *configured, *callbacks],
                          progress=not cfg.output.quiet, verbose=not cfg.output.quiet,
                          seed=cfg.model.random_seed, profiler=profiler, rule=rule,
                          ignore_nan=t.ignore_nan, stall=inspector)
        if rule is not None:
            rule.attach_data(train)  # a rule that cuts the data refuses it here, by name
    except ValueError as exc:  # the rule does not fit the model (same on every rank)
        raise rule_error(cfg.parallel, exc) from None
    trainer.run_info = summary
    run = Run(cfg, comm, splits, model, trainer, train, val, profiler, configured, threads,
              effective=cfg, lr=trainer.lr)
    if cfg.command in (TRAIN, EVAL):
        preflight.check_model_outputs(cfg, model, train)
    if training:
        _plan(run, state, explicit)
    return run


def _plan(run: Run, state, explicit: Iterable[str] | None) -> None:
    """A training run's batch sizes and learning rate, its resume plan, and what a later
    ``--resume`` compares (recorded in its checkpoints)."""
    from ..training import resolve_batch_sizes
    cfg, comm, trainer = run.cfg, run.comm, run.trainer
    names = list(trainer.metrics.names)
    preflight.check_monitors(cfg, names + [f"val_{k}" for k in names if run.val is not None]
                             + ["lr", "time", "samples_per_s"])
    t = cfg.train
    run.batch_size, run.global_batch_size = resolve_batch_sizes(t.batch_size,
                                                                t.global_batch_size, comm.size)
    if state is not None:
        given = given_options(cfg) if explicit is None else explicit
        plan = preflight.plan_resume(cfg, comm, set(given), state, trainer)
        run.batch_size, run.global_batch_size = plan.batch_size, plan.global_batch_size
        run.lr, run.effective, run.notes = plan.lr, plan.cfg, list(plan.notes)
        run.resume = state
    eff = run.effective
    for cb in run.callbacks:
        if hasattr(cb, "run"):
            cb.run = {"model": cfg.model.model, "optimizer": cfg.optim.optimizer,
                      "learning_rate": eff.optim.learning_rate,
                      "learning_rate_scaling": cfg.optim.learning_rate_scaling,
                      "ranks": comm.size, "batch_size": run.batch_size,
                      "global_batch_size": run.global_batch_size,
                      "random_seed": eff.model.random_seed}
