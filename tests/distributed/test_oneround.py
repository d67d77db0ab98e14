"""The all-at-once point-to-point exchanges (oneround.py: the float16 exchange's and the
top-k pairs' all-to-all and all-gathers) on 2 and 3 real mpiexec ranks: every rank gets
what MPI's collectives would deliver, with several exchanges of one tag posted before any
wait (matched in the order posted), empty pieces, and ranks sending different sizes."""
from __future__ import annotations

import pickle

import pytest

from mpijobs import mpirun
from helpers import MPIEXEC, have_mpi4py


@pytest.fixture(scope="module", params=[2, 3], ids=lambda n: f"np{n}")
def ranks(request, tmp_path_factory):
    n = request.param
    if MPIEXEC is None or not have_mpi4py():
        pytest.skip("needs mpiexec and mpi4py")
    out = tmp_path_factory.mktemp(f"direct_np{n}")
    proc = mpirun(n, "oneround_prog.py", str(out), timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with open(out / "results.pkl", "rb") as f:
        everyone = pickle.load(f)
    assert [res["size"] for res in everyone] == [n] * n
    return everyone


def test_one_duplicate_communicator_and_the_mpi_comm_under_a_wrapper(ranks):
    assert all(res["one_dup"] and res["comm_of"] for res in ranks)


@pytest.mark.parametrize("m", [0, 1, 5, 4099])
def test_alltoall_and_allgather_deliver_every_rank_its_pieces(ranks, m):
    for res in ranks:
        assert res[f"alltoall_{m}"] and res[f"allgather_{m}"], (res["size"], m)


def test_allgatherv_of_different_sizes_in_rank_order(ranks):
    assert all(res["allgatherv"] for res in ranks)
