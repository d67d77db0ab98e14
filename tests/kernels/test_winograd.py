"""Winograd F(2x2, 3x3) and F(4x4, 3x3) (compiled): exact against the loop reference in
float64, within the stated rounding bound in float32 per layer shape, and gradient-checked
through Conv2D."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gradcheck import check_layer
from test_conv_kernels import ref_conv

pytest.importorskip("numba")
from distnn.kernels import conv as K  # noqa: E402
from distnn.kernels import planner as plan  # noqa: E402
from distnn.kernels import winograd as W  # noqa: E402
from distnn.nn.conv import Conv2D  # noqa: E402


# tests/kernels/conftest.py skips the NumPy backend for this module
COMPILED_ONLY = "Winograd runs on the compiled backend only"


METHODS = {"winograd": 2, "winograd4": 4}


def run(x, w, b, pads, dy, need_dx=True, ws=None, method="winograd"):
    y, cache = K.conv2d_forward(x, w, b, (1, 1), pads, method=method, ws=ws)
    assert cache.winograd and cache.col is None  # nothing but x kept for backward
    assert cache.tile == METHODS[method]
    dx, dw, db = K.conv2d_backward(dy, cache, w, need_dx=need_dx, ws=ws)
    return y, dx, dw, db


@st.composite
def cases(draw):
    pads = tuple(draw(st.integers(0, 2)) for _ in range(4))
    n, c, f = draw(st.integers(1, 3)), draw(st.integers(1, 6)), draw(st.integers(1, 5))
    h = draw(st.integers(max(1, 3 - pads[0] - pads[1]), 11))
    w = draw(st.integers(max(1, 3 - pads[2] - pads[3]), 11))
    return (n, c, h, w), f, pads, draw(st.integers(0, 2**16))


@pytest.mark.parametrize("method", ["winograd", "winograd4"])
@settings(max_examples=60, deadline=None)
@given(case=cases())
def test_winograd_matches_loops_float64(method, case):
    x_shape, f, pads, seed = case
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(x_shape)
    w = rng.standard_normal((f, x_shape[1], 3, 3))
    b = rng.standard_normal(f)
    y_ref = ref_conv(x, w, b, (1, 1), pads, (1, 1))
    dy = rng.standard_normal(y_ref.shape)
    _, dx_ref, dw_ref, db_ref = ref_conv(x, w, b, (1, 1), pads, (1, 1), dy)
    for ws in (None, {}, {}):
        got_all = run(x, w, b, pads, dy, ws=ws, method=method)
        for got, ref in zip(got_all, (y_ref, dx_ref, dw_ref, db_ref)):
            np.testing.assert_allclose(got, ref, atol=1e-10)


@pytest.mark.parametrize("h,w,pads", [(7, 7, (1, 1, 1, 1)), (14, 14, (1, 1, 1, 1)),
                                      (28, 28, (1, 1, 1, 1)), (9, 13, (0, 0, 0, 0)),
                                      (6, 6, (0, 2, 1, 0)), (3, 5, (0, 0, 2, 2)),
                                      (32, 32, (1, 1, 1, 1)), (29, 31, (0, 1, 2, 0)),
                                      (40, 26, (0, 0, 0, 0)), (26, 45, (2, 0, 0, 1))])
def test_winograd4_partial_tiles_float64(h, w, pads):
    """Outputs that are not multiples of 4 (partial last tiles, zero padding) are right to
    ~1e-10 in float64, y and all gradients; from 28x28 the planes take the transforms
    vectorized over tiles (``_winograd4w``), below the tile-by-tile ones."""
    rng = np.random.default_rng(h * w)
    x = rng.standard_normal((3, 5, h, w))
    wt = rng.standard_normal((4, 5, 3, 3))
    b = rng.standard_normal(4)
    y_ref = ref_conv(x, wt, b, (1, 1), pads, (1, 1))
    dy = rng.standard_normal(y_ref.shape)
    ref = ref_conv(x, wt, b, (1, 1), pads, (1, 1), dy)
    for got, r in zip(run(x, wt, b, pads, dy, method="winograd4"), ref):
        np.testing.assert_allclose(got, r, atol=1e-10)


@pytest.mark.parametrize("tile", [2, 4])
@pytest.mark.parametrize("c,f", [(1, 1), (16, 8), (64, 32)])
def test_winograd_channels_batch_one_and_fused_relu(c, f, tile):
    rng = np.random.default_rng(c)
    x = rng.standard_normal((1, c, 7, 6))
    w = rng.standard_normal((f, c, 3, 3))
    b = rng.standard_normal(f)
    y_ref = ref_conv(x, w, b, (1, 1), (1, 1, 1, 1), (1, 1))
    np.testing.assert_allclose(W.forward(x, w, b, 1, 1, 1, 1, tile=tile), y_ref, atol=1e-11)
    np.testing.assert_allclose(W.forward(x, w, b, 1, 1, 1, 1, relu=True, tile=tile),
                               np.maximum(y_ref, 0), atol=1e-11)


# -- the rounding bound -------------------------------------------------------------------
def tiles_of(x, pads, th, tw, m=2):
    """(N, C, th, tw, m + 2, m + 2) input tiles at stride m, zero padded like the kernel."""
    n, c, h, w = x.shape
    xp = np.zeros((n, c, m * th + 2, m * tw + 2))
    rows, cols = min(h, m * th + 2 - pads[0]), min(w, m * tw + 2 - pads[2])
    xp[:, :, pads[0]:pads[0] + rows, pads[2]:pads[2] + cols] = x[:, :, :rows, :cols]
    win = np.lib.stride_tricks.sliding_window_view(xp, (m + 2, m + 2), axis=(2, 3))
    return win[:, :, ::m, ::m][:, :, :th, :tw]


MATRICES = {2: (W.BT, W.G, W.AT), 4: (W.BT4, W.G4, W.AT4)}


def abs_bounds(x, w, dy, pads, m=2):
    """E for y, dx and dw: the Winograd F(m x m) pipeline on |x|, |w|, |dy| with |B^T|,
    |G|, |A^T|."""
    bt, g, at = (np.abs(a) for a in MATRICES[m])
    n, c, h, wd = x.shape
    oh, ow = dy.shape[2:]
    th, tw = W.tiles(oh, ow, m)
    v = np.einsum("ai,nctxij,bj->abnctx", bt, tiles_of(np.abs(x), pads, th, tw, m), bt)
    u = np.einsum("ai,fcij,bj->abfc", g, np.abs(w), g)
    mm = np.einsum("abfc,abnctx->abnftx", u, v)
    ey = np.einsum("pa,abnftx,qb->nftpxq", at, mm, at).reshape(n, -1, m * th, m * tw)
    dyp = np.zeros((n, dy.shape[1], m * th, m * tw))
    dyp[:, :, :oh, :ow] = np.abs(dy)
    dyt = dyp.reshape(n, -1, th, m, tw, m)
    dm = np.einsum("pa,nftpxq,qb->abnftx", at, dyt, at)
    ddv = np.einsum("abfc,abnftx->abnctx", u, dm)
    dd = np.einsum("ai,abnctx,bj->nctxij", bt, ddv, bt)
    edx = np.zeros((n, c, m * th + 2, m * tw + 2))
    for i in range(m + 2):
        for j in range(m + 2):
            edx[:, :, i:i + m * th:m, j:j + m * tw:m] += dd[..., i, j]
    rows, cols = min(h, m * th + 2 - pads[0]), min(wd, m * tw + 2 - pads[2])
    edx_x = np.zeros(x.shape)
    edx_x[:, :, :rows, :cols] = edx[:, :, pads[0]:pads[0] + rows, pads[2]:pads[2] + cols]
    du = np.einsum("abnftx,abnctx->abfc", dm, v)
    edw = np.einsum("ai,abfc,bj->fcij", g, du, g)
    return ey[:, :, :oh, :ow], edx_x, edw


def gamma(k):
    u = 2.0 ** -24
    return k * u / (1 - k * u)


# resnet20 and vgg11bn 3x3 stride-1 layers (C->F at HxW), batch 2 for speed; odd sizes
# (partial tiles) for F(4x4): 8->8 28x28 (7 tiles), 32->32 7x7, 16->16 14x14
@pytest.mark.parametrize("method", ["winograd", "winograd4"])
@pytest.mark.parametrize("c,f,h", [(16, 16, 32), (16, 32, 32), (32, 32, 16), (64, 64, 8),
                                   (64, 128, 16), (128, 256, 8), (256, 256, 4), (3, 64, 32),
                                   (8, 8, 28), (32, 32, 7), (16, 16, 14), (512, 512, 4)])
def test_winograd_float32_within_rounding_bound(c, f, h, method):
    rng = np.random.default_rng(h * c + f)
    n, pads = 2, (1, 1, 1, 1)
    x = rng.standard_normal((n, c, h, h))
    w = rng.standard_normal((f, c, 3, 3)) / np.sqrt(9 * c)
    b = rng.standard_normal(f)
    dy = rng.standard_normal((n, f, h, h))
    ref = ref_conv(x, w, b, (1, 1), pads, (1, 1), dy)[:3]
    got = run(x.astype(np.float32), w.astype(np.float32), b.astype(np.float32), pads,
              dy.astype(np.float32), method=method)[:3]
    m = METHODS[method]
    ey, edx, edw = abs_bounds(x, w, dy, pads, m)
    ntiles = n * W.tiles(h, h, m)[0] * W.tiles(h, h, m)[1]
    extra = 10 if m == 2 else 24  # the transforms' own roundings (winograd.py docstring)
    for name, g_, r, e, k in (("y", got[0], ref[0], ey, c + extra), ("dx", got[1], ref[1],
                              edx, f + extra), ("dw", got[2], ref[2], edw, ntiles + extra)):
        err = np.abs(g_.astype(np.float64) - r)
        assert np.all(err <= gamma(k) * e + 1e-30), (name, float(np.max(err / (e + 1e-30))))
        # and the float32 im2col path's own error is the scale to compare with: same order
        assert np.max(err) < 1e-3 * max(1.0, float(np.max(np.abs(r)))), name


def test_conv2d_layer_gradcheck_on_winograd():
    layer = Conv2D(4, 3, padding="same")
    layer.build((16, 8, 8), rng=np.random.default_rng(0), dtype=np.float64)
    x = np.random.default_rng(1).standard_normal((2, 16, 8, 8))
    layer.forward(x, training=True)
    assert layer._cache.winograd  # the default choice for this shape
    layer._cache = None
    check_layer(layer, x, tol=1e-6)


def test_conv2d_layer_gradcheck_on_winograd4(limits):
    """The public layer on the F(4x4) path (forced by the threshold), with odd sizes."""
    limits(winograd4_min_cf=0, winograd_min_channels=1)
    for c, hw, padding in ((16, (8, 8), "same"), (16, (7, 9), "valid"), (2, (28, 26), "valid")):
        layer = Conv2D(4, 3, padding=padding)
        layer.build((c,) + hw, rng=np.random.default_rng(0), dtype=np.float64)
        x = np.random.default_rng(1).standard_normal((2, c) + hw)
        layer.forward(x, training=True)
        assert layer._cache.winograd and layer._cache.tile == 4
        layer._cache = None
        check_layer(layer, x, tol=1e-6)


def test_choice_of_tile_follows_the_measured_rule():
    def tile(c, f, h, stride=1):
        g = K.conv_geometry((64, c, h, h), (3, 3), stride=(stride, stride),
                            padding=(1, 1, 1, 1))
        return plan.winograd_tile(g, f)
    assert tile(16, 16, 32) == 4 and tile(16, 32, 32) == 4  # big planes
    assert tile(32, 32, 16) == 4 and tile(32, 32, 7) == 4 and tile(16, 16, 24) == 4
    assert tile(16, 16, 14) == 2  # few channels, small plane: a tie, the smaller error
    assert tile(64, 64, 8) == 4 and tile(64, 128, 16) == 4 and tile(512, 512, 4) == 4
    assert tile(3, 16, 32) == 0 and tile(32, 32, 16, stride=2) == 0  # im2col


def test_method_winograd4_rejects_what_it_cannot_compute():
    x = np.zeros((1, 4, 8, 8), np.float32)
    with pytest.raises(ValueError, match="method='winograd4' needs a 3x3 kernel, stride 1"):
        K.conv2d_forward(x, np.zeros((2, 4, 3, 3), np.float32), None, (2, 2), (1, 1, 1, 1),
                         method="winograd4")
    with pytest.raises(ValueError, match="needs a 3x3 kernel"):
        K.conv2d_forward(x, np.zeros((2, 4, 5, 5), np.float32), None, (1, 1), (2, 2, 2, 2),
                         method="winograd4")


def test_choice_keeps_im2col_where_winograd_loses():
    g = K.conv_geometry((64, 3, 32, 32), (3, 3), padding=(1, 1, 1, 1))
    assert not plan.winograd_tile(g, 16)
    g = K.conv_geometry((64, 256, 1, 1), (3, 3), padding=(1, 1, 1, 1))
    assert not plan.winograd_tile(g, 256)  # a 1x1 output: 3 of F(2x2)'s 4 outputs wasted
    g = K.conv_geometry((64, 512, 2, 2), (3, 3), padding=(1, 1, 1, 1))
    assert plan.winograd_tile(g, 512) == 2  # one F(2x2) tile a plane, F(4x4) wastes 3/4
    g = K.conv_geometry((64, 32, 16, 16), (3, 3), stride=(2, 2), padding=(1, 1, 1, 1))
    assert not plan.winograd_tile(g, 32)
    g = K.conv_geometry((64, 32, 16, 16), (3, 3), padding=(1, 1, 1, 1))
    assert plan.winograd_tile(g, 32)


@pytest.mark.parametrize("method", ["winograd", "winograd4"])
@pytest.mark.parametrize("threads,split_mnk", [(1, 1 << 62), (2, 1 << 62), (2, 0)])
@pytest.mark.parametrize("n,c,f,h,w,pads", [(9, 4, 4, 32, 32, (1, 1, 1, 1)),
                                            (3, 16, 8, 15, 13, (0, 1, 1, 0))])
def test_winograd_threads_split_blocks_or_kernels(threads, split_mnk, n, c, f, h, w, pads,
                                                  method, limits):
    """Two threads either take whole blocks each (the default) or split every kernel
    (split_mnk below the GEMM size); both give the reference result, with and without a
    layer's work-array dict."""
    from distnn import kernels
    limits(split_mnk=split_mnk)
    rng = np.random.default_rng(n + c)
    x = rng.standard_normal((n, c, h, w))
    wt = rng.standard_normal((f, c, 3, 3))
    b = rng.standard_normal(f)
    y_ref = ref_conv(x, wt, b, (1, 1), pads, (1, 1))
    dy = rng.standard_normal(y_ref.shape)
    ref = ref_conv(x, wt, b, (1, 1), pads, (1, 1), dy)
    previous = kernels.get_num_threads()
    kernels.set_num_threads(threads)
    try:
        for ws in (None, {}):
            for got, r in zip(run(x, wt, b, pads, dy, ws=ws, method=method), ref):
                np.testing.assert_allclose(got, r, atol=1e-10)
    finally:
        kernels.set_num_threads(previous)


