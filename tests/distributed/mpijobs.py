"""Launching progs/ under real mpiexec for tests/distributed (a module of its own, not
conftest.py: "from conftest import" finds whichever conftest pytest loaded last when
several test folders are collected together)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from helpers import MPIEXEC, child_env, have_mpi4py

PROGS = Path(__file__).parent / "progs"


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
