"""Interruptible waits (the stall inspector's mode for distnn search's blocks) on 2 and 3
real MPI ranks: same results as the blocking collectives, and a rank that fails ends the
others' waits with PeerFailed naming it, after which a new communicator works."""
import json

import pytest
from mpijobs import mpirun
from helpers import needs_mpi


@needs_mpi
@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 3])
def test_polled_collectives_and_a_failed_rank(n, tmp_path):
    proc = mpirun(n, "interruptible_prog.py", str(tmp_path), timeout=90)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = [json.loads((tmp_path / f"r{r}.json").read_text()) for r in range(n)]
    for r, res in enumerate(results):
        assert res["same"], (r, res)
        assert res["handle"] == [float(n)] * 4
        assert res["raised"] == (None if r == n - 1 else n - 1), (r, res)
        assert res["after"] == [float(n)] * 2
        assert res["watched"] and res["unwatched"], (r, res)
        assert res["steps"] == [10 + q for q in range(n)], (r, res)
