"""Whole blocks of samples split among threads (kernels/_threads): block plans that give
every thread the same work, the calling thread's share, BLAS on one thread inside a split,
and a convolution whose blocks split unevenly giving the 1-thread result."""
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from threadpoolctl import threadpool_info

from distnn import kernels
from distnn.kernels import _threads, planner as plan
from distnn.kernels.conv import conv2d_backward, conv2d_forward


def shares(blocks, workers):
    """Samples of each round-robin share (share i: blocks i, i + workers, ...)."""
    return [sum(n1 - n0 for n0, n1 in blocks[i::workers]) for i in range(workers)]


def blas_threads():
    """Thread counts of numpy's BLAS (the kernels' GEMMs), and of any BLAS loaded before
    the first split; one loaded after it (scipy's own) is not limited."""
    _threads.one_blas_thread()
    libs = {lib.filepath for lib in _threads._blas[1]}
    return [i["num_threads"] for i in threadpool_info() if i["filepath"] in libs]


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 300), st.integers(1, 80), st.integers(1, 5))
def test_split_blocks_cover_the_batch_with_even_shares(n, k, workers):
    blocks = _threads.split_blocks(n, k, workers)
    assert [b for b in blocks if b[1] <= b[0]] == []  # no empty block
    assert [n0 for n0, _ in blocks] == [0, *(n1 for _, n1 in blocks[:-1])][:len(blocks)]
    assert (blocks[-1][1] if blocks else 0) == n
    assert max((n1 - n0 for n0, n1 in blocks), default=0) <= k
    if workers == 1 or n < workers:  # the plain blocks of k
        assert blocks == [(n0, min(n, n0 + k)) for n0 in range(0, n, k)]
    else:
        s = shares(blocks, workers)
        assert max(s) - min(s) <= 1, (blocks, s)
        assert s[-1] == min(s)  # the calling thread's share is the lightest


