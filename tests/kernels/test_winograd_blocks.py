"""The compiled drivers of the Winograd blocks (kernels/_winograd4.py): the same
results as the Python loop over blocks (to float32 rounding) and as the float64 reference,
at 1, 2 and 3 threads, ragged blocks, bias + ReLU, no dx; the same bits whichever thread
takes a block; the shared counter hands out each block once."""
import threading

from dataclasses import replace

import numpy as np
import pytest

from test_conv_kernels import ref_conv

pytest.importorskip("numba")
from distnn import kernels  # noqa: E402
from distnn.kernels import _threads, planner as plan  # noqa: E402
from distnn.kernels import _winograd4 as B  # noqa: E402
from distnn.kernels import conv as K  # noqa: E402
from distnn.kernels import winograd as W  # noqa: E402

pytestmark = pytest.mark.skipif(not plan.TARGET.tiles, reason="needs an AVX-512 or AVX2 CPU "
                                "(the drivers run on those kinds only)")


# tests/kernels/conftest.py skips the NumPy backend for this module
COMPILED_ONLY = "Winograd runs on the compiled backend only"


@pytest.fixture
def driver_calls(monkeypatch):
    """The (driver, threads) of every call of the drivers."""
    calls = []
    for name in ("forward_blocks", "backward_blocks"):
        real = getattr(B, name)
        monkeypatch.setattr(B, name, lambda *a, _f=real, _n=name: (
            calls.append((_n, threading.get_ident())), _f(*a))[1])
    return calls


def _case(seed, n, c, f, h, w, pads):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c, h, w))
    wt = rng.standard_normal((f, c, 3, 3)) / np.sqrt(9 * c)
    b = rng.standard_normal(f)
    oh, ow = h + pads[0] + pads[1] - 2, w + pads[2] + pads[3] - 2
    dy = rng.standard_normal((n, f, oh, ow))
    return x, wt, b, dy


def _conv(x, wt, b, pads, dy, method="winograd4", relu=False, need_dx=True):
    """(y, dx, dw, db) in float32 through the conv kernels' Winograd path."""
    f32 = [a.astype(np.float32) for a in (x, wt, b, dy)]
    x, wt, b, dy = f32
    th = {"winograd": 2, "winograd4": 4}[method]
    y = W.forward(x, wt, b, *pads, relu=relu, tile=th)
    dw, db = np.empty_like(wt), np.empty_like(b)
    dx, _, _ = W.backward(dy, x, wt, pads[0], pads[2], dw, db, need_dx, tile=th)
    return y, dx, dw, db


def _rel(got, want):
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))


def _threads_set(n):
    previous = kernels.get_num_threads()
    kernels.set_num_threads(n)
    return previous


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("n,c,f,h,w,pads", [
    (9, 16, 16, 32, 32, (1, 1, 1, 1)),   # resnet20's first stage: ragged last block
    (5, 8, 24, 13, 11, (0, 2, 1, 0)),    # odd planes, asymmetric padding, partial tiles
    (7, 32, 64, 8, 8, (1, 1, 1, 1)),     # more filters than channels
    (2, 64, 8, 6, 6, (1, 1, 1, 1)),      # fewer filters than channels, 1 block a thread
    (20, 64, 64, 8, 8, (1, 1, 1, 1)),    # resnet20's 64->64: forward in whole column tiles
])
def test_drivers_match_the_loop_and_the_reference(n, c, f, h, w, pads, threads,
                                                  driver_calls, limits):
    x, wt, b, dy = _case(n * c + h, n, c, f, h, w, pads)
    previous = _threads_set(threads)
    try:
        got = _conv(x, wt, b, pads, dy)
        assert {name for name, _ in driver_calls} == {"forward_blocks", "backward_blocks"}
        limits(block_drivers=False)
        driver_calls.clear()
        loop = _conv(x, wt, b, pads, dy)
        assert not driver_calls
        # F(2x2) has no drivers (no zoo layer on either CPU kind gets them: issue 57)
        limits(block_drivers=True)
        _conv(x, wt, b, pads, dy, "winograd")
        assert not driver_calls
    finally:
        kernels.set_num_threads(previous)
    ref = ref_conv(x, wt, b, (1, 1), pads, (1, 1), dy)
    # F(4x4) rounds to 2-5e-6 relative (winograd.py): two summation orders differ by up to
    # twice that, and from float64 by about that
    tol = 1e-5
    for name, g, lp, r in zip(("y", "dx", "dw", "db"), got, loop, ref):
        assert _rel(g, lp) < tol, name
        assert _rel(g, r) < tol, name


