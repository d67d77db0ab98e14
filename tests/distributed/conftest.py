"""Launching real MPI jobs from the tests of distnn.distributed."""
from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PROGS = Path(__file__).parent / "progs"
sys.path.insert(0, str(PROGS))


def find_mpiexec() -> str | None:
    here = Path(sys.executable).parent / "mpiexec"
    if here.exists():
        return str(here)
    return shutil.which("mpiexec")


def _mpi4py_importable() -> bool:
    try:
        import importlib.util
        return importlib.util.find_spec("mpi4py") is not None
    except ImportError:
        return False


MPIEXEC = find_mpiexec()
needs_mpi = pytest.mark.skipif(MPIEXEC is None or not _mpi4py_importable(),
                               reason="needs mpiexec and mpi4py")


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    return env


def mpirun(n: int, prog: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run progs/<prog> on n ranks; n == 0 runs it without mpiexec."""
    launcher = [MPIEXEC, "-n", str(n)] if n else []
    return subprocess.run(launcher + [sys.executable, str(PROGS / prog), *args],
                          capture_output=True, text=True, timeout=timeout, env=child_env())


@pytest.fixture(scope="session", params=[2, 3], ids=lambda n: f"np{n}")
def main_results(request, tmp_path_factory):
    """Per-rank results of progs/main_prog.py on 2 and 3 ranks (one launch each)."""
    if MPIEXEC is None or not _mpi4py_importable():
        pytest.skip("needs mpiexec and mpi4py")
    n = request.param
    out = tmp_path_factory.mktemp(f"main_np{n}")
    proc = mpirun(n, "main_prog.py", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = []
    for r in range(n):
        with open(out / f"rank{r}.pkl", "rb") as f:
            results.append(pickle.load(f))
    return n, results
