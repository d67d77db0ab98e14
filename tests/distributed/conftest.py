"""Launching real MPI jobs from the tests of distnn.distributed."""
from __future__ import annotations

import pickle
import sys
from pathlib import Path

import pytest
from helpers import MPIEXEC, have_mpi4py
from mpijobs import BATCH, PROGS, mpirun

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


@pytest.fixture(scope="session")
def prog_batch(tmp_path_factory, request):
    """``prog_batch(n)``: the outcome of every program registered for n ranks
    (``mpijobs.Program``, of the collected test modules), run in one launch a session."""
    if MPIEXEC is None or not have_mpi4py():
        pytest.skip("needs mpiexec and mpi4py")
    modules = {Path(item.path).stem for item in request.session.items}
    root = tmp_path_factory.mktemp("prog_batch")
    return lambda n: BATCH.run(n, root / f"np{n}", modules)