def test_split_blocks_examples():
    blocks = _threads.split_blocks(64, 3, 2)
    assert len(blocks) == 22 and shares(blocks, 2) == [32, 32]
    assert [n1 - n0 for n0, n1 in blocks[-3:]] == [3, 2, 2]
    assert [n1 - n0 for n0, n1 in _threads.split_blocks(64, 14, 2)] == [11] * 4 + [10] * 2


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 300), st.integers(1, 80), st.integers(2, 5))
def test_balanced_block_shares_differ_by_at_most_one_block(n, k, workers):
    kb = _threads.balanced_block(n, k, workers)
    assert 1 <= kb <= min(n, k)
    if n >= workers:
        blocks = [(n0, min(n, n0 + kb)) for n0 in range(0, n, kb)]
        # no more blocks than the plain ones a worker's share needs
        assert -(-len(blocks) // workers) == -(-n // (workers * min(n, k)))
        s = shares(blocks, workers)
        assert max(s) - min(s) <= kb
        assert s[-1] == min(s)


def test_balanced_block_examples():
    # 64 samples in blocks of up to 14: 6 blocks of 11 (33 / 31), not 14,14,14,14,8 (36 / 28)
    assert _threads.balanced_block(64, 14, 2) == 11
    assert _threads.balanced_block(64, 64, 2) == 32


def test_run_gives_the_caller_the_last_share_and_results_in_share_order():
    caller = threading.get_ident()
    before = blas_threads()

    def body(indices, serial):
        return list(indices), serial, threading.get_ident(), blas_threads()

    for workers in (2, 3):
        out = _threads.run(7, workers, body)
        assert [o[0] for o in out] == [list(range(i, 7, workers)) for i in range(workers)]
        assert all(o[1] for o in out)  # the serial kernels in every thread
        assert out[-1][2] == caller and all(o[2] != caller for o in out[:-1])
        assert all(o[3] == [1] * len(before) for o in out)  # one BLAS thread inside
    assert blas_threads() == before
    assert _threads.run(5, 1, body)[0][:2] == (list(range(5)), False)


def test_run_errors_reach_the_caller_after_every_helper_finished():
    """A helper's error is raised in the caller; the caller's own error waits for the
    helpers (no share still running after ``run`` returns), and the team works after."""
    finished = []

    def helper_fails(indices, serial):
        if threading.get_ident() != caller:
            raise ValueError(f"share {list(indices)}")
        return list(indices)

    def caller_fails(indices, serial):
        if threading.get_ident() == caller:
            raise KeyError("caller")
        threading.Event().wait(0.05)  # still running when the caller fails
        finished.append(list(indices))
        return list(indices)

    caller = threading.get_ident()
    with pytest.raises(ValueError, match=r"share \[0, 2, 4\]"):
        _threads.run(6, 2, helper_fails)
    with pytest.raises(KeyError):
        _threads.run(6, 2, caller_fails)
    assert finished == [[0, 2, 4]]
    assert _threads.run(6, 2, lambda ix, s: list(ix)) == [[0, 2, 4], [1, 3, 5]]


def test_run_from_two_threads_at_once_and_nested():
    """Two Python threads in ``run`` at once (ranks simulated by threads), and a ``run``
    inside a share: each gets its own shares' results (one through the helper team, the
    others through the executor), in share order."""
    barrier = threading.Barrier(2)

    def body(indices, serial):
        barrier.wait(timeout=10)  # both callers' shares run at the same time
        return [i * 10 for i in indices]

    out = {}

    def caller(key):
        out[key] = _threads.run(4, 2, body)

    threads = [threading.Thread(target=caller, args=(k,)) for k in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert out == {"a": [[0, 20], [10, 30]], "b": [[0, 20], [10, 30]]}

    def outer(indices, serial):
        return [_threads.run(3, 2, lambda ix, s: list(ix)) for _ in indices]

    assert _threads.run(2, 2, outer) == [[[[0, 2], [1]]], [[[0, 2], [1]]]]


def test_spin_while_sees_a_store_from_another_thread_and_gives_up_after_its_budget():
    """The look-before-sleep of a team's threads: it returns once another thread changes
    the counter (a load hoisted out of the loop would miss it and run out its ~8 s budget,
    returning False), and returns False at once with no budget or after a small one."""
    flags = np.zeros(2, np.int64)
    timer = threading.Timer(0.02, flags.__setitem__, (1, 5))
    timer.start()
    try:
        assert _threads._spin_while(flags, 1, 0, 10_000_000)
    finally:
        timer.cancel()
    assert flags[1] == 5
    assert not _threads._spin_while(flags, 0, 0, 0)
    assert not _threads._spin_while(flags, 0, 0, 100)
    assert _threads._spin_while(flags, 1, 0, 1)  # already different


@pytest.mark.parametrize("yields", [0, 100, 100_000])
def test_run_back_to_back_with_and_without_looking_before_sleeping(limits, yields):
    """Hundreds of ``run``s in a row, with helpers that sleep at once, look a little, or
    look long enough to catch every next hand-off: every share once, in order, and a
    helper's error still reaches the caller."""
    limits(spin_yields=yields)
    for r in range(300):
        workers = 2 + r % 2
        out = _threads.run(5, workers, lambda ix, s, r=r: [r * 10 + i for i in ix])
        assert out == [[r * 10 + i for i in range(j, 5, workers)] for j in range(workers)]
    caller = threading.get_ident()

    def helper_fails(indices, serial):
        if threading.get_ident() != caller:
            raise ValueError("helper")
        return list(indices)

    with pytest.raises(ValueError, match="helper"):
        _threads.run(4, 2, helper_fails)
    assert _threads.run(4, 2, lambda ix, s: list(ix)) == [[0, 2], [1, 3]]


def test_one_blas_thread_nests_and_restores():
    before = blas_threads()
    assert before, "numpy's BLAS is one of the libraries limited"
    with _threads.one_blas_thread():
        assert blas_threads() == [1] * len(before)
        with _threads.one_blas_thread():
            assert blas_threads() == [1] * len(before)
        assert blas_threads() == [1] * len(before)
    assert blas_threads() == before
    with pytest.raises(RuntimeError):
        with _threads.one_blas_thread():
            raise RuntimeError("restored on errors too")
    assert blas_threads() == before


def test_uneven_conv_blocks_at_two_threads_give_the_one_thread_result():
    """17 samples, stride-2 3x3 (im2col, columns rebuilt per block of 3): 6 blocks at 2
    threads. Outputs and gradients as at 1 thread (dw summed per thread, then in share
    order), the same bits on every run, and the NumPy reference's values."""
    pytest.importorskip("numba")
    rng = np.random.default_rng(3)
    x = rng.standard_normal((17, 32, 32, 32))
    w = rng.standard_normal((24, 32, 3, 3))
    b = rng.standard_normal(24)
    dy = rng.standard_normal((17, 24, 16, 16))
    previous, backend = kernels.get_num_threads(), kernels.backend()

    def conv():
        y, cache = conv2d_forward(x, w, b, (2, 2), (1, 1, 1, 1), ws={})
        return (y,) + tuple(conv2d_backward(dy, cache, w))

    try:
        kernels.set_backend("numpy")
        ref = conv()
        kernels.set_backend("numba")
        runs = {}
        for threads in (1, 2, 2):
            kernels.set_num_threads(threads)
            runs.setdefault(threads, []).append(conv())
    finally:
        kernels.set_num_threads(previous)
        kernels.set_backend(backend)
    (one,), (two, again) = runs[1], runs[2]
    for a, c in zip(two, again):
        np.testing.assert_array_equal(a, c)
    for got1, got2, r in zip(one, two, ref):
        np.testing.assert_allclose(got2, got1, rtol=1e-12, atol=1e-10)
        np.testing.assert_allclose(got2, r, rtol=1e-12, atol=1e-10)


@pytest.mark.parametrize("workers", [2, 3])
def test_dynamic_run_takes_every_block_once_and_the_free_thread_takes_more(workers):
    """``dynamic``: the threads take the next block not yet taken, each block once; a
    helper that starts late leaves its blocks to the caller (which ran them here)."""
    caller = threading.get_ident()

    def body(indices, serial):
        if threading.get_ident() != caller:
            threading.Event().wait(0.3)  # a helper that starts late
        return [(i, threading.get_ident()) for i in indices]

    out = _threads.run(12, workers, body, dynamic=True)
    taken = sorted(i for share in out for i, _ in share)
    assert taken == list(range(12))
    by_caller = [i for i, tid in out[-1] if tid == caller]
    assert len(by_caller) >= 12 - (workers - 1)  # the late helpers took one block at most
    assert by_caller == sorted(by_caller)  # taken in block order


@pytest.mark.parametrize("n,threads", [(10, 2), (37, 2), (37, 3), (3, 2)])
def test_pieces_cover_the_range_once_whichever_thread_takes_them(n, threads):
    seen = []
    lock = threading.Lock()

    def fn(a, b):
        with lock:
            seen.append((a, b))

    previous = kernels.get_num_threads()
    kernels.set_num_threads(threads)
    try:
        _threads.pieces(n, fn, min_items=2)
    finally:
        kernels.set_num_threads(previous)
    seen.sort()
    assert seen[0][0] == 0 and seen[-1][1] == n
    assert all(a < b for a, b in seen)
    assert all(seen[i][1] == seen[i + 1][0] for i in range(len(seen) - 1))
    sizes = [b - a for a, b in seen]
    assert len(set(sizes[:-1])) <= 1 and sizes[-1] <= sizes[0]  # equal pieces, the last less
    if kernels.backend() == "numba":  # several a thread, every thread one at least
        assert min(n, threads) <= len(seen) <= threads * plan.LIMITS.pieces_per_thread


@pytest.mark.timeout(300)
@pytest.mark.parametrize("watcher", ["jobs", "watch"])
@pytest.mark.parametrize("yields", [0, 100, 100_000])
def test_compiled_jobs_and_python_shares_in_a_row_with_sleeping_helpers(monkeypatch, yields,
                                                                        watcher, limits):
    """Compiled jobs (batch norm's channel-split kernels, float32: ``_team_jobs``) and
    Python ``run`` shares one after the other, with helpers that sleep after every task,
    after a little looking, or look long enough to catch the next: each job is handed to
    every helper once (their finished counts), gives the one-thread bits, and nothing
    hangs (a helper asleep is woken, one about to sleep sees the task). ``watch``: the
    helpers watch with ``_threads._watch`` (as before ``_team_jobs`` is imported), which
    hands each job back to Python to run."""
    if kernels.backend() != "numba":
        pytest.skip("compiled jobs are the compiled path's")
    from distnn.kernels import _team_jobs
    from distnn.kernels import batchnorm as K
    limits(spin_yields=yields)
    if watcher == "watch":
        monkeypatch.setattr(_threads, "_SERVE", [_threads._watch, _team_jobs._run])
    rng = np.random.default_rng(4)
    x = (rng.standard_normal((6, 24, 5, 5)) * 2 + 1).astype(np.float32)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    gamma = rng.uniform(0.5, 2, 24).astype(np.float32)
    beta = rng.standard_normal(24).astype(np.float32)
    n = K.channel_count(x)

    def both():
        y, _, mean, var, invstd = K.bn_relu_forward_train(x, gamma, beta, 1e-5,
                                                          keep_xhat=False)
        return [y, mean, var, invstd, *K.bn_backward(dy, None, gamma, beta, invstd, n, True,
                                                     x=x, mean=mean)]

    previous = kernels.get_num_threads()
    try:
        kernels.set_num_threads(1)
        want = both()
        kernels.set_num_threads(2)
        if kernels.get_num_threads() < 2:
            pytest.skip("numba has one thread here")
        team = _threads._team(2)
        for r in range(150):
            finished = team.flags[team.n]
            got = both()
            assert team.flags[team.n] - finished == 2  # the forward's job, the backward's
            for a, b in zip(got, want):
                np.testing.assert_array_equal(a, b)
            assert _threads.run(3, 2, lambda ix, s, r=r: [r + i for i in ix]) == [[r, r + 2],
                                                                                   [r + 1]]
        # the team in use (a nested call): the Python shares instead, the same bits
        with team.busy:
            assert not _threads.run_jobs(2, None, None)
            finished = team.flags[team.n]
            for a, b in zip(both(), want):
                np.testing.assert_array_equal(a, b)
            assert team.flags[team.n] == finished  # through a ThreadPoolExecutor
    finally:
        kernels.set_num_threads(previous)


@pytest.mark.parametrize("n", [(1 << 19) - 1, 1 << 19, (1 << 20) + 4097])
def test_elementwise_jobs_give_the_one_thread_bits_and_run_on_the_helper(n):
    """ReLU's forward and backward and the sum of two arrays (a residual block's) from
    2^19 float32 elements run as compiled jobs of the block threads (``_team_jobs``),
    pieces of elements taken from a counter: every element written once, as at 1 thread
    (NaN and -0.0 included); below that size, on the calling thread alone."""
    if kernels.backend() != "numba":
        pytest.skip("compiled jobs are the compiled path's")
    from distnn.kernels import _team_jobs  # noqa: F401  (installs the jobs)
    from distnn.kernels.backend import compiled
    fast = compiled()
    rng = np.random.default_rng(5)
    a = rng.standard_normal(n).astype(np.float32)
    a[::1001] = np.nan
    a[::997] = -0.0
    b = rng.standard_normal(n).astype(np.float32)
    a3, b3 = a.reshape(1, 1, n), b.reshape(1, 1, n)

    def all_three():
        outs = [np.full(n, 7, np.float32) for _ in range(3)]
        fast.relu_forward(a3, outs[0].reshape(a3.shape))
        fast.relu_backward(b3, a3, outs[1].reshape(a3.shape))
        fast.add(a3, b3, outs[2].reshape(a3.shape))
        return outs

    previous = kernels.get_num_threads()
    try:
        kernels.set_num_threads(1)
        want = all_three()
        np.testing.assert_array_equal(want[0], np.maximum(a, 0))
        np.testing.assert_array_equal(want[1], b * (a > 0))
        np.testing.assert_array_equal(want[2], a + b)
        kernels.set_num_threads(2)
        if kernels.get_num_threads() < 2:
            pytest.skip("numba has one thread here")
        team = _threads._team(2)
        finished = team.flags[team.n]
        got = all_three()
        assert team.flags[team.n] - finished == (3 if n >= 1 << 19 else 0)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)
    finally:
        kernels.set_num_threads(previous)