def test_drivers_fuse_bias_and_relu_and_skip_dx(driver_calls):
    x, wt, b, dy = _case(3, 6, 16, 8, 12, 12, (1, 1, 1, 1))
    y, dx, dw, db = _conv(x, wt, b, (1, 1, 1, 1), dy, relu=True, need_dx=False)
    assert dx is None
    assert {name for name, _ in driver_calls} == {"forward_blocks", "backward_blocks"}
    ref_y = ref_conv(x, wt, b, (1, 1), (1, 1, 1, 1), (1, 1), dy)[0]
    assert _rel(y, np.maximum(ref_y, 0)) < 1e-5
    assert (y >= 0).all() and (y[ref_y < -1e-3] == 0).all()
    _, _, ref_dw, ref_db = ref_conv(x, wt, b, (1, 1), (1, 1, 1, 1), (1, 1), dy)
    assert _rel(dw, ref_dw) < 1e-5 and _rel(db, ref_db) < 1e-6


@pytest.mark.parametrize("per_block", [True, False])
def test_drivers_same_bits_whichever_thread_takes_a_block(per_block, monkeypatch,
                                                          driver_calls):
    """At 2 threads with dU kept per block (per_block) the blocks go to whichever thread
    takes them first, and dw, db, dx have the same bits taken freely, round-robin and on a
    rerun; with dU kept per thread (more than SLOT_BYTES) the threads take fixed shares, and
    a rerun has the same bits."""
    if not per_block:
        monkeypatch.setattr(W, "SLOT_BYTES", 0)
    x, wt, b, dy = _case(5, 17, 16, 16, 32, 32, (1, 1, 1, 1))
    previous = _threads_set(2)
    try:
        team = _threads._team(2)
        finished = team.flags[team.n]  # the helper's finished tasks
        runs = [_conv(x, wt, b, (1, 1, 1, 1), dy) for _ in range(2)]
        monkeypatch.setattr(plan, "LIMITS", replace(plan.LIMITS, dynamic=False))
        runs.append(_conv(x, wt, b, (1, 1, 1, 1), dy))
    finally:
        kernels.set_num_threads(previous)
    # both threads ran a share of each driver: this one through Python, the helper as a
    # compiled job (its calls do not pass the Python spy)
    assert {tid for _, tid in driver_calls} == {threading.get_ident()}
    assert len(driver_calls) == 2 * len(runs)
    assert team.flags[team.n] - finished == 2 * len(runs)
    for other in runs[1:]:
        for a, c in zip(runs[0], other):
            np.testing.assert_array_equal(a, c)


def test_fetch_add_hands_out_each_number_once():
    """Two threads drawing from one counter without the GIL: every number once."""
    import numba as nb

    @nb.njit(nogil=True)
    def draw(counter, out, n):
        i = _threads.fetch_add(counter, 0)
        while i < n:
            out[i] += 1
            i = _threads.fetch_add(counter, 0)

    n = 200_000
    counter, out = np.zeros(1, np.int64), np.zeros(n, np.int64)
    draw(counter, out, 0)  # compile first
    counter[0] = 0
    workers = [threading.Thread(target=draw, args=(counter, out, n)) for _ in range(2)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    assert (out == 1).all()
    assert counter[0] == n + 2  # each thread's last draw was past the end


def test_applies_only_where_measured():
    assert plan.drivers_apply(np.float32, 16, 64)
    assert not plan.drivers_apply(np.float64, 16, 16)   # the tiles are float32
    assert not plan.drivers_apply(np.float32, 12, 16)   # channels not a multiple of 8
    assert not plan.drivers_apply(np.float32, 64, 128)  # over drivers_max_fc: BLAS's dU
    # and the conv path: a 64->128 layer keeps the loop
    g = K.conv_geometry((8, 64, 8, 8), (3, 3), padding=(1, 1, 1, 1))
    assert plan.winograd_tile(g, 128) and not W._compiled(np.float32, 64, 128, 1)