def test_winograd_threads_split_kernels_where_u_dominates():
    """At 2 threads the layers whose transformed weights U outweigh a thread's share of V
    and M (vgg11bn's 512-filter layers on 4x4 and 2x2 planes) split every kernel; the
    others take whole blocks each; one thread is one worker either way."""
    from distnn import kernels
    previous = kernels.get_num_threads()
    try:
        kernels.set_num_threads(2)
        # (n, c, f, tile rows, tile cols, itemsize, P)
        assert W._plan(64, 512, 512, 1, 1, 4, 36)[2] == 1     # 512->512 4x4, F(4x4)
        assert W._plan(64, 256, 512, 1, 1, 4, 36)[2] == 1     # 256->512 4x4
        assert W._plan(64, 512, 512, 1, 1, 4, 16)[2] == 1     # 512->512 2x2, F(2x2)
        assert W._plan(64, 256, 256, 2, 2, 4, 36)[2] == 2     # 256->256 8x8
        assert W._plan(64, 16, 16, 8, 8, 4, 36)[2] == 2       # 16->16 32x32
        kernels.set_num_threads(1)
        assert W._plan(64, 512, 512, 1, 1, 4, 36)[2] == 1
    finally:
        kernels.set_num_threads(previous)
    assert plan.split_kernels(512, 512, 32) and not plan.split_kernels(256, 256, 128)


