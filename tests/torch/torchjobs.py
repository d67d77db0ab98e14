"""Launching real MPI jobs and the distnn command from the tests of distnn.torch."""
from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest



ROOT = Path(__file__).resolve().parents[2]
PROGS = Path(__file__).parent / "progs"
EXAMPLES = ROOT / "examples"
BIN = Path(sys.executable).parent / "distnn"
COMMAND = [str(BIN)] if BIN.exists() else [sys.executable, "-m", "distnn.cli.main"]


def _mpiexec() -> str | None:
    here = Path(sys.executable).parent / "mpiexec"
    return str(here) if here.exists() else shutil.which("mpiexec")


MPIEXEC = _mpiexec()
needs_mpi = pytest.mark.skipif(MPIEXEC is None or importlib.util.find_spec("mpi4py") is None,
                               reason="needs mpiexec and mpi4py")


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    return env


def mpirun(n: int, *argv: str, cwd=None, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run argv on n ranks (n == 0: without mpiexec)."""
    launcher = [MPIEXEC, "-n", str(n)] if n else []
    return subprocess.run(launcher + [str(a) for a in argv], capture_output=True, text=True,
                          timeout=timeout, env=child_env(), cwd=cwd)


def distnn(n: int, *args, cwd, timeout: float = 300) -> subprocess.CompletedProcess:
    """The real ``distnn`` command on n ranks (0: one process without mpiexec)."""
    return mpirun(n, *COMMAND, *args, cwd=cwd, timeout=timeout)
