"""Failure behaviour and the set-up report."""
import time

import pytest

from mpijobs import mpirun
from helpers import needs_mpi
from distnn.distributed import LocalComm, abort_on_error, describe


@needs_mpi
@pytest.mark.parametrize("n", [2, 3])
def test_error_on_one_rank_aborts_the_job(n):
    t0 = time.perf_counter()
    proc = mpirun(n, "fail_prog.py", "raise", timeout=30)
    assert time.perf_counter() - t0 < 20
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "[rank 1] Traceback" in out and "boom: simulated failure at step 3" in out


def test_single_process_error_propagates():
    with pytest.raises(KeyError):
        with abort_on_error(LocalComm()):
            raise KeyError("x")


def test_describe_single_process():
    text = describe(LocalComm())
    assert "ranks: 1" in text and "rank 0" in text