@pytest.mark.parametrize("threads", [2, 3])
@pytest.mark.parametrize("n", [1, 2, 5, 31, 64, 100])
def test_winograd_whole_block_shares_are_even(n, threads):
    """Where threads take whole blocks, the blocks cover the batch once, in order, none
    larger than the plan's k, every thread gets as many, and their shares of samples differ
    by at most one (resnet20's 32->32 16x16 layer at 2 threads had 35 and 29 of 64)."""
    from distnn import kernels
    previous = kernels.get_num_threads()
    try:
        kernels.set_num_threads(threads)
        for shape in [(16, 16, 8, 8), (32, 32, 4, 4), (64, 64, 2, 2), (3, 16, 8, 8)]:
            k, blocks, workers = W._plan(n, *shape, 4, 36)
            assert [b[0] for b in blocks] == [0] + [b[1] for b in blocks[:-1]]
            assert blocks[-1][1] == n and all(0 < n1 - n0 <= k for n0, n1 in blocks)
            if workers > 1:
                assert len(blocks) % workers == 0
                shares = [sum(n1 - n0 for n0, n1 in blocks[i::workers])
                          for i in range(workers)]
                assert max(shares) - min(shares) <= 1, (shape, blocks)
    finally:
        kernels.set_num_threads(previous)


