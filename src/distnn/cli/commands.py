"""The ``distnn`` subcommands (train, evaluate, predict, info, convert-imagenet, plot): each
checks what the command adds (outputs, resume), builds its run with ``distnn.run.build_run``
and formats the results on rank 0.
"""
from __future__ import annotations

import argparse
import os
import time
from typing import Any, Callable

import numpy as np

from ..fileio import describe_write_failure
from ..run import RunConfig, RunError, agreed, build_run, load_data
from .builders import make_comm
from .plot import run_plot


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("distnn")
    except PackageNotFoundError:
        return "unknown"


class Console:
    """Rank-0 output: parameters, summaries and results (stdout)."""

    def __init__(self, comm, quiet: bool, verbose: bool = False):
        self.root = comm.rank == 0
        self.quiet = quiet
        self.verbose = verbose

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
    """One summary line; with --verbose the resolved parameters (PyDTNN style) and the
    model summary; rank 0 only."""
    if console.quiet or not console.root:
        return
    sizes = ", ".join(f"{name} {len(ds)}" for name, ds in
                      (("train", splits.train), ("val", splits.val), ("test", splits.test))
                      if ds is not None)
    if not console.verbose:
        params = model.parameters_flat().size
        run = ", ".join(f"{k} {v}" for k, v in extra.items())
        console.info(f"distnn {_version()} {cfg.command}: {cfg.model.model} ({params:,} "
                     f"parameters) on {cfg.data.dataset} ({sizes}); {run} (--verbose lists "
                     "every option)")
        return
    lines = [f"distnn {_version()} {cfg.command}"]
    for title, items in cfg.items():
        lines.append(f"{title}:")
        width = max(len(k) for k, _ in items)
        lines += [f"  {k.ljust(width)} : {_fmt_value(v)}" for k, v in items]
    lines.append("Run:")
    width = max(len(k) for k in extra)
    lines += [f"  {k.ljust(width)} : {v}" for k, v in extra.items()]
    lines.append(f"Dataset {cfg.data.dataset}: {sizes} samples, input shape "
                 f"{splits.train.input_shape}, {splits.train.num_classes} classes")
    console.info("\n".join(lines))
    console.info(model.summary())


def _metrics_line(title: str, logs: dict, samples: int, seconds: float) -> str:
    parts = " ".join(f"{k}={v:.4f}" for k, v in logs.items())
    return f"{title}: {parts} ({samples} samples, {seconds:.2f} s)"


# -- commands ------------------------------------------------------------------------------
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


