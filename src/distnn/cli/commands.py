"""The ``distnn`` subcommands (train, evaluate, predict, info, convert-imagenet, plot): each
builds its run with ``distnn.run.build_run`` (which applies the threads, makes every check,
reads the data and plans a resume) and formats the results on rank 0.
"""
from __future__ import annotations

import argparse
import os
import time
from typing import Any, Callable

import numpy as np

from ..run import RunConfig, TrainingDiverged, build_run, threads_scope
from ..run.errors import RunError, rank_path
from ..run.outputs import write_predictions
from .builders import make_comm
from .export import run_export
from .generate import run_generate
from .plan import run_plan
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


def _model_label(cfg: RunConfig, model) -> str:
    """--model as given, and the zoo net it built when the input size picked another
    (``alexnet`` on ImageNet-sized images is ``alexnet_imagenet``)."""
    from ..models import zoo_name
    from ..models.files import is_model_spec
    given = cfg.model.model
    if is_model_spec(given) or getattr(model, "input_shape", None) is None:
        return given
    built = zoo_name(given, model.input_shape)
    if built == zoo_name(given):
        return given
    return f"{given} (the zoo's {built}, for {'x'.join(map(str, model.input_shape))} images)"


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
        label = _model_label(cfg, model)
        console.info(f"distnn {_version()} {cfg.command}: {label} ({params:,} "
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


def _rate(samples: int, seconds: float) -> str:
    return f"{samples / seconds:,.0f} samples/s" if seconds > 0 else "- samples/s"


def _metrics_line(title: str, logs: dict, samples: int, seconds: float) -> str:
    parts = " ".join(f"{k}={v:.4f}" for k, v in logs.items())
    return f"{title}: {parts} ({samples} samples, {seconds:.2f} s, {_rate(samples, seconds)})"


def _ranks(comm, run) -> str:
    return (f"{comm.size} rank{'s' * (comm.size != 1)} x {run.threads} "
            f"thread{'s' * (run.threads != 1)}")


# -- commands ------------------------------------------------------------------------------
def _evaluate_test(console, run, title="Test") -> dict:
    if run.splits.test is None:
        console.result(f"{title}: the dataset has no test split")
        return {}
    t0 = time.perf_counter()
    logs = run.evaluate()
    console.result(_metrics_line(title, logs, run.trainer.last_eval_count,
                                 time.perf_counter() - t0))
    return logs


def run_train(cfg: RunConfig, comm, explicit: frozenset[str] = frozenset()) -> int:
    """``distnn train``. ``explicit``: the options the user gave (command line or config
    file), which a resumed run applies or refuses instead of taking the checkpoint's."""
    from ..run.theanompi import model_class_spec, run_model_class
    theano_class = model_class_spec(cfg.model.model)
    if theano_class is not None:  # Theano-MPI's MODELFILE/MODELCLASS: its own loop
        run_model_class(cfg, comm, *theano_class, explicit=explicit)
        return 0
    console = Console(comm, cfg.output.quiet, cfg.output.verbose)
    run = build_run(cfg, comm, explicit=explicit)
    print_header(console, run.effective, comm, run.model, run.splits, {
        "ranks": comm.size, "threads per rank": run.threads,
        "batch size per rank": run.batch_size, "global batch size": run.global_batch_size,
        "learning rate": f"{run.lr:.6g}",
        "callbacks": ", ".join(type(c).__name__ for c in run.callbacks) or "-"})
    run.announce()
    t = cfg.train
    if t.evaluate_only:
        _evaluate_test(console, run)
        return 0
    if t.evaluate:  # true: before and after training
        _evaluate_test(console, run, "Test (before training)")
    history = run.fit()
    if t.save_weights:
        console.info(f"Weights written to {rank_path(t.save_weights, comm.rank)}")
    if cfg.output.plot:
        console.info(f"Curves drawn in {cfg.output.plot}" if len(history) else
                     "--plot: no finished epoch to draw")
    if t.evaluate is not False:
        _evaluate_test(console, run)
    files = run.write_trace()
    if files:
        console.info(f"Trace written to {', '.join(files)}" if comm.size == 1 or
                     cfg.output.trace_merged else
                     f"Traces written to {cfg.output.trace}.rank0..{comm.size - 1}")
    return 0


def run_evaluate(cfg: RunConfig, comm) -> int:
    console = Console(comm, cfg.output.quiet)
    run = build_run(cfg, comm)
    console.info(f"Evaluating {cfg.model.model} with weights "
                 f"{cfg.model.weights_and_bias_filename} on {cfg.data.dataset} (test, "
                 f"{_ranks(comm, run)})")
    _evaluate_test(console, run)
    return 0


def run_predict(cfg: RunConfig, comm) -> int:
    console = Console(comm, cfg.output.quiet)
    run = build_run(cfg, comm)
    t0 = time.perf_counter()
    logits, labels = run.predict()
    seconds = time.perf_counter() - t0
    true = labels.argmax(axis=1) if labels.ndim == 2 else labels
    counts = np.array([np.sum(logits.argmax(axis=1) == true), len(true)], np.float64)
    where = cfg.predict.output
    if cfg.predict.predictions_per_rank:  # each rank has its rows only: count them all
        from ..run.outputs import per_rank_path
        comm.allreduce_(counts, "sum")
        where = f"{per_rank_path(where, 0)} .. {per_rank_path(where, comm.size - 1)}"
    acc = counts[0] / counts[1] if counts[1] else float("nan")
    n = int(counts[1])
    console.result(f"Predictions of {n} {cfg.predict.split} samples written to {where} "
                   f"(accuracy={acc:.4f}, {seconds:.2f} s, {_rate(n, seconds)}; "
                   f"{_ranks(comm, run)})")
    return 0


def run_info(args) -> int:
    from .. import distributed as dist
    comm = make_comm(args.parallel)
    # The threads train would use: --threads, else this rank's cores shared among the
    # ranks of its node (each node decides for itself).
    asked = getattr(args, "threads", 0) or 0
    n = dist.threads_per_rank(comm, asked)
    with threads_scope(n):
        text = dist.describe(comm, asked)
    rule = (f"{n} (--threads {asked})" if asked else
            f"{n} on rank 0's node (--threads 0: each node's cores shared among its ranks; "
            "per rank above)")
    if comm.rank == 0:
        print(f"distnn {_version()}\n{text}\nBLAS threads per rank in train: {rule}",
              flush=True)
    plan = getattr(args, "kernels", None)
    if plan is not None and comm.rank == 0:
        from .kernel_info import kernel_report
        try:
            with threads_scope(n):
                report = kernel_report(args.model, plan, args.batch_size)
        except ValueError as exc:
            raise RunError(str(exc)) from None
        print(report, flush=True)
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


__all__ = ["COMMANDS", "PLAIN_COMMANDS", "TrainingDiverged", "write_predictions",
           "run_train", "run_evaluate", "run_predict", "run_info", "run_convert"]

COMMANDS: dict[str, Callable[[RunConfig, Any], int]] = {
    "train": run_train, "evaluate": run_evaluate, "predict": run_predict,
}
PLAIN_COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "info": run_info, "convert-imagenet": run_convert, "plot": run_plot,
    "export": run_export, "plan": run_plan, "generate": run_generate,
}
