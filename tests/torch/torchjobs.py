"""Launching real MPI jobs and the distnn command from the tests of distnn.torch."""
from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

from helpers import COMMAND, MPIEXEC, child_env, needs_mpi  # noqa: F401 (re-exported)

ROOT = Path(__file__).resolve().parents[2]
PROGS = Path(__file__).parent / "progs"
EXAMPLES = ROOT / "examples"


def mpirun(n: int, *argv: str, cwd=None, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run argv on n ranks (n == 0: without mpiexec)."""
    launcher = [MPIEXEC, "-n", str(n)] if n else []
    return subprocess.run(launcher + [str(a) for a in argv], capture_output=True, text=True,
                          timeout=timeout, env=child_env(), cwd=cwd)


def distnn(n: int, *args, cwd, timeout: float = 300) -> subprocess.CompletedProcess:
    """The real ``distnn`` command on n ranks (0: one process without mpiexec)."""
    return mpirun(n, *COMMAND, *args, cwd=cwd, timeout=timeout)


def prog_ranks(prog: str, n: int, out: Path, timeout: float = 120) -> list:
    """Run ``progs/<prog> OUT`` on n ranks; what each rank pickled to OUT/rank<r>.pkl, in
    rank order."""
    proc = mpirun(n, sys.executable, PROGS / prog, out, timeout=timeout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = []
    for r in range(n):
        with open(out / f"rank{r}.pkl", "rb") as f:
            results.append(pickle.load(f))
    return results
