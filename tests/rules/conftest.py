"""Launching rule_prog.py (and the distnn command) under real mpiexec for tests/rules."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

PROG = Path(__file__).parent / "progs" / "rule_prog.py"


def _mpiexec() -> str | None:
    here = Path(sys.executable).parent / "mpiexec"
    return str(here) if here.exists() else shutil.which("mpiexec")


MPIEXEC = _mpiexec()


def _have_mpi4py() -> bool:
    import importlib.util
    return importlib.util.find_spec("mpi4py") is not None


needs_mpi = pytest.mark.skipif(MPIEXEC is None or not _have_mpi4py(),
                               reason="needs mpiexec and mpi4py")


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    return env


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
    exe = str(Path(sys.executable).parent / "distnn")
    launcher = [MPIEXEC, "-n", str(n)] if n else []
    return subprocess.run(launcher + [exe, *args], capture_output=True, text=True,
                          timeout=timeout, env=child_env(), cwd=cwd)
