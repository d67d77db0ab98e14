"""The ``distnn`` command: train, evaluate, predict, generate, info, convert-imagenet,
plot, plan.

This is the only module that reads ``sys.argv`` and calls ``sys.exit`` (through the
console script). Options come from ``distnn.run.OPTIONS`` (with ``_`` or ``-``) and the
other systems' spellings of ``cli.compat``, optionally from ``--config FILE`` (TOML or a
Theano-MPI session file); ``compat.translate`` turns them into distnn's options (with
PyDTNN's meanings only through its door, ``--like pydtnn``) and
``distnn.run.build_config`` into the frozen configuration that ``cli.commands`` runs.
Under ``mpiexec -n N`` the same command runs on every rank; a crash on any rank aborts
the job.

Exit status: 0 on success, 2 for a bad option value or a user error (missing or malformed
data, weights or checkpoint file, an output that cannot be written...) with a one-line
message, 3 when training diverged (the loss became NaN/inf; see --ignore_nan), 1 for an
unexpected error (traceback).
"""
from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
from typing import Sequence

from ..run import ConfigError, RunConfig, RunError, build_config
from ..run.options import ALL
from . import compat
from .builders import make_comm, threads
from .cluster import add_cluster_parser, run_cluster
from .plan import add_plan_parser
from .plot import add_plot_parser
from .export import add_export_parser
from .generate import add_generate_parser
from .launch import add_launch_parser, run_launch
from .options import (_argtype, add_options, at_least, explicit_options, given_options, load_config,
                      resolve_values, spelled_flags)
from .commands import COMMANDS, PLAIN_COMMANDS
from .search import SEARCH, add_search_parser
from .search_run import main_search


PROG = "distnn"


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors ("distnn train: error: argument --x: ...")."""

    def error(self, message: str):
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise SystemExit(2)


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
        add_options(p, command, door=True)
    add_search_parser(sub)
    add_cluster_parser(sub)
    add_plot_parser(sub)
    add_plan_parser(sub)
    add_export_parser(sub)
    add_generate_parser(sub)
    add_launch_parser(sub)
    info = sub.add_parser("info", help="describe the MPI set-up (ranks, hosts, threads)",
                          allow_abbrev=False)
    info.add_argument("--parallel", type=_argtype(compat.option_of("parallel")),
                      default="auto", metavar="MODE", help="auto, sequential or data.")
    info.add_argument("--threads", type=_argtype(compat.option_of("threads")), default=0,
                      metavar="N", help="BLAS threads per rank, as for train (0: each "
                      "rank's cores divided among the ranks of its node that share them).")
    info.add_argument("--kernels", nargs="?", const="measure", default=None, metavar="PLAN",
                      help="Print each convolution of --model: its kernel method under PLAN "
                      "(fixed, measure (the default with --kernels) or plan:FILE), its "
                      "measured rate and the host's sgemm rate.")
    info.add_argument("--model", default="resnet20", metavar="NAME",
                      help="--kernels: the zoo model. Default: resnet20.")
    info.add_argument("--batch_size", "--batch-size", type=at_least(int, 1), default=64,
                      metavar="N", help="--kernels: samples of the step timed. Default: 64.")
    conv = sub.add_parser("convert-imagenet", allow_abbrev=False,
                          help="convert ImageNet TFRecord files into NPZ shards")
    conv.add_argument("tfrecord_files", nargs="+", metavar="FILE", help="TFRecord files.")
    conv.add_argument("--out_dir", "--out-dir", required=True, metavar="DIR",
                      help="Output folder of the shards.")
    conv.add_argument("--image_size", "--image-size", type=at_least(int, 1), default=224,
                      metavar="N", help="Side of the square images. Default: 224.")
    conv.add_argument("--shard_size", "--shard-size", type=at_least(int, 1), default=1024,
                      metavar="N", help="Images per shard. Default: 1024.")
    conv.add_argument("--split", choices=("train", "val"), default="train",
                      help="Split name of the shards. Default: train.")
    conv.add_argument("--compress", type=_argtype(compat.option_of("normalize")), nargs="?",
                      const=True, default=False, metavar="BOOL",
                      help="Write compressed .npz shards. Default: false.")
    return parser


def _after(argv: Sequence[str] | None, token: str) -> str:
    """Which flag an unrecognized ``token`` follows, when it looks like that flag's value
    (``--flip_images -1e5``: argparse takes '-1e5' for an option of its own)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    where = argv.index(token) if token in argv else 0
    before = argv[where - 1] if where > 0 else ""
    if before.startswith("-") and "=" not in before:
        return f" (after {before}: give its value as {before.split('=')[0]}=VALUE)"
    return ""


