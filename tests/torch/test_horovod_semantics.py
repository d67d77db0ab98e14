"""Horovod's semantics on distnn.torch, on real 2- and 3-rank MPI jobs (progs/semantics_prog.py):
scale factors on integers and float16, an integer Average keeps its dtype, mismatched
calls raise the same RuntimeError on every rank (no hang, no abort, no reinterpreted
bits), ``*_async`` collectives are in flight while a peer is late and ``poll`` tells the
truth, names of operations in flight are refused, and Horovod's signatures."""
from __future__ import annotations


import pytest
import torch

import distnn.torch as hvd

from torchjobs import needs_mpi, prog_ranks


@pytest.fixture(scope="module", params=[2, 3], ids=lambda n: f"np{n}")
def job(request, tmp_path_factory):
    n = request.param
    out = tmp_path_factory.mktemp(f"semantics{n}")
    return n, prog_ranks("semantics_prog.py", n, out, timeout=240)


@needs_mpi
def test_fractional_scale_factors_on_integers_and_float16(job):
    n, results = job
    half = (torch.tensor(1.5, dtype=torch.float16).float() * 0.3).half()  # scaled in float32
    acc = half
    for _ in range(n - 1):  # summed as Horovod's MPI float16 sum: in float32, rounded each step
        acc = (acc.float() + half.float()).half()
    half_sum = acc.float().item()  # 3 ranks: 1.3496, not 3 * 0.45 (Horovod's test expects that)
    for res in results:
        s = res["scale"]
        assert s["int_pre"] == [5 * n] * 4  # int(10 * 0.5) per rank, then summed
        assert s["int_post"] == [int(10 * n * 0.25)] * 4  # truncated toward zero
        assert s["int64_pre"] == [int(10 * 0.37) * n] * 4
        assert s["half_dtype"] == "torch.float16"
        assert s["half_pre"] == [half_sum] * 3  # exactly
        assert s["rs_half_pre"] == [half_sum] * 2
        assert s["rs_int_pre"] == [5 * n] * 2
        assert s["rs_int_post"] == [int(10 * n * 0.25)]
        assert s["grouped_int_pre"] == [[5 * n] * 4] * 2


@needs_mpi
def test_integer_average_keeps_the_dtype(job):
    n, results = job
    mean = sum(2 * r + 1 for r in range(n)) // n  # n^2 / n: exact
    for res in results:
        dtype, values, rs_dtype, rs_values = res["int_average"]
        assert dtype == "torch.int32" and values == [mean, 7]
        assert rs_dtype == "torch.int64"
        assert rs_values == [int(sum(3 + r for r in range(n)) / n)]


@pytest.mark.parametrize("case, field", [
    ("broadcast_dtype", "dtype (torch.int32 on some ranks, torch.float32 on others)"),
    ("broadcast_root", "root_rank"), ("broadcast_inplace_root", "root_rank"),
    ("reducescatter_shape", "dim 0"), ("allreduce_dtype", "dtype"),
    ("allreduce_same_numel", "ndim"), ("allreduce_op", "op (sum on some ranks, max"),
    ("allreduce_name", "name"), ("allgather_shape", "dim 1"), ("allgather_dtype", "dtype"),
    ("alltoall_shape", "dim 1"), ("grouped_allreduce_shapes", "shape"),
    ("allreduce_vs_allgather", "operation (allreduce on some ranks, allgather on others)"),
    ("async_allgather_shape", "dim 1"),
])
@needs_mpi
def test_mismatched_calls_raise_the_same_error_on_every_rank(job, case, field):
    n, results = job
    seen = [res["mismatch"][case] for res in results]
    assert all(kind == "RuntimeError" for kind, _, _ in seen), seen
    assert len({msg for _, msg, _ in seen}) == 1, seen  # the same message everywhere
    assert field in seen[0][1] and "ranks disagree" in seen[0][1]
    assert max(t for _, _, t in seen) < 10  # seconds, not a hang
    for res in results:  # and the job goes on with correct results
        assert res["after_mismatch"] == sum(range(n))


@pytest.mark.parametrize("what", ["allgather", "broadcast", "broadcast_", "alltoall",
                                  "reducescatter", "grouped_allgather"])
@needs_mpi
def test_async_collectives_are_in_flight_while_a_peer_is_late(job, what):
    n, results = job
    returned, polled, polled_after, _ = results[0]["late"][what]
    assert returned < 0.4 and polled is False and polled_after is True  # peers sleep 0.8 s
    expected = {
        "allgather": [float(r) for r in range(n) for _ in range(2)],
        "broadcast": [n - 1.0] * 2, "broadcast_": [n - 1.0] * 2,
        "reducescatter": [float(n * (n + 1) / 2)],
        "grouped_allgather": [list(range(n))],
    }
    for rank, res in enumerate(results):
        got = res["late"][what][3]
        if what == "alltoall":
            assert got == [10.0 * r + rank for r in range(n)]
        else:
            assert got == expected[what]


