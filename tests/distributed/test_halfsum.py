"""The Reducer's float16 exchange (``compression="fp16"``: all-to-all of float16 chunks,
float32 sum, all-gather; halfsum.py) on 2 and 3 real mpiexec ranks: bit-equal to a NumPy
reference of the same arithmetic, on every rank, for bucket sizes the ranks do not divide,
chunked and whole (small) buckets, float32 and float64 buffers, average and sum, blocking
and non-blocking buckets, and ranks that joined."""
from __future__ import annotations

import pickle

import numpy as np
import pytest

from mpijobs import mpirun
from helpers import MPIEXEC, have_mpi4py

from distnn.distributed.halfsum import half_sum_reference

SIZES = [1, 2, 5, 7, 1000, 1001, 30011, 100003]


@pytest.fixture(scope="module", params=[(2, "numpy"), (2, "numba"), (3, "numpy"),
                                        (3, "numba")], ids=lambda p: f"np{p[0]}-{p[1]}")
def ranks(request, tmp_path_factory):
    """Every rank's checks, on n ranks with the kernel backend that casts and sums."""
    n, backend = request.param
    if MPIEXEC is None or not have_mpi4py():
        pytest.skip("needs mpiexec and mpi4py")
    if backend == "numba":
        pytest.importorskip("numba")
    out = tmp_path_factory.mktemp(f"halfsum_np{n}_{backend}")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DISTNN_KERNELS", backend)
        proc = mpirun(n, "halfsum_prog.py", str(out), timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with open(out / "results.pkl", "rb") as f:
        everyone = pickle.load(f)
    assert len(everyone) == n
    assert all(res["backend"] == backend for res in everyone)
    return everyone


@pytest.mark.parametrize("n", SIZES)
def test_exchange_equals_numpy_reference_for_any_size(ranks, n):
    for res in ranks:
        assert res["modes"] == [False, True]  # chunked and whole buckets both ran
        assert res[f"blocking_{n}"], (res["size"], n)
        assert res[f"together_0_{n}"] and res[f"together_1_{n}"], (res["size"], n)


@pytest.mark.parametrize("case", ["nonblocking", "one_bucket", "per_segment", "blocking",
                                  "blocking_last"])
@pytest.mark.parametrize("op", ["average", "sum"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_reducer_fp16_buckets_equal_numpy_reference(ranks, case, op, dtype):
    for res in ranks:
        used, equal, half_bytes, one_call_per_bucket = res[f"{case}_{op}_{dtype}"]
        assert used, "no bucket went through HalfSumExchange's chunks"
        assert equal
        assert half_bytes and one_call_per_bucket


def test_reduce_of_another_buffer_uses_the_same_arithmetic(ranks):
    assert all(res["reduce_"] for res in ranks)


def test_joined_ranks_serve_the_exchange_with_zeros(ranks):
    n = len(ranks)
    for rank, res in enumerate(ranks):
        used, equal, last, modes = res["join"]
        assert used, "the JoinableComm did not run HalfSumExchange"
        assert modes == [False, True]  # chunked and whole buckets
        assert equal == [True] * (rank + 1)
        assert last == n - 1


def test_user_op_path_rounds_differently_from_three_ranks_on(ranks):
    """The old path rounds to float16 after every addition; the exchange rounds once."""
    for res in ranks:
        if res["size"] == 2:
            assert res["old_vs_new_differ"] == 0
        else:
            assert res["old_vs_new_differ"] > 0


def test_reference_helper_rounds_once():
    a = np.float16(2048.0)  # spacing 2 at 2048: 2048 + 1 + 1 rounds to 2048 step by step
    one = np.float16(1.0)
    assert half_sum_reference([a, one, one]) == np.float16(2050.0)
    assert half_sum_reference([np.array([a]), np.array([one])]).dtype == np.float16
