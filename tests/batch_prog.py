"""Runs test programs one after another in one process per rank, each as it runs alone:
as ``__main__`` (runpy), with ``sys.argv = [PROG, *ARGV]``, its folder first on
``sys.path``, what it prints captured. After each, every rank writes
``OUT/NAME.rank<R>.done`` (what the rank printed); a program that raises ends the job
on every rank (the tests' SessionBatch then runs the programs after it again).

Usage: batch_prog.py OUT CASES_JSON, CASES a list of {"name", "prog", "argv"}."""
from __future__ import annotations

import contextlib
import io
import json
import os
import runpy
import sys

from distnn import distributed as dist


def main() -> None:
    out, cases = sys.argv[1], json.loads(sys.argv[2])
    comm = dist.init()
    with dist.abort_on_error(comm):
        for case in cases:
            prog = case["prog"]
            sys.argv = [prog, *case["argv"]]
            folder = os.path.dirname(prog)
            if folder not in sys.path:
                sys.path.insert(0, folder)
            printed = io.StringIO()
            with contextlib.redirect_stdout(printed):
                runpy.run_path(prog, run_name="__main__")
            comm.barrier()  # every rank's part of this program is over before the next
            with open(f"{out}/{case['name']}.rank{comm.rank}.done", "w") as f:
                f.write(printed.getvalue())


if __name__ == "__main__":
    main()
