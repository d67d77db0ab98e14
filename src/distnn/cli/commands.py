"""The ``distnn`` subcommands (train, evaluate, predict, info, convert-imagenet) and
their rank-0 output.
"""
from __future__ import annotations

import argparse
import os
import time
from typing import Any, Callable

import numpy as np

from .builders import (UserError, _collective, build_augment, build_callbacks, build_model,
                       build_optimizer, load_data, load_splits, make_comm)  # noqa: F401
from .config import RunConfig


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("distnn")
    except PackageNotFoundError:
        return "unknown"


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
    from ..training import Trainer
    from .builders import build_rule
    p = cfg.parallel
    return Trainer(model, optimizer, loss=cfg.optim.loss_func, metrics=cfg.optim.metrics,
                   comm=comm, callbacks=callbacks, progress=not cfg.output.quiet,
                   verbose=not cfg.output.quiet, seed=cfg.model.random_seed,
                   bucket_size_mb=p.bucket_size_mb, non_blocking=p.non_blocking_mpi,
                   compression=None if p.gradient_compression == "none"
                   else p.gradient_compression, profiler=profiler,
                   rule=build_rule(cfg, comm) if cfg.command == "train" else None)


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
    splits = load_data(cfg, comm)
    model = _collective(comm, "model", lambda: build_model(cfg, splits.train))
    if cfg.parallel.sync_batchnorm:
        from .. import distributed as dist
        dist.sync_batchnorm(model, comm)
    optimizer = _collective(comm, "optimizer", lambda: build_optimizer(cfg, model, comm.size))
    callbacks = build_callbacks(cfg, comm.size)
    profiler = None
    if cfg.output.profile or cfg.output.trace:
        from ..training.profiler import Profiler
        profiler = Profiler(trace=bool(cfg.output.trace), report=cfg.output.profile)
    trainer = _trainer(cfg, comm, model, optimizer, callbacks, profiler)
    t = cfg.train
    from ..training import resolve_batch_sizes
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
    if t.validate_every:  # NNLO: a callback, so a --resume expects it too
        if splits.val is None:
            raise UserError("--validate_every needs validation data: --validation_split, "
                            "--test_as_validation or --val_list")
        from .seeds import make_validate_every
        trainer.callbacks.insert(0, make_validate_every(
            t.validate_every, splits.val, max(t.batch_size, 256) * comm.size,
            t.steps_per_epoch))
    if t.evaluate:  # PyDTNN's --evaluate true: before and after training
        _evaluate_test(cfg, console, trainer, splits.test, "Test (before training)")
    # --shared_storage false: every rank writes its own copy ('{rank}' -> its rank).
    from .seeds import rank_path
    history_file = t.history_file and rank_path(t.history_file, comm.rank)
    trainer.fit(splits.train, epochs=t.num_epochs, batch_size=t.batch_size,
                global_batch_size=t.global_batch_size, validation=splits.val,
                steps_per_epoch=t.steps_per_epoch, validation_steps=t.steps_per_epoch,
                shuffle=t.shuffle, augment=build_augment(cfg) or None,
                prefetch=cfg.data.prefetch, history_file=history_file, resume=t.resume,
                eval_batch_size=max(t.batch_size, 256))
    if not cfg.output.shared_storage and history_file:  # rank 0 wrote it in fit
        _collective(comm, "--history_file", lambda: comm.rank == 0
                    or trainer.history.save(history_file))
    if t.save_weights:
        weights = rank_path(t.save_weights, comm.rank)
        if cfg.output.shared_storage:
            _root_write(comm, "--save_weights", lambda: model.save_weights(weights))
        else:
            _collective(comm, "--save_weights", lambda: model.save_weights(weights))
        console.info(f"Weights written to {weights}")
    if t.evaluate is not False:
        _evaluate_test(cfg, console, trainer, splits.test)
    if profiler is not None and cfg.output.trace:
        files = profiler.write_trace(cfg.output.trace, comm, merged=cfg.output.trace_merged)
        if files:
            console.info(f"Trace written to {', '.join(files)}" if comm.size == 1 or
                         cfg.output.trace_merged else
                         f"Traces written to {cfg.output.trace}.rank0..{comm.size - 1}")
    return 0


def _check_checkpoint(path: str) -> None:
    from ..training.checkpoint import load_checkpoint
    load_checkpoint(path)


def run_evaluate(cfg: RunConfig, comm) -> int:
    console = Console(comm, cfg.output.quiet)
    splits = load_data(cfg, comm)
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
    splits = load_data(cfg, comm)
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
    from ..training import atomic_write_text
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
    from .. import distributed as dist
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
