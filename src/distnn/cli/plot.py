"""``distnn plot a/history.json b/history.json -o cmp.png``: the training curves of one run
or several on one figure (``distnn.training.plots``), each run labelled by the options in
which it differs from the others (the "run" entry of the history files ``--history_file``
writes; older files, and CSV files, are labelled by their name).
"""
from __future__ import annotations

import argparse
import os

from ..run import RunError

__all__ = ["add_plot_parser", "run_plot"]


def add_plot_parser(sub) -> argparse.ArgumentParser:
    """Add the ``plot`` subcommand to the ``distnn`` subparsers."""
    text = "draw the training curves of one or more runs from their --history_file files"
    p = sub.add_parser("plot", help=text, allow_abbrev=False,
                       description=text[0].upper() + text[1:] + " (loss and each metric per "
                       "epoch, training solid and validation dashed; a legend from the runs' "
                       "options).")
    p.add_argument("histories", nargs="+", metavar="HISTORY",
                   help="History files (JSON or CSV) written by distnn train --history_file.")
    p.add_argument("-o", "--output", default="curves.png", metavar="FILE.png",
                   help="The PNG to write. Default: curves.png.")
    p.add_argument("--labels", default=None, metavar="A,B,...",
                   help="Legend labels, one per history file (default: the options in which "
                   "the runs differ).")
    p.add_argument("--title", default=None, help="Title of the figure.")
    return p


def run_plot(args: argparse.Namespace) -> int:
    """``distnn plot``; a missing or unreadable file or package is a RunError (exit 2)."""
    from ..fileio import check_writable
    from ..training import History
    from ..training.plots import matplotlib_missing, plot_history, run_labels
    missing = matplotlib_missing()
    if missing:
        raise RunError(missing)
    histories = []
    for path in args.histories:
        try:
            histories.append(History.load(path))
        except FileNotFoundError:
            raise RunError(f"history file {path!r} does not exist; pass the files distnn "
                           "train --history_file wrote") from None
        except (OSError, ValueError) as exc:
            raise RunError(f"history file {path!r} cannot be read ({exc}); pass the files "
                           "distnn train --history_file wrote") from None
        if not len(histories[-1]):
            raise RunError(f"history file {path!r} holds no finished epoch")
    if args.labels is not None:
        labels = [s.strip() for s in args.labels.split(",")]
        if len(labels) != len(histories):
            raise RunError(f"--labels: give one label per history file ({len(histories)}), "
                           f"got {len(labels)}")
    else:
        names = [os.path.relpath(p) for p in args.histories]
        labels = run_labels([h.run for h in histories], names)
    reason = check_writable(args.output)
    if reason is not None:
        raise RunError(f"--output: cannot write {args.output!r}: {reason}")
    plot_history(args.output, histories, labels, title=args.title)
    print(f"Curves of {len(histories)} run{'s' * (len(histories) != 1)} drawn in "
          f"{args.output}: " + "; ".join(labels), flush=True)
    return 0
