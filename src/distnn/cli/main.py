"""The ``distnn`` command: train, evaluate, predict, info, convert-imagenet.

This is the only module that reads ``sys.argv`` and calls ``sys.exit`` (through the
console script). Options come from ``cli.config.OPTIONS`` (PyDTNN's launcher names, with
``_`` or ``-``), optionally from ``--config FILE.toml``; they become frozen config
dataclasses, which the functions here turn into library calls. Under ``mpiexec -n N`` the
same command runs on every rank; a crash on any rank aborts the job.

Exit status: 0 on success, 2 for a bad option value or a user error (missing or malformed
data or weights file...) with a one-line message, 1 for an unexpected error (traceback).
"""
from __future__ import annotations

import argparse
import contextlib
import inspect
import os
import sys
import time
from typing import Any, Callable, Sequence

import numpy as np

from .config import (ALL, GROUPS, OPTION_BY_NAME, OPTIONS, TRAIN, Bool, ConfigError,
                     RunConfig, build_config, load_toml, resolve_values)

PROG = "distnn"


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("distnn")
    except PackageNotFoundError:
        return "unknown"


class UserError(Exception):
    """An error caused by the user's input, reported in one line with exit status 2."""


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors ("distnn train: error: argument --x: ...")."""

    def error(self, message: str):
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise SystemExit(2)


def _argtype(option) -> Callable[[str], Any]:
    def convert(text: str):
        try:
            return option.kind.parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    convert.__name__ = option.name
    return convert


def _default_text(value) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ",".join(map(str, value)) or "''"
    return str(value)


def _add_options(parser: argparse.ArgumentParser, command: str) -> None:
    parser.add_argument("--config", metavar="FILE", default=argparse.SUPPRESS,
                        help="TOML file of option values (keys are the option names below); "
                             "command-line options override it.")
    groups = {}
    for option in OPTIONS:
        if command not in option.commands:
            continue
        if option.group not in groups:
            groups[option.group] = parser.add_argument_group(GROUPS[option.group])
        extra: dict[str, Any] = {}
        if isinstance(option.kind, Bool):
            extra = {"nargs": "?", "const": True}
        choices = getattr(option.kind, "choices", None)
        choice_text = ""
        if choices is not None and option.name not in ("model",):
            choice_text = f" Choices: {', '.join(choices)}."
        groups[option.group].add_argument(
            *option.flags(), dest=option.name, type=_argtype(option), metavar=option.kind.metavar,
            help=f"{option.help}{choice_text} Default: {_default_text(option.default)}.",
            **extra)


def build_parser() -> argparse.ArgumentParser:
    """The ``distnn`` parser with its subcommands."""
    parser = _Parser(prog=PROG, description="Distributed training and inference of neural "
                     "networks over MPI (run under mpiexec -n N for data parallelism).",
                     allow_abbrev=False)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    parser.commands = sub.choices  # name -> subparser, for errors in the subcommand's name
    helps = {"train": "train a model (default: simplecnn on Fashion-MNIST)",
             "evaluate": "report the loss and metrics of saved weights on the test set",
             "predict": "write the predictions of saved weights for a dataset split"}
    for command in ALL:
        text = helps[command]
        p = sub.add_parser(command, help=text, description=text[0].upper() + text[1:] + ".",
                           argument_default=argparse.SUPPRESS, allow_abbrev=False)
        _add_options(p, command)
    info = sub.add_parser("info", help="describe the MPI set-up (ranks, hosts, threads)",
                          allow_abbrev=False)
    info.add_argument("--parallel", type=_argtype(OPTION_BY_NAME["parallel"]),
                      default="auto", metavar="MODE", help="auto, sequential or data.")
    conv = sub.add_parser("convert-imagenet", allow_abbrev=False,
                          help="convert ImageNet TFRecord files into NPZ shards")
    conv.add_argument("tfrecord_files", nargs="+", metavar="FILE", help="TFRecord files.")
    conv.add_argument("--out_dir", "--out-dir", required=True, metavar="DIR",
                      help="Output folder of the shards.")
    conv.add_argument("--image_size", "--image-size", type=_positive_int, default=224,
                      metavar="N", help="Side of the square images. Default: 224.")
    conv.add_argument("--shard_size", "--shard-size", type=_positive_int, default=1024,
                      metavar="N", help="Images per shard. Default: 1024.")
    conv.add_argument("--split", choices=("train", "val"), default="train",
                      help="Split name of the shards. Default: train.")
    conv.add_argument("--compress", type=_argtype(OPTION_BY_NAME["normalize"]), nargs="?",
                      const=True, default=False, metavar="BOOL",
                      help="Write compressed .npz shards. Default: false.")
    return parser


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return value


# -- set-up shared by the commands --------------------------------------------------------
def _env_rank() -> int:
    """This process's rank from the launcher's environment (before MPI is initialized),
    so that errors found while parsing are printed once."""
    for var in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "MV2_COMM_WORLD_RANK"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0


def make_comm(parallel: str):
    """LocalComm for 'sequential'; the MPI world (size 1 without mpiexec) otherwise."""
    from .. import dist
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
    common = dict(dtype=np.dtype(cfg.model.dtype), normalize=d.normalize,
                  seed=cfg.model.random_seed, **reader_options)
    training = cfg.command == TRAIN and not cfg.train.evaluate_only
    test_as_val = training and d.test_as_validation
    splits = load_dataset(d.dataset, path=d.dataset_path,
                          validation_split=0.0 if test_as_val or not training
                          else d.validation_split,
                          test_as_validation=test_as_val, **common)
    if d.dataset_test_path:
        from ..data import Splits
        test = load_dataset(d.dataset, path=d.dataset_test_path, **common).test
        splits = Splits(splits.train, test if test_as_val else splits.val, test)
    return splits


READER_OPTIONS = ("download", "train_list", "val_list", "test_list", "features_name", "labels_name",
                  "input_shape", "num_classes", "num_samples")


def build_model(cfg: RunConfig, dataset):
    from ..models import get_model
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
    from ..callbacks import WarmUp
    start = 1.0 / ctx["size"] if ctx["scaled"] and ctx["size"] > 1 else 0.0
    return WarmUp(epochs=s.warm_up_epochs, batches=s.warm_up_batches, start_factor=start)


def _early_stopping(s, ctx):
    from ..callbacks import EarlyStopping
    return EarlyStopping(s.early_stopping_metric, patience=s.early_stopping_patience,
                         min_delta=s.early_stopping_min_delta,
                         restore_best_weights=s.early_stopping_restore_best)


def _reduce_lr_on_plateau(s, ctx):
    from ..callbacks import ReduceLROnPlateau
    return ReduceLROnPlateau(s.reduce_lr_on_plateau_metric, factor=s.reduce_lr_on_plateau_factor,
                             patience=s.reduce_lr_on_plateau_patience,
                             min_lr=s.reduce_lr_on_plateau_min_lr)


def _reduce_lr_every_nepochs(s, ctx):
    from ..callbacks import ReduceLREveryNEpochs
    return ReduceLREveryNEpochs(s.reduce_lr_every_nepochs_nepochs,
                                factor=s.reduce_lr_every_nepochs_factor,
                                min_lr=s.reduce_lr_every_nepochs_min_lr)


def _stop_at_loss(s, ctx):
    from ..callbacks import TargetMetric, metric_mode
    op = ">=" if metric_mode(s.stop_at_loss_metric) == "max" else "<="
    return TargetMetric(s.stop_at_loss_metric, op, s.stop_at_loss_threshold)


def _model_checkpoint(s, ctx):
    from ..callbacks import ModelCheckpoint
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
    from ..callbacks import (TrainingCheckpoint, parse_early_stopping, parse_target_metric)
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
    if cfg.train.checkpoint:
        callbacks.append(TrainingCheckpoint(cfg.train.checkpoint, cfg.train.checkpoint_freq))
    return callbacks


def build_augment(cfg: RunConfig) -> list:
    from ..data import RandomCrop, RandomFlip
    d = cfg.data
    out = []
    if d.flip_images:
        out.append(RandomFlip(d.flip_images_prob))
    if d.crop_images:
        out.append(RandomCrop(d.crop_images_padding, d.crop_images_prob))
    return out


class Console:
    """Rank-0 output: parameters, summaries and results (stdout)."""

    def __init__(self, comm, quiet: bool):
        self.root = comm.rank == 0
        self.quiet = quiet

    def info(self, text: str) -> None:
        if self.root and not self.quiet:
            print(text, flush=True)

    def result(self, text: str) -> None:
        if self.root:
            print(text, flush=True)


def _fmt_value(value) -> str:
    if isinstance(value, tuple):
        return ",".join(map(str, value)) or "-"
    return "-" if value is None else str(value)


def print_header(console: Console, cfg: RunConfig, comm, model, splits, extra: dict) -> None:
    """The resolved parameters (PyDTNN style) and the model summary, rank 0 only."""
    if console.quiet or not console.root:
        return
    lines = [f"distnn {_version()} {cfg.command}"]
    for title, items in cfg.items():
        lines.append(f"{title}:")
        width = max(len(k) for k, _ in items)
        lines += [f"  {k.ljust(width)} : {_fmt_value(v)}" for k, v in items]
    lines.append("Run:")
    width = max(len(k) for k in extra)
    lines += [f"  {k.ljust(width)} : {v}" for k, v in extra.items()]
    sizes = ", ".join(f"{name} {len(ds)}" for name, ds in
                      (("train", splits.train), ("val", splits.val), ("test", splits.test))
                      if ds is not None)
    lines.append(f"Dataset {cfg.data.dataset}: {sizes} samples, input shape "
                 f"{splits.train.input_shape}, {splits.train.num_classes} classes")
    console.info("\n".join(lines))
    console.info(model.summary())


def _metrics_line(title: str, logs: dict, samples: int, seconds: float) -> str:
    parts = " ".join(f"{k}={v:.4f}" for k, v in logs.items())
    return f"{title}: {parts} ({samples} samples, {seconds:.2f} s)"


# -- commands ------------------------------------------------------------------------------
def _trainer(cfg: RunConfig, comm, model, optimizer, callbacks=(), profiler=None):
    from ..train import Trainer
    p = cfg.parallel
    return Trainer(model, optimizer, loss=cfg.optim.loss_func, metrics=cfg.optim.metrics,
                   comm=comm, callbacks=callbacks, progress=not cfg.output.quiet,
                   verbose=not cfg.output.quiet, seed=cfg.model.random_seed,
                   bucket_size_mb=p.bucket_size_mb, non_blocking=p.non_blocking_mpi,
                   compression=None if p.gradient_compression == "none"
                   else p.gradient_compression, profiler=profiler)


def _evaluate_test(cfg, console, trainer, test, title="Test") -> dict:
    if test is None:
        console.result(f"{title}: the dataset has no test split")
        return {}
    t0 = time.perf_counter()
    logs = trainer.evaluate(test, batch_size=max(cfg.train.batch_size, 256),
                            steps=cfg.train.steps_per_epoch)
    console.result(_metrics_line(title, logs, trainer.last_eval_count,
                                 time.perf_counter() - t0))
    return logs


def run_train(cfg: RunConfig, comm) -> int:
    console = Console(comm, cfg.output.quiet)
    splits = _collective(comm, "dataset", lambda: load_splits(cfg, comm))
    model = _collective(comm, "model", lambda: build_model(cfg, splits.train))
    if cfg.parallel.sync_batchnorm:
        from .. import dist
        dist.sync_batchnorm(model, comm)
    optimizer = _collective(comm, "optimizer", lambda: build_optimizer(cfg, model, comm.size))
    callbacks = build_callbacks(cfg, comm.size)
    profiler = None
    if cfg.output.profile or cfg.output.trace:
        from ..profiler import Profiler
        profiler = Profiler(trace=bool(cfg.output.trace), report=cfg.output.profile)
    trainer = _trainer(cfg, comm, model, optimizer, callbacks, profiler)
    t = cfg.train
    from ..train import resolve_batch_sizes
    local_bs, gbs = resolve_batch_sizes(t.batch_size, t.global_batch_size, comm.size)
    print_header(console, cfg, comm, model, splits, {
        "ranks": comm.size, "batch size per rank": local_bs, "global batch size": gbs,
        "learning rate": trainer.lr, "callbacks": ", ".join(type(c).__name__ for c in callbacks)
        or "-"})
    if t.evaluate_only:
        _evaluate_test(cfg, console, trainer, splits.test)
        return 0
    if t.resume:
        _collective(comm, "--resume", lambda: _check_checkpoint(t.resume))
    trainer.fit(splits.train, epochs=t.num_epochs, batch_size=t.batch_size,
                global_batch_size=t.global_batch_size, validation=splits.val,
                steps_per_epoch=t.steps_per_epoch, validation_steps=t.steps_per_epoch,
                shuffle=t.shuffle, augment=build_augment(cfg) or None,
                prefetch=cfg.data.prefetch, history_file=t.history_file, resume=t.resume,
                eval_batch_size=max(t.batch_size, 256))
    if t.save_weights:
        _root_write(comm, "--save_weights", lambda: model.save_weights(t.save_weights))
        console.info(f"Weights written to {t.save_weights}")
    if t.evaluate:
        _evaluate_test(cfg, console, trainer, splits.test)
    if profiler is not None and cfg.output.trace:
        files = profiler.write_trace(cfg.output.trace, comm, merged=cfg.output.trace_merged)
        if files:
            console.info(f"Trace written to {', '.join(files)}" if comm.size == 1 or
                         cfg.output.trace_merged else
                         f"Traces written to {cfg.output.trace}.rank0..{comm.size - 1}")
    return 0


def _check_checkpoint(path: str) -> None:
    from ..checkpoint import load_checkpoint
    load_checkpoint(path)


def run_evaluate(cfg: RunConfig, comm) -> int:
    console = Console(comm, cfg.output.quiet)
    splits = _collective(comm, "dataset", lambda: load_splits(cfg, comm))
    model = _collective(comm, "--weights_and_bias_filename",
                        lambda: build_model(cfg, splits.train))
    trainer = _trainer(cfg, comm, model, _collective(
        comm, "optimizer", lambda: build_optimizer(cfg, model, comm.size)))
    console.info(f"Evaluating {cfg.model.model} with weights "
                 f"{cfg.model.weights_and_bias_filename} on {cfg.data.dataset} (test, "
                 f"{comm.size} rank{'s' * (comm.size != 1)})")
    _evaluate_test(cfg, console, trainer, splits.test)
    return 0


def run_predict(cfg: RunConfig, comm) -> int:
    console = Console(comm, cfg.output.quiet)
    splits = _collective(comm, "dataset", lambda: load_splits(cfg, comm))
    dataset = getattr(splits, cfg.predict.split)
    if dataset is None:
        raise UserError(f"--split: dataset {cfg.data.dataset!r} has no {cfg.predict.split!r} "
                        "split (a val split needs --validation_split)")
    model = _collective(comm, "--weights_and_bias_filename",
                        lambda: build_model(cfg, splits.train))
    trainer = _trainer(cfg, comm, model, build_optimizer(cfg, model, comm.size))
    t0 = time.perf_counter()
    logits, labels = trainer.predict(dataset, batch_size=max(cfg.train.batch_size, 256),
                                     steps=cfg.train.steps_per_epoch, return_labels=True)
    _root_write(comm, "--output", lambda: write_predictions(cfg.predict.output, logits, labels))
    predicted = logits.argmax(axis=1)
    true = labels.argmax(axis=1) if labels.ndim == 2 else labels
    acc = float(np.mean(predicted == true)) if len(true) else float("nan")
    console.result(f"Predictions of {len(logits)} {cfg.predict.split} samples written to "
                   f"{cfg.predict.output} (accuracy={acc:.4f}, "
                   f"{time.perf_counter() - t0:.2f} s)")
    return 0


def _root_write(comm, what: str, write: Callable[[], None]) -> None:
    """Rank 0 writes; a failure becomes a UserError on every rank (no rank left waiting)."""
    error = None
    if comm.rank == 0:
        try:
            write()
        except (OSError, ValueError, UserError) as exc:
            error = f"{what}: {exc}"
    if comm.size > 1:
        error = comm.bcast_obj(error, 0)
    if error is not None:
        raise UserError(error)


def write_predictions(path: str, logits: np.ndarray, labels: np.ndarray) -> None:
    """Write predictions: .npy logits, .npz (logits, predicted, labels) or .csv rows."""
    from ..train import atomic_write_text
    predicted = logits.argmax(axis=1)
    true = labels.argmax(axis=1) if labels.ndim == 2 else labels
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    low = path.lower()
    if low.endswith(".csv"):
        def write(f):
            f.write("index,predicted,label\n")
            for i, (p, t) in enumerate(zip(predicted, true)):
                f.write(f"{i},{p},{t}\n")
        atomic_write_text(path, write)
    elif low.endswith(".npz"):
        np.savez(path, logits=logits, predicted=predicted, labels=true)
    elif low.endswith(".npy"):
        np.save(path, logits)
    else:
        raise ValueError(f"must end in .npy, .npz or .csv, got {path!r}")


def run_info(args) -> int:
    from .. import dist
    comm = make_comm(args.parallel)
    text = dist.describe(comm)
    if comm.rank == 0:
        print(f"distnn {_version()}\n{text}", flush=True)
    return 0


def run_convert(args) -> int:
    from ..data import convert_imagenet_tfrecords
    try:
        shards = convert_imagenet_tfrecords(args.tfrecord_files, args.out_dir,
                                            image_size=args.image_size,
                                            shard_size=args.shard_size, split=args.split,
                                            compress=args.compress)
    except (ValueError, OSError) as exc:
        raise UserError(str(exc)) from None
    folder = os.path.join(args.out_dir, args.split)
    print(f"Converted {len(args.tfrecord_files)} TFRecord file(s) into {len(shards)} "
          f"shard(s) in {folder}")
    return 0


COMMANDS: dict[str, Callable[[RunConfig, Any], int]] = {
    "train": run_train, "evaluate": run_evaluate, "predict": run_predict,
}
PLAIN_COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "info": run_info, "convert-imagenet": run_convert,
}


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """The validated RunConfig of a parsed train/evaluate/predict command line."""
    given = {o.name: getattr(args, o.name) for o in OPTIONS if hasattr(args, o.name)}
    file_values = load_toml(args.config) if getattr(args, "config", None) else {}
    return build_config(args.command, resolve_values(given, file_values))


@contextlib.contextmanager
def _threads(cfg: RunConfig, size: int):
    n = cfg.parallel.threads or (1 if size > 1 else 0)
    if not n:
        yield
        return
    from threadpoolctl import threadpool_limits
    with threadpool_limits(limits=n):
        yield


@contextlib.contextmanager
def _cprofile(path: str | None, comm):
    if not path:
        yield
        return
    import cProfile
    prof = cProfile.Profile()
    prof.enable()
    try:
        yield
    finally:
        prof.disable()
        target = path if comm.size == 1 else f"{path}.rank{comm.rank}"
        prof.dump_stats(target)


def _fail(prog: str, message: str, show: bool) -> int:
    if show:
        sys.stderr.write(f"{prog}: error: {message}\n")
        sys.stderr.flush()
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``distnn`` console script; returns the exit status."""
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        owner = parser.commands.get(args.command, parser)
        owner.error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.command is None:
        parser.print_help(sys.stderr)
        return _fail(PROG, "choose a command: train, evaluate, predict, info, "
                     "convert-imagenet", True)
    prog = f"{PROG} {args.command}"
    if args.command in PLAIN_COMMANDS:
        try:
            return PLAIN_COMMANDS[args.command](args)
        except UserError as exc:
            return _fail(prog, str(exc), True)
    try:
        cfg = config_from_args(args)
    except ConfigError as exc:
        return _fail(prog, str(exc), _env_rank() == 0)
    comm = make_comm(cfg.parallel.parallel)
    from .. import dist
    show_tb = cfg.output.traceback
    with dist.abort_on_error(comm):
        try:
            with _threads(cfg, comm.size), _cprofile(cfg.output.cprofile, comm):
                return COMMANDS[args.command](cfg, comm)
        except (UserError, ConfigError) as exc:
            if show_tb:
                raise
            # Every rank got the same error (collective checks): rank 0 reports it.
            return _fail(prog, str(exc), comm.rank == 0)
        except KeyboardInterrupt:
            if comm.rank == 0:
                sys.stderr.write(f"{prog}: interrupted\n")
            return 130


if __name__ == "__main__":
    sys.exit(main())
