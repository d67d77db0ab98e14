"""Launching progs/ under real mpiexec for tests/distributed (a module of its own, not
conftest.py: "from conftest import" finds whichever conftest pytest loaded last when
several test folders are collected together)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from helpers import MPIEXEC, child_env

PROGS = Path(__file__).parent / "progs"


def mpirun(n: int, prog: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run progs/<prog> on n ranks; n == 0 runs it without mpiexec."""
    launcher = [MPIEXEC, "-n", str(n)] if n else []
    return subprocess.run(launcher + [sys.executable, str(PROGS / prog), *args],
                          capture_output=True, text=True, timeout=timeout, env=child_env())
