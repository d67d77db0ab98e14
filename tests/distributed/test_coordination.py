"""distributed.coordination: on_ranks agrees on an error across the ranks (every rank
raises the first failing rank's), and the lazy waits complete."""
from __future__ import annotations

import json

import pytest
from mpijobs import Program
from helpers import needs_mpi

from distnn.distributed import LocalComm
from distnn.distributed.coordination import Backoff, lazy_barrier, on_ranks, wait_all


def test_on_ranks_on_one_rank():
    comm = LocalComm()
    assert on_ranks(comm, lambda: 5) == 5
    with pytest.raises(OSError) as exc:
        on_ranks(comm, lambda: open("/nonexistent/x"))
    assert exc.value.rank == 0 and exc.value.ranks == [0]
    with pytest.raises(KeyError):  # not in catch: raised as it is, on this rank only
        on_ranks(comm, lambda: {}["k"], catch=ValueError)
    assert lazy_barrier(comm) == 0.0


def test_wait_all_and_backoff():
    class Handle:
        def __init__(self, polls):
            self.polls = polls

        def test(self):
            self.polls -= 1
            return self.polls <= 0

    assert wait_all([Handle(3), None, Handle(1)], max_sleep=1e-3) >= 0
    backoff = Backoff(4e-4)
    for _ in range(5):
        backoff.pause()
    assert backoff.delay == 4e-4
    backoff.reset()
    assert backoff.delay == backoff.min_sleep


def test_backoff_yields_the_core_first_then_sleeps_doubling(monkeypatch):
    import os
    import time
    yields, sleeps = [], []
    monkeypatch.setattr(os, "sched_yield", lambda: yields.append(1))
    monkeypatch.setattr(time, "sleep", sleeps.append)
    clock = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    backoff = Backoff(1e-3, min_sleep=1e-5, spin_s=0.05)
    for t in (0.0, 0.02, 0.05, 0.06, 0.07, 0.08):
        clock[0] = t
        backoff.pause()
    assert len(yields) == 3 and sleeps == [1e-5, 2e-5, 4e-5]
    backoff.reset()  # a new wait spins again
    backoff.pause()
    assert len(yields) == 4 and backoff.delay == 1e-5


PROGRAMS = {n: Program(n, "coordination_prog.py", owner=f"test_coordination.np{n}",
                      timeout=60) for n in (2, 3)}


@needs_mpi
@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 3])
def test_every_rank_raises_the_first_failing_ranks_error(prog_batch, n):
    _, printed = PROGRAMS[n].run(prog_batch)  # in the folder's launch on n ranks
    lines = [json.loads(line) for line in printed.splitlines() if line.startswith("{")]
    assert sorted(r["rank"] for r in lines) == list(range(n)), printed
    for r in lines:
        assert r["one"] == ["bad value on rank 1", 1, [1]]
        assert r["all"] == ["bad value on rank 0", 0, list(range(n))]
        assert r["root"] == ["bad value on rank 0", 0, [0]]
        assert r["result"] == (10 if r["rank"] == 0 else None)
        assert r["fine"] == r["rank"]
        assert r["waits"] == [True, True]


def test_a_write_error_travels_whole():
    # on_ranks sends rank 0's exception to the others: WriteError must arrive as itself.
    import pickle

    from distnn.fileio import WriteError, guarded_write

    def fail():
        raise PermissionError(13, "Permission denied", "/ro/ck.npz")

    with pytest.raises(WriteError) as exc:
        on_ranks(LocalComm(), lambda: guarded_write("/ro/ck.npz", fail, "checkpoint"), root=0,
                 catch=WriteError)
    copy = pickle.loads(pickle.dumps(exc.value))
    assert type(copy) is WriteError and str(copy) == str(exc.value)
    assert (copy.path, copy.what) == ("/ro/ck.npz", "checkpoint")
    assert "could not write checkpoint '/ro/ck.npz': Permission denied" in str(copy)