@pytest.mark.parametrize("method", ["winograd", "winograd4"])
@pytest.mark.parametrize("threads", [1, 2])
def test_winograd_empty_batch(threads, method):
    """No samples: an empty y and dx, and zero weight and bias gradients."""
    from distnn import kernels
    x = np.zeros((0, 16, 8, 8), np.float32)
    w = np.ones((8, 16, 3, 3), np.float32)
    previous = kernels.get_num_threads()
    kernels.set_num_threads(threads)
    try:
        y, dx, dw, db = run(x, w, np.ones(8, np.float32), (1, 1, 1, 1),
                            np.zeros((0, 8, 8, 8), np.float32), method=method)
    finally:
        kernels.set_num_threads(previous)
    assert y.shape == (0, 8, 8, 8) and dx.shape == x.shape
    assert not dw.any() and not db.any()


def same_padded_case(seed, n, c, f, h):
    """float64 x (n, c, h, h), 3x3 weights, bias, 'same' padding, a dy and the reference's
    (y, dx, dw, db)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c, h, h))
    wt = rng.standard_normal((f, c, 3, 3))
    b = rng.standard_normal(f)
    pads = (1, 1, 1, 1)
    dy = rng.standard_normal((n, f, h, h))
    return x, wt, b, pads, dy, ref_conv(x, wt, b, (1, 1), pads, (1, 1), dy)


@pytest.mark.parametrize("method", ["winograd", "winograd4"])
def test_winograd_backward_same_bits_whichever_thread_takes_a_block(method, monkeypatch,
                                                                   limits):
    """At 2 threads the backward keeps dU and db per block and sums them in block order,
    so the threads may take blocks as they come free: dw, db and dx have the same bits with
    blocks taken as they come, round-robin, or on a second run, and the reference values."""
    from distnn import kernels
    x, wt, b, pads, dy, ref = same_padded_case(5, 17, 16, 16, 32)
    calls = []
    run_blocks = W.run

    def recording_run(nblocks, workers, body, dynamic=False):
        calls.append((nblocks, workers, dynamic))
        return run_blocks(nblocks, workers, body, dynamic)

    monkeypatch.setattr(W, "run", recording_run)
    previous = kernels.get_num_threads()
    kernels.set_num_threads(2)
    try:
        runs = [run(x, wt, b, pads, dy, method=method) for _ in range(2)]
        limits(dynamic=False)
        runs.append(run(x, wt, b, pads, dy, method=method))
    finally:
        kernels.set_num_threads(previous)
    # 17 blocks of one sample, taken as threads come free, forward and backward
    assert calls == [(17, 2, True)] * 6
    for other in runs[1:]:
        for a, c in zip(runs[0], other):
            np.testing.assert_array_equal(a, c)
    for got, r in zip(runs[0], ref):
        np.testing.assert_allclose(got, r, atol=1e-10)


@pytest.mark.parametrize("method", ["winograd", "winograd4"])
@pytest.mark.parametrize("split_mnk", [0, 1 << 62])
def test_winograd_two_threads_split_positions_and_filter_pairs(method, split_mnk,
                                                               limits):
    """At 2 threads, a layer that splits every kernel runs its GEMMs by positions and
    (from split_weights filter pairs) the weights' adjoint by pairs among the threads: the
    reference values, and the same bits on a second run."""
    from distnn import kernels
    limits(split_mnk=split_mnk, split_weights=64 * 64)  # the weights' split at this size
    x, wt, b, pads, dy, ref = same_padded_case(11, 3, 64, 64, 4)
    previous = kernels.get_num_threads()
    kernels.set_num_threads(2)
    try:
        first, second = (run(x, wt, b, pads, dy, method=method) for _ in range(2))
    finally:
        kernels.set_num_threads(previous)
    for a, c, r in zip(first, second, ref):
        np.testing.assert_array_equal(a, c)
        np.testing.assert_allclose(a, r, atol=1e-9)