def _env_rank() -> int:
    """This process's rank from the launcher's environment (before MPI is initialized),
    so that errors found while parsing are printed once."""
    for var in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "MV2_COMM_WORLD_RANK"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """The validated RunConfig of a parsed train/evaluate/predict command line."""
    notes: list[str] = []
    file_values = load_config(args.config, notes) if getattr(args, "config", None) else {}
    values = resolve_values(given_options(args, args.command), file_values, notes,
                            spelled_flags(args), args.command,
                            getattr(args, "like", compat.DISTNN))
    return build_config(args.command, values, notes)


@contextlib.contextmanager
def _cprofile(path: str | None, comm, show: bool = False):
    """cProfile the command: dump to ``path`` and/or (``show``: PyDTNN's --profile) print
    the functions with the most cumulative time on rank 0."""
    if not path and not show:
        yield
        return
    import cProfile
    prof = cProfile.Profile()
    prof.enable()
    done = False
    try:
        yield
        done = True
    finally:
        prof.disable()
        error = None
        if path:
            import marshal

            from ..fileio import atomic_open, describe_os_error
            target = path if comm.size == 1 else f"{path}.rank{comm.rank}"
            try:
                prof.create_stats()
                with atomic_open(target) as f:
                    marshal.dump(prof.stats, f)
            except OSError as exc:
                error = RunError(f"--cprofile: could not write {target!r}: "
                                 f"{describe_os_error(exc)}")
                error.local = True  # this rank's own file: this rank reports it
        if show and comm.rank == 0:
            import pstats
            print("cProfile (rank 0), the 25 functions with the most cumulative time:",
                  flush=True)
            pstats.Stats(prof, stream=sys.stdout).sort_stats("cumulative").print_stats(25)
        if error is not None and done:
            raise error


# The library's errors name its Python arguments; the command's, its flags.
FLAGS = {"path": "--dataset_path"}
_ARGUMENT = re.compile(r"\b(" + "|".join(FLAGS) + r")=<")


def _fail(prog: str, message: str, show: bool, code: int = 2) -> int:
    message = _ARGUMENT.sub(lambda m: f"{FLAGS[m.group(1)]} <", message)
    if show:
        sys.stderr.write(f"{prog}: error: {message}\n")
        sys.stderr.flush()
    return code


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``distnn`` console script; returns the exit status."""
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        owner = parser.commands.get(args.command, parser)
        owner.error(f"unrecognized arguments: {' '.join(unknown)}{_after(argv, unknown[0])}")
    if args.command is None:
        parser.print_help(sys.stderr)
        return _fail(PROG, "choose a command: train, evaluate, predict, info, "
                     "convert-imagenet, search, cluster, plot, plan, launch, export, "
                     "generate", True)
    prog = f"{PROG} {args.command}"
    if args.command == SEARCH:
        return main_search(args, prog, _env_rank() == 0)
    if args.command in ("cluster", "launch"):
        try:
            return (run_cluster if args.command == "cluster" else run_launch)(args)
        except RunError as exc:
            return _fail(prog, str(exc), True)
    if args.command in PLAIN_COMMANDS:
        try:
            return PLAIN_COMMANDS[args.command](args)
        except RunError as exc:
            return _fail(prog, str(exc), True)
    try:
        cfg = config_from_args(args)
    except ConfigError as exc:  # the same on every rank, but for a module missing here
        return _fail(prog, str(exc), _env_rank() == 0 or getattr(exc, "local", False))
    comm = make_comm(cfg.parallel.parallel)
    from .. import distributed as dist
    show_tb = cfg.output.traceback
    with dist.abort_on_error(comm):
        try:
            if comm.rank == 0:
                for note in cfg.notes:
                    sys.stderr.write(f"{prog}: note: {note}\n")
            with threads(cfg, comm), _cprofile(cfg.output.cprofile, comm, cfg.output.profile):
                extra = {"explicit": explicit_options(args)} if args.command == "train" else {}
                return COMMANDS[args.command](cfg, comm, **extra)
        except (RunError, ConfigError) as exc:
            if show_tb:
                raise
            # Every rank got the same error (collective checks): rank 0 reports it.
            return _fail(prog, str(exc), comm.rank == 0 or getattr(exc, "local", False),
                         getattr(exc, "exit_code", 2))
        except KeyboardInterrupt:
            if comm.rank == 0:
                sys.stderr.write(f"{prog}: interrupted\n")
            return 130


if __name__ == "__main__":
    sys.exit(main())
