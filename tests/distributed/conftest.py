"""Launching real MPI jobs from the tests of distnn.distributed."""
from __future__ import annotations

import pickle
import sys

import pytest
from helpers import MPIEXEC, have_mpi4py
from mpijobs import PROGS, mpirun

sys.path.insert(0, str(PROGS))  # the tests import the progs' helpers


@pytest.fixture(scope="session", params=[2, 3], ids=lambda n: f"np{n}")
def main_results(request, tmp_path_factory):
    """Per-rank results of progs/main_prog.py on 2 and 3 ranks (one launch each)."""
    if MPIEXEC is None or not have_mpi4py():
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