def run_train(cfg: RunConfig, comm, explicit: frozenset[str] = frozenset()) -> int:
    """``distnn train``. ``explicit``: the options the user gave (command line or config
    file), which a resumed run applies or refuses instead of taking the checkpoint's."""
    from ..run import preflight
    console = Console(comm, cfg.output.quiet, cfg.output.verbose)
    # Cheap checks first: a bad path or file ends the run before any data is read.
    state = None
    if cfg.train.resume:
        from ..training.checkpoint import load_checkpoint
        state = agreed(comm, "--resume", lambda: load_checkpoint(cfg.train.resume))
    preflight.check_outputs(cfg, comm)
    splits = load_data(cfg, comm)
    preflight.check_weights_file(cfg, comm)
    run = build_run(cfg, comm, splits=splits)
    preflight.check_model_outputs(cfg, run.model, run.train)
    trainer, callbacks = run.trainer, run.callbacks
    names = list(trainer.metrics.names)
    preflight.check_monitors(cfg, names + [f"val_{k}" for k in names if splits.val is not None]
                             + ["lr", "time", "samples_per_s"])
    t = cfg.train
    from ..training import resolve_batch_sizes
    local_bs, gbs = resolve_batch_sizes(t.batch_size, t.global_batch_size, comm.size)
    lr, header_cfg, notes = trainer.lr, cfg, []
    if state is not None:
        plan = preflight.plan_resume(cfg, comm, set(explicit), state, trainer)
        local_bs, gbs, lr, header_cfg, notes = (plan.batch_size, plan.global_batch_size,
                                                plan.lr, plan.cfg, plan.notes)
    for cb in callbacks:  # what a later --resume compares with
        if hasattr(cb, "run"):
            cb.run = {"model": cfg.model.model, "optimizer": cfg.optim.optimizer,
                      "learning_rate": header_cfg.optim.learning_rate,
                      "learning_rate_scaling": cfg.optim.learning_rate_scaling,
                      "ranks": comm.size, "batch_size": local_bs, "global_batch_size": gbs,
                      "random_seed": header_cfg.model.random_seed}
    from ..distributed import default_threads
    print_header(console, header_cfg, comm, run.model, splits, {
        "ranks": comm.size, "threads per rank": cfg.parallel.threads or default_threads(comm),
        "batch size per rank": local_bs, "global batch size": gbs,
        "learning rate": f"{lr:.6g}",
        "callbacks": ", ".join(type(c).__name__ for c in callbacks) or "-"})
    for note in notes:
        console.info(f"resume: {note}")
    if t.evaluate_only:
        _evaluate_test(cfg, console, trainer, splits.test)
        return 0
    if t.evaluate:  # true: before and after training
        _evaluate_test(cfg, console, trainer, splits.test, "Test (before training)")
    _fit(run, resume=state, global_batch_size=gbs if state is not None else None)
    if t.save_weights:
        console.info(f"Weights written to {run.save_weights(t.save_weights)}")
    if cfg.output.plot:
        from ..training.plots import plot_history
        history = trainer.history
        if len(history):
            agreed(comm, "--plot", lambda: plot_history(cfg.output.plot, history), root=0,
                   describe=describe_write_failure)
            console.info(f"Curves drawn in {cfg.output.plot}")
        else:
            console.info("--plot: no finished epoch to draw")
    if t.evaluate is not False:
        _evaluate_test(cfg, console, trainer, splits.test)
    profiler = run.profiler
    if profiler is not None and cfg.output.trace:
        files = agreed(comm, "--trace", lambda: profiler.write_trace(
            cfg.output.trace, comm, merged=cfg.output.trace_merged))
        if files:
            console.info(f"Trace written to {', '.join(files)}" if comm.size == 1 or
                         cfg.output.trace_merged else
                         f"Traces written to {cfg.output.trace}.rank0..{comm.size - 1}")
    return 0


class TrainingDiverged(RunError):
    """The loss became NaN/inf (exit status 3, one line)."""

    exit_code = 3


# Which option names the file a collective write could not write.
_WRITE_OPTIONS = {"checkpoint": "--checkpoint", "history": "--history_file",
                  "model_checkpoint weights": "--model_checkpoint_file"}


def _fit(run, **options) -> None:
    """``run.fit`` with the library's errors a user can cause turned into one-line messages
    naming the command's flags (every rank raises the same one, so every rank ends the same
    way)."""
    from ..fileio import WriteError
    from ..training.checkpoint import CheckpointError
    from ..training.trainer import NonFiniteLossError
    try:
        run.fit(**options)
    except CheckpointError as exc:
        raise RunError(f"--resume: {exc}") from None
    except WriteError as exc:
        raise RunError(f"{_WRITE_OPTIONS.get(exc.what, '--checkpoint')}: {exc}") from None
    except NonFiniteLossError as exc:
        raise TrainingDiverged(f"training diverged: {exc.where}; lower --learning_rate, or "
                               "pass --ignore_nan to keep training") from None


def run_evaluate(cfg: RunConfig, comm) -> int:
    from ..run import preflight
    console = Console(comm, cfg.output.quiet)
    preflight.check_outputs(cfg, comm)
    splits = load_data(cfg, comm)
    preflight.check_weights_file(cfg, comm)
    run = build_run(cfg, comm, splits=splits)
    preflight.check_model_outputs(cfg, run.model, run.train)
    trainer = run.trainer
    console.info(f"Evaluating {cfg.model.model} with weights "
                 f"{cfg.model.weights_and_bias_filename} on {cfg.data.dataset} (test, "
                 f"{comm.size} rank{'s' * (comm.size != 1)})")
    _evaluate_test(cfg, console, trainer, splits.test)
    return 0