@needs_mpi
def test_async_collectives_complete_across_a_barrier(job):
    n, results = job
    for res in results:
        reduced, gathered, rows, bcast = res["with_barrier"]
        assert reduced == [[n, 0.0], [0.0, n]]
        assert gathered == [[float(r)] * 2 for r in range(n)] and rows == 2 * n
        assert bcast == torch.eye(3).tolist()


@needs_mpi
def test_names_in_flight_are_refused_until_synchronized(job):
    n, results = job
    for res in results:
        assert res["names"] == {"second": "ValueError", "after_synchronize": "no error",
                                "allreduce_second": "ValueError"}


@needs_mpi
def test_horovod_signatures_and_forms(job):
    n, results = job
    for rank, res in enumerate(results):
        f = res["forms"]
        assert f["object"] == {"from": n - 1}
        assert f["lr"] == pytest.approx(0.1)  # root's hyper-parameters
        assert f["sparse_callable"] and f["sparse"] == [n * (n + 1) / 2] * 3
        assert f["grouped_grads"] == [[float(n)] * 3, [[2.0 * n] * 2] * 2]
        assert f["grouped_avg_grad_fn"]
        members = [r for r in range(n) if r % 2 == rank % 2]
        assert f["comm_set"] == members and f["comm_set_sum"] == sum(members)
        assert f["parameter_names"] == [f"param.{i}" for i in range(4)]


@needs_mpi
def test_barrier_returns_after_the_queued_collectives(job):
    n, results = job
    for res in results:
        assert res["barrier_polls"] == [True, True]


@needs_mpi
def test_join_serves_queued_allreduces(job):
    n, results = job
    total = sum(r + 1 for r in range(1, n))  # rank 0 joined: it sends zeros
    for rank, res in enumerate(results):
        j = res["join"]
        assert j["rets"] == [n - 1] * n  # the last rank to join, on every rank
        if rank:
            assert j["avg"] == [6.0 * total / n, 3.0 * total / n]  # divided by the full size
            assert j["grouped"] == [[6.0 * total, 3.0 * total], [12.0 * total, 6.0 * total]]
            assert j["allgather"] == "RuntimeError"  # cannot run while a rank is joined


@needs_mpi
def test_sparse_gradients_step_sparse_adam_like_one_process(job):
    n, results = job
    for res in results:
        assert res["sparse_adam"] < 1e-6


@needs_mpi
def test_argument_errors(job):
    n, results = job
    for res in results:
        assert res["errors"]["alltoall_float_splits"] == "ValueError"
        assert res["errors"]["adasum_is"] == (True, True)  # Horovod's type and distnn's


def test_scale_rule_on_one_process():
    from distnn.torch.collectives import scale_
    a = torch.tensor([10, -10, 3], dtype=torch.int32)
    scale_(a.numpy(), 0.55)
    assert a.tolist() == [5, -5, 1]  # float64 math, truncated toward zero
    h = torch.tensor([1.5], dtype=torch.float16)
    scale_(h.numpy(), 0.3)
    assert h.item() == (torch.tensor(1.5) * 0.3).half().item()  # float32 math


def test_names_are_taken_and_freed():
    from distnn.torch import background
    background.reserve("x", "test")
    with pytest.raises(ValueError, match="'x' is still in flight"):
        background.reserve("x", "test")
    background.release("x")
    background.reserve("x", "test")
    background.release("x")
    assert hvd.Handle(torch.ones(1))() is not None


def _sum_of_ranks(scale):
    hvd.init()
    total = hvd.allreduce(torch.tensor([float(hvd.rank())]), op=hvd.Sum).item()
    return hvd.rank(), total * scale


def _fails_on_rank_one():
    hvd.init()
    if hvd.rank() == 1:
        raise KeyError("rank one fails")
    return 0


@needs_mpi
@pytest.mark.parametrize("n", [2, 3])
def test_run_api_returns_results_in_rank_order(n):
    assert hvd.run(_sum_of_ranks, args=(2.0,), np=n, timeout=120) == [
        (r, 2.0 * sum(range(n))) for r in range(n)]


@needs_mpi
def test_run_api_raises_with_the_failing_ranks_traceback():
    with pytest.raises(RuntimeError, match="rank 1 raised:(.|\n)*KeyError: 'rank one fails'"):
        hvd.run(_fails_on_rank_one, np=2, timeout=120)
