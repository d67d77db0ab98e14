"""Launching progs/ under real mpiexec for tests/distributed (a module of its own, not
conftest.py: "from conftest import" finds whichever conftest pytest loaded last when
several test folders are collected together)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import MPIEXEC, SessionBatch, child_env, have_mpi4py

PROGS = Path(__file__).parent / "progs"
BATCH_PROG = Path(__file__).parents[1] / "batch_prog.py"


def mpirun(n: int, prog: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run progs/<prog> on n ranks; n == 0 runs it without mpiexec."""
    launcher = [MPIEXEC, "-n", str(n)] if n else []
    return subprocess.run(launcher + [sys.executable, str(PROGS / prog), *args],
                          capture_output=True, text=True, timeout=timeout, env=child_env())


def run_prog(n: int, prog: str, out, timeout: float = 300) -> None:
    """``progs/<prog> OUT`` on n ranks, which must succeed; the test is skipped without
    mpiexec and mpi4py."""
    if MPIEXEC is None or not have_mpi4py():
        pytest.skip("needs mpiexec and mpi4py")
    proc = mpirun(n, prog, str(out), timeout=timeout)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# One launch per number of ranks (tests/batch_prog.py) for the programs of the tests that
# batch theirs (conftest.py's ``prog_batch``): the programs leave their results in files,
# or print them; a program of its own, a failing one or one with an environment of its
# own keeps its own launch (``mpirun``).
def _command(n, cases, out):
    for case in cases:  # each program's own output folder, as its tmp_path was
        (out / case["name"]).mkdir(exist_ok=True)
    return [MPIEXEC, "-n", str(n), sys.executable, str(BATCH_PROG), str(out),
            json.dumps(cases).replace("@OUT@", str(out))]


def _done(n, case, out):
    return all((out / f"{case['name']}.rank{r}.done").is_file() for r in range(n))


BATCH = SessionBatch(_command, _done, lambda n: f"batch_prog.py on {n} ranks")


class Program:
    """``progs/<prog> OUT *args`` on n ranks in the session's batch: registered now (the
    test module's import), run when a test first asks for its results (``run``)."""

    def __init__(self, n: int, prog: str, *args: str, owner: str, timeout: float = 120):
        self.n, self.name = n, owner
        self.module = owner.split(".", 1)[0]
        BATCH.add(n, owner, {"name": owner, "prog": str(PROGS / prog),
                             "argv": ["@OUT@/" + owner, *args]}, timeout, self.module)

    def run(self, batch) -> tuple[Path, str]:
        """(the program's output folder, what its ranks printed, rank by rank); the test
        failed with the launch's output when the program failed."""
        why = batch(self.n).get(self.name)
        if why:
            pytest.fail(why, pytrace=False)
        out = BATCH.out[self.n]
        printed = "".join((out / f"{self.name}.rank{r}.done").read_text()
                          for r in range(self.n))
        return out / self.name, printed