def run_predict(cfg: RunConfig, comm) -> int:
    from ..run import preflight
    console = Console(comm, cfg.output.quiet)
    if not cfg.predict.output.lower().endswith((".npy", ".npz", ".csv")):
        raise RunError(f"--output: the file name must end in .npy, .npz or .csv, got "
                        f"{cfg.predict.output!r}")
    preflight.check_outputs(cfg, comm)
    splits = load_data(cfg, comm)
    preflight.check_weights_file(cfg, comm)
    dataset = getattr(splits, cfg.predict.split)
    if dataset is None:
        raise RunError(f"--split: dataset {cfg.data.dataset!r} has no {cfg.predict.split!r} "
                        "split (a val split needs --validation_split)")
    trainer = build_run(cfg, comm, splits=splits).trainer
    t0 = time.perf_counter()
    logits, labels = trainer.predict(dataset, batch_size=max(cfg.train.batch_size, 256),
                                     steps=cfg.train.steps_per_epoch, return_labels=True)
    agreed(comm, "--output", lambda: write_predictions(cfg.predict.output, logits, labels),
           root=0, describe=describe_write_failure)
    predicted = logits.argmax(axis=1)
    true = labels.argmax(axis=1) if labels.ndim == 2 else labels
    acc = float(np.mean(predicted == true)) if len(true) else float("nan")
    console.result(f"Predictions of {len(logits)} {cfg.predict.split} samples written to "
                   f"{cfg.predict.output} (accuracy={acc:.4f}, "
                   f"{time.perf_counter() - t0:.2f} s)")
    return 0


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
        from ..fileio import atomic_open
        with atomic_open(path) as f:
            np.savez(f, logits=logits, predicted=predicted, labels=true)
    elif low.endswith(".npy"):
        from ..fileio import atomic_open
        with atomic_open(path) as f:
            np.save(f, logits)
    else:
        raise ValueError(f"must end in .npy, .npz or .csv, got {path!r}")


def run_info(args) -> int:
    from .. import distributed as dist
    comm = make_comm(args.parallel)
    # The threads train would use: --threads, else this rank's cores shared among the
    # ranks of its node (each node decides for itself).
    asked = getattr(args, "threads", 0) or 0
    n = asked or dist.default_threads(comm)
    from threadpoolctl import threadpool_limits
    with threadpool_limits(limits=n):
        text = dist.describe(comm)
    rule = (f"{n} (--threads {asked})" if asked else
            f"{n} on rank 0's node (--threads 0: each node's cores shared among its ranks; "
            "per rank above)")
    if comm.rank == 0:
        print(f"distnn {_version()}\n{text}\nBLAS threads per rank in train: {rule}",
              flush=True)
    return 0


def run_convert(args) -> int:
    from ..data import convert_imagenet_tfrecords
    try:
        shards = convert_imagenet_tfrecords(args.tfrecord_files, args.out_dir,
                                            image_size=args.image_size,
                                            shard_size=args.shard_size, split=args.split,
                                            compress=args.compress)
    except (ValueError, OSError) as exc:
        raise RunError(str(exc)) from None
    folder = os.path.join(args.out_dir, args.split)
    print(f"Converted {len(args.tfrecord_files)} TFRecord file(s) into {len(shards)} "
          f"shard(s) in {folder}")
    return 0


COMMANDS: dict[str, Callable[[RunConfig, Any], int]] = {
    "train": run_train, "evaluate": run_evaluate, "predict": run_predict,
}
PLAIN_COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "info": run_info, "convert-imagenet": run_convert, "plot": run_plot,
}
