"""The compressed exchanges overlapped with backward (compressed_buckets.py): on 2 and 3
ranks the overlapped path equals the blocking one bit for bit (gradients, weights,
residuals, what was sent, PowerSGD's Q), and each bucket's exchange is posted from the
gradient hook, before backward ends; in process, over LocalComm, bucket by bucket equals
the whole buffer at once."""
from __future__ import annotations

import pickle

import numpy as np
import pytest

from compressed_overlap_prog import CASES
from mpijobs import Program

from distnn.distributed import LocalComm, PowerSGD, Threshold, TopK
from distnn.distributed.compressed_buckets import BucketedCompression
from distnn.distributed.lossy import CompressedReduction
from distnn.distributed.reducer import Reducer


PROGRAMS = {n: Program(n, "compressed_overlap_prog.py", owner=f"test_compressed_overlap.np{n}",
                      timeout=300) for n in (2, 3)}


@pytest.fixture(scope="module", params=[2, 3], ids=lambda n: f"np{n}")
def ranks(request, prog_batch):
    """Every rank's results of progs/compressed_overlap_prog.py (the folder's launch)."""
    out, _ = PROGRAMS[request.param].run(prog_batch)
    results = []
    for r in range(request.param):
        with open(out / f"rank{r}.pkl", "rb") as f:
            results.append(pickle.load(f))
    return results


@pytest.mark.parametrize("name", list(CASES))
def test_overlapped_equals_blocking_bit_for_bit(ranks, name):
    for res in ranks:
        case = res["cases"][name]
        over, block = case["overlap"], case["blocking"]
        assert over["overlap"] and not block["overlap"]
        assert over["buckets"] >= 3 and over["compressed"]
        assert case["trained"] > 1e-3  # the weights moved: the steps did something
        assert all(case["compare"]["equal"]), case["compare"]["gap"]
        assert max(case["compare"]["gap"]) == 0.0
        assert over["early_starts"] > 0 and block["early_starts"] == 0


def _steps(log):
    steps, cur = [], None
    for event in log:
        if event[0] == "step":
            cur = []
            steps.append(cur)
        else:
            cur.append(event)
    return steps


@pytest.mark.parametrize("name", ["topk", "threshold", "powersgd"])
def test_each_bucket_is_posted_before_backward_ends(ranks, name):
    buckets = ranks[0]["cases"]["topk"]["overlap"]["buckets"]
    for res in ranks:
        backward_steps = 0
        for events in _steps(res[f"log_{name}_True"]):
            readies = [i for i, e in enumerate(events) if e[0] == "ready"]
            if not readies:  # this rank had no data in this step
                continue
            backward_steps += 1
            assert len(readies) == buckets
            before_last = events[:readies[-1]]
            # every bucket's exchange started from the hook of its last layer (the
            # "ready" entry is logged after the optimizer's hook), none blocking
            assert [e[0] for e in before_last].count("post") >= buckets
            for k, i in enumerate(readies):
                assert events[i - 1][0] == "post", (k, events)
            assert not any(e[0] == "blocking" for e in events)
        assert backward_steps >= 4
        for events in _steps(res[f"log_{name}_False"]):
            readies = [i for i, e in enumerate(events) if e[0] == "ready"]
            if readies:  # the blocking path sends nothing until backward is over
                assert all(e[0] == "ready" for e in events[:readies[-1] + 1])
                assert events[readies[-1] + 1:] and all(
                    e[0] == "blocking" for e in events[readies[-1] + 1:])


@pytest.mark.parametrize("spec", ["topk:0.05", "powersgd:2"])
def test_joinable_comm_overlaps_too(ranks, spec):
    for res in ranks:
        assert res[f"joinable_{spec}"]["overlap"]
        assert all(res[f"joinable_{spec}"]["compare"]["equal"])


def test_joined_ranks_serve_powersgd_and_refuse_pairs_as_the_blocking_path(ranks):
    size = len(ranks)
    for r, res in enumerate(ranks):
        over, block = res["join_powersgd:2"]
        assert over["overlap"] and not block["overlap"]
        assert over["error"] is None and block["error"] is None
        assert len(over["weights"]) == 2 + r  # the last steps summed zeros of joined ranks
        assert all(np.array_equal(a, b) for a, b in zip(over["weights"], block["weights"]))
        assert over["last"] == block["last"] == size - 1
        over, block = res["join_topk:0.05"]
        assert over["overlap"]
        assert len(over["weights"]) == len(block["weights"]) == 2
        assert all(np.array_equal(a, b) for a, b in zip(over["weights"], block["weights"]))
        if r == 0:  # the first to join
            assert over["error"] is None and block["error"] is None
        else:
            assert "a rank has called join()" in over["error"]
            assert "a rank has called join()" in block["error"]


# -- in process: LocalComm -------------------------------------------------------------
TENSORS = [("a/w", 0, 2048, (32, 64)), ("a/b", 2048, 2080, (32,)),
           ("b/w", 2080, 2080 + 3000, (30, 100)), ("c/w", 5080, 5080 + 1200, (40, 30)),
           ("c/b", 6280, 6320, (40,))]
BUCKETS = [(5080, 6320, ["c"]), (2080, 5080, ["b"]), (0, 2080, ["a"])]  # backward order


@pytest.mark.parametrize("config", [
    TopK(0.05), TopK(0.05, exchange="sparse"), TopK(0.9), Threshold(1.5),
    Threshold(1.5, exchange="dense"), Threshold(1e-6), PowerSGD(2),
    PowerSGD(3, warm_start=False, min_compression_rate=0)], ids=repr)
def test_bucket_by_bucket_equals_all_at_once_on_one_process(config):
    rng = np.random.default_rng(3)
    whole = np.zeros(6320)
    flat_a, flat_b = whole.copy(), whole.copy()
    a = CompressedReduction(config, flat_a, TENSORS, LocalComm())
    b = CompressedReduction(config, flat_b, TENSORS, LocalComm())
    over = BucketedCompression.for_buckets(b, BUCKETS)
    assert over is not None and a.compressed
    for _ in range(4):
        g = rng.normal(size=whole.size)
        flat_a[...] = g
        flat_b[...] = g
        a.reduce_()
        over.begin()
        for k in range(len(BUCKETS)):
            over.start(k)
        assert np.array_equal(flat_b, g)  # untouched until finish
        over.finish()
        assert np.array_equal(flat_a, flat_b)
        assert np.array_equal(a.residual, b.residual) and np.array_equal(a.sent, b.sent)
        assert a.steps == b.steps
        for qa, qb in zip(getattr(a, "qs", []), getattr(b, "qs", [])):
            assert np.array_equal(qa, qb)


def test_a_tensor_across_buckets_keeps_the_blocking_path():
    flat = np.zeros(6320)
    cr = CompressedReduction(TopK(0.05), flat, TENSORS, LocalComm())
    assert BucketedCompression.for_buckets(cr, [(0, 3000, ["x"]), (3000, 6320, ["y"])]) \
        is None


def test_one_process_has_no_overlap():
    flat = np.zeros(6320)
    reducer = Reducer(flat, [("a", 0, 2080), ("b", 2080, 5080), ("c", 5080, 6320)],
                      LocalComm(), compression="topk:0.05", tensors=TENSORS,
                      bucket_size_mb=0)
    assert reducer.overlap is None
    for i in (2, 1, 0):
        reducer.ready(i)
    assert reducer.synchronize() is False
