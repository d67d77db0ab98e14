"""Launching rule_prog.py (and the distnn command) under real mpiexec for tests/rules (a
module of its own, not conftest.py: "from conftest import" finds whichever conftest pytest
loaded last when several test folders are collected together)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
from helpers import COMMAND, MPIEXEC, child_env

PROG = Path(__file__).parent / "progs" / "rule_prog.py"


def run_jobs(n: int, jobs: list[dict], out: Path, timeout: float = 90,
             prog: Path = PROG, stdout: bool = False) -> dict:
    """Run the jobs on n ranks with ``prog``; {job name: [per-rank {"npz", "json"}]}, and
    with ``stdout`` the ranks' output under "stdout"."""
    proc = subprocess.run([MPIEXEC, "-n", str(n), sys.executable, str(prog), str(out),
                           json.dumps(jobs)], capture_output=True, text=True,
                          timeout=timeout, env=child_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = {"stdout": proc.stdout} if stdout else {}
    for job in jobs:
        ranks = []
        for r in range(n):
            base = out / f"{job['name']}.rank{r}"
            with np.load(str(base) + ".npz") as z:
                arrays = {k: z[k] for k in z.files}
            ranks.append({**arrays, **json.loads(Path(str(base) + ".json").read_text())})
        results[job["name"]] = ranks
    return results


def run_cli(n: int, *args: str, timeout: float = 120, cwd=None) -> subprocess.CompletedProcess:
    launcher = [MPIEXEC, "-n", str(n)] if n else []
    return subprocess.run([*launcher, *COMMAND, *args], capture_output=True, text=True,
                          timeout=timeout, env=child_env(), cwd=cwd)
