"""The all-at-once point-to-point exchanges (oneround.py: the float16 exchange's and the
top-k pairs' all-to-all and all-gathers) on 2 and 3 real mpiexec ranks: every rank gets
what MPI's collectives would deliver, with several exchanges of one tag posted before any
wait (matched in the order posted), empty pieces, and ranks sending different sizes."""
from __future__ import annotations

import pickle

import pytest

from mpijobs import Program


PROGRAMS = {n: Program(n, "oneround_prog.py", owner=f"test_oneround.np{n}") for n in (2, 3)}


@pytest.fixture(scope="module", params=[2, 3], ids=lambda n: f"np{n}")
def ranks(request, prog_batch):
    n = request.param
    out, _ = PROGRAMS[n].run(prog_batch)  # in the folder's launch on n ranks (it skips
    #                                       without mpiexec and mpi4py)
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
