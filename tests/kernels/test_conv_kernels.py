"""im2col / col2im / conv2d kernels against naive loop references."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from distnn.kernels import (col2im, conv2d_backward, conv2d_forward, conv_output_size,
                            im2col, same_padding)


def ref_geometry(x_shape, k, stride, pads, dil):
    n, c, h, w = x_shape
    oh = conv_output_size(h, k[0], stride[0], pads[0], pads[1], dil[0])
    ow = conv_output_size(w, k[1], stride[1], pads[2], pads[3], dil[1])
    return oh, ow


def ref_windows(x_shape, k, stride, pads, dil):
    """Yield (n, oh, ow, (hs, ws)) with the slices of the padded input each output reads."""
    n, _, _, _ = x_shape
    oh, ow = ref_geometry(x_shape, k, stride, pads, dil)
    for b in range(n):
        for i in range(oh):
            for j in range(ow):
                hs = slice(i * stride[0], i * stride[0] + dil[0] * (k[0] - 1) + 1, dil[0])
                ws = slice(j * stride[1], j * stride[1] + dil[1] * (k[1] - 1) + 1, dil[1])
                yield b, i, j, (hs, ws)


def pad(x, pads):
    pt, pb, pl, pr = pads
    return np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)))


def ref_im2col(x, k, stride, pads, dil):
    n, c = x.shape[:2]
    oh, ow = ref_geometry(x.shape, k, stride, pads, dil)
    xp = pad(x, pads)
    col = np.zeros((c * k[0] * k[1], n * oh * ow), x.dtype)
    for b, i, j, (hs, ws) in ref_windows(x.shape, k, stride, pads, dil):
        col[:, (b * oh + i) * ow + j] = xp[b, :, hs, ws].reshape(-1)
    return col


def ref_col2im(col, x_shape, k, stride, pads, dil):
    n, c, h, w = x_shape
    oh, ow = ref_geometry(x_shape, k, stride, pads, dil)
    dxp = pad(np.zeros(x_shape, col.dtype), pads)
    for b, i, j, (hs, ws) in ref_windows(x_shape, k, stride, pads, dil):
        dxp[b, :, hs, ws] += col[:, (b * oh + i) * ow + j].reshape(c, k[0], k[1])
    return dxp[:, :, pads[0]:pads[0] + h, pads[2]:pads[2] + w]


def ref_conv(x, w, b, stride, pads, dil, dy=None):
    """Forward y, and when dy is given also (dx, dw, db), by loops over output pixels."""
    f = w.shape[0]
    oh, ow = ref_geometry(x.shape, w.shape[2:], stride, pads, dil)
    xp = pad(x, pads)
    y = np.zeros((x.shape[0], f, oh, ow))
    dxp, dw = np.zeros_like(xp), np.zeros_like(w)
    for n, i, j, (hs, ws) in ref_windows(x.shape, w.shape[2:], stride, pads, dil):
        patch = xp[n, :, hs, ws]
        y[n, :, i, j] = np.tensordot(w, patch, axes=3) + (0 if b is None else b)
        if dy is not None:
            dxp[n, :, hs, ws] += np.tensordot(dy[n, :, i, j], w, axes=1)
            dw += dy[n, :, i, j][:, None, None, None] * patch
    if dy is None:
        return y
    h, wd = x.shape[2:]
    return y, dxp[:, :, pads[0]:pads[0] + h, pads[2]:pads[2] + wd], dw, dy.sum(axis=(0, 2, 3))


@st.composite
def conv_cases(draw):
    k = (draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    stride = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    dil = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    pads = tuple(draw(st.integers(0, 2)) for _ in range(4))
    n, c = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    h = draw(st.integers(max(1, dil[0] * (k[0] - 1) + 1 - pads[0] - pads[1]), 9))
    w = draw(st.integers(max(1, dil[1] * (k[1] - 1) + 1 - pads[2] - pads[3]), 9))
    f = draw(st.integers(1, 3))
    seed = draw(st.integers(0, 2**16))
    return (n, c, h, w), f, k, stride, pads, dil, seed


@settings(max_examples=80, deadline=None)
@given(conv_cases())
def test_im2col_col2im_match_loops(case):
    x_shape, _, k, stride, pads, dil, seed = case
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(x_shape)
    col = im2col(x, k, stride, pads, dil)
    np.testing.assert_array_equal(col, ref_im2col(x, k, stride, pads, dil))
    c = rng.standard_normal(col.shape)
    np.testing.assert_allclose(col2im(c, x_shape, k, stride, pads, dil),
                               ref_col2im(c, x_shape, k, stride, pads, dil), atol=1e-12)
    # adjoint: <im2col(x), c> == <x, col2im(c)>
    assert np.isclose(np.sum(col * c), np.sum(x * col2im(c, x_shape, k, stride, pads, dil)))


@settings(max_examples=80, deadline=None)
@given(conv_cases())
def test_conv2d_matches_loops(case):
    x_shape, f, k, stride, pads, dil, seed = case
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(x_shape)
    w = rng.standard_normal((f, x_shape[1]) + k)
    b = rng.standard_normal(f)
    oh, ow = ref_geometry(x_shape, k, stride, pads, dil)
    dy = rng.standard_normal((x_shape[0], f, oh, ow))
    y_ref, dx_ref, dw_ref, db_ref = ref_conv(x, w, b, stride, pads, dil, dy)
    methods = ([("flat", True), ("flat", False), ("compact", None)] if stride == (1, 1)
               else [("compact", None)])
    for method, keep in methods:
        ws = {}
        for _ in range(2):  # the second pass reuses the work arrays
            y, cache = conv2d_forward(x, w, b, stride, pads, dil, ws=ws, method=method,
                                      keep_columns=keep)
            np.testing.assert_allclose(y, y_ref, atol=1e-12, err_msg=method)
            dx, dw, db = conv2d_backward(dy, cache, w, ws=ws)
            np.testing.assert_allclose(dx, dx_ref, atol=1e-12, err_msg=method)
            np.testing.assert_allclose(dw, dw_ref, atol=1e-12, err_msg=method)
            np.testing.assert_allclose(db, db_ref, atol=1e-12, err_msg=method)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("stride", [1, 2])
def test_conv2d_keeps_dtype_and_writes_outputs_in_place(dtype, stride):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 7, 8)).astype(dtype)
    w = rng.standard_normal((4, 3, 3, 3)).astype(dtype)
    b = rng.standard_normal(4).astype(dtype)
    y, cache = conv2d_forward(x, w, b, (stride, stride), (1, 1, 1, 1))
    assert y.dtype == dtype and y.flags.c_contiguous
    dy = rng.standard_normal(y.shape).astype(dtype)
    dw_out, db_out = np.full(w.shape, 7, dtype), np.full(4, 7, dtype)
    dx, dw, db = conv2d_backward(dy, cache, w, dw_out=dw_out, db_out=db_out)
    assert dw is dw_out and db is db_out and dx.dtype == dtype and dx.shape == x.shape
    _, dx_ref, dw_ref, db_ref = ref_conv(x.astype(np.float64), w.astype(np.float64), b,
                                         (stride, stride), (1, 1, 1, 1), (1, 1),
                                         dy.astype(np.float64))
    tol = 1e-4 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(dw, dw_ref, rtol=tol, atol=tol)
    np.testing.assert_allclose(dx, dx_ref, rtol=tol, atol=tol)


def test_conv2d_backward_without_dx_or_db():
    rng = np.random.default_rng(2)
    x, w = rng.standard_normal((2, 1, 6, 6)), rng.standard_normal((3, 1, 3, 3))
    y, cache = conv2d_forward(x, w)
    dx, dw, db = conv2d_backward(np.ones_like(y), cache, w, need_dx=False, need_db=False)
    assert dx is None and db is None
    np.testing.assert_allclose(dw, ref_conv(x, w, None, (1, 1), (0,) * 4, (1, 1),
                                            np.ones_like(y))[2], atol=1e-12)


def test_work_arrays_follow_shape_changes():
    rng = np.random.default_rng(3)
    w = rng.standard_normal((2, 2, 3, 3))
    ws = {}
    for n, h in [(3, 6), (1, 5), (3, 6)]:
        x = rng.standard_normal((n, 2, h, h))
        y, _ = conv2d_forward(x, w, None, (1, 1), (1, 1, 1, 1), ws=ws)
        np.testing.assert_allclose(y, ref_conv(x, w, None, (1, 1), (1, 1, 1, 1), (1, 1)),
                                   atol=1e-12)


@pytest.mark.parametrize("size,k,s,d,expected", [
    (28, 3, 1, 1, (1, 1)), (28, 3, 2, 1, (0, 1)), (7, 2, 1, 1, (0, 1)), (5, 3, 2, 2, (2, 2)),
    (6, 1, 2, 1, (0, 0)), (4, 5, 3, 1, (2, 2)), (6, 4, 3, 1, (0, 1)),
])
def test_same_padding(size, k, s, d, expected):
    lo, hi = same_padding(size, k, s, d)
    assert (lo, hi) == expected
    assert conv_output_size(size, k, s, lo, hi, d) == -(-size // s)


@pytest.mark.parametrize("c,pads,dil", [(16, (1, 1, 1, 1), (1, 1)), (17, (0, 2, 1, 0), (1, 2)),
                                        (1, (1, 1, 1, 1), (1, 1))])
def test_flat_layout_without_columns_matches_loops(c, pads, dil):
    """C >= 16 runs the forward as one GEMM per shifted view (no column matrix); C == 1 and
    C >= 16 compute dw from shifted views: both against the loop reference."""
    rng = np.random.default_rng(c)
    x = rng.standard_normal((2, c, 6, 7))
    w = rng.standard_normal((3, c, 3, 3))
    b = rng.standard_normal(3)
    oh, ow = ref_geometry(x.shape, (3, 3), (1, 1), pads, dil)
    dy = rng.standard_normal((2, 3, oh, ow))
    y_ref, dx_ref, dw_ref, db_ref = ref_conv(x, w, b, (1, 1), pads, dil, dy)
    ws = {}
    for _ in range(2):
        y, cache = conv2d_forward(x, w, b, (1, 1), pads, dil, ws=ws, method="flat")
        assert cache.col is None and cache.x is not None
        dx, dw, db = conv2d_backward(dy, cache, w, ws=ws)
        for got, ref in ((y, y_ref), (dx, dx_ref), (dw, dw_ref), (db, db_ref)):
            np.testing.assert_allclose(got, ref, atol=1e-11)


@st.composite
def stride1_cases(draw):
    """Stride-1 geometries for the direct kernels: kernel rows of 1-5 taps (the 3-tap
    blocks and their remainders), 1-6 filters (the 4-filter blocks and remainders),
    paddings wider than the kernel (dx then crops dy)."""
    k = (draw(st.integers(1, 5)), draw(st.integers(1, 5)))
    dil = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    pads = tuple(draw(st.integers(0, 3)) for _ in range(4))
    n, c = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    h = draw(st.integers(max(1, dil[0] * (k[0] - 1) + 1 - pads[0] - pads[1]), 9))
    w = draw(st.integers(max(1, dil[1] * (k[1] - 1) + 1 - pads[2] - pads[3]), 9))
    return (n, c, h, w), draw(st.integers(1, 6)), k, pads, dil, draw(st.integers(0, 2**16))


@settings(max_examples=80, deadline=None)
@given(stride1_cases())
def test_direct_conv_matches_loops(case):
    pytest.importorskip("numba")
    x_shape, f, k, pads, dil, seed = case
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(x_shape)
    w = rng.standard_normal((f, x_shape[1]) + k)
    b = rng.standard_normal(f)
    oh, ow = ref_geometry(x_shape, k, (1, 1), pads, dil)
    dy = rng.standard_normal((x_shape[0], f, oh, ow))
    y_ref, dx_ref, dw_ref, db_ref = ref_conv(x, w, b, (1, 1), pads, dil, dy)
    ws = {}
    for _ in range(2):  # the second pass reuses the work arrays
        y, cache = conv2d_forward(x, w, b, (1, 1), pads, dil, ws=ws, method="direct")
        assert cache.direct
        np.testing.assert_allclose(y, y_ref, atol=1e-12)
        dx, dw, db = conv2d_backward(dy, cache, w, ws=ws)
        for got, ref in ((dx, dx_ref), (dw, dw_ref), (db, db_ref)):
            np.testing.assert_allclose(got, ref, atol=1e-12)


@pytest.mark.parametrize("c,f,k,pad", [(1, 4, 3, 1), (4, 8, 3, 1), (1, 6, 5, 2), (3, 16, 3, 1),
                                       (3, 5, 3, 0)])
def test_direct_conv_float32_model_shapes(c, f, k, pad):
    """The model-zoo shapes the compiled path sends to the direct kernels, in float32 (what
    training uses) against the float64 loop reference; dw sums 2*14*14 products."""
    pytest.importorskip("numba")
    from distnn.kernels.planner import use_direct
    from distnn.kernels.im2col import conv_geometry
    rng = np.random.default_rng(c * 100 + f)
    x = rng.standard_normal((2, c, 14, 14)).astype(np.float32)
    w = rng.standard_normal((f, c, k, k)).astype(np.float32)
    b = rng.standard_normal(f).astype(np.float32)
    pads = (pad,) * 4
    assert use_direct(conv_geometry(x.shape, (k, k), (1, 1), pads), f)
    y, cache = conv2d_forward(x, w, b, (1, 1), pads, method="direct")
    dy = rng.standard_normal(y.shape).astype(np.float32)
    dx, dw, db = conv2d_backward(dy, cache, w)
    assert y.dtype == dx.dtype == dw.dtype == db.dtype == np.float32
    refs = ref_conv(x.astype(np.float64), w.astype(np.float64), b.astype(np.float64),
                    (1, 1), pads, (1, 1), dy.astype(np.float64))
    for got, ref in zip((y, dx, dw, db), refs):
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


def test_direct_conv_empty_batch_and_no_dx():
    pytest.importorskip("numba")
    rng = np.random.default_rng(5)
    w = rng.standard_normal((3, 2, 3, 3))
    y, cache = conv2d_forward(np.zeros((0, 2, 5, 5)), w, None, (1, 1), (1,) * 4,
                              method="direct")
    assert y.shape == (0, 3, 5, 5)
    dx, dw, db = conv2d_backward(np.zeros(y.shape), cache, w)
    assert dx.shape == (0, 2, 5, 5) and not dw.any() and not db.any()
    x = rng.standard_normal((2, 2, 5, 5))
    y, cache = conv2d_forward(x, w, None, (1, 1), (1,) * 4, method="direct")
    dx, dw, db = conv2d_backward(np.ones_like(y), cache, w, need_dx=False, need_db=False)
    assert dx is None and db is None
    np.testing.assert_allclose(dw, ref_conv(x, w, None, (1, 1), (1,) * 4, (1, 1),
                                            np.ones_like(y))[2], atol=1e-12)


def test_direct_conv_needs_stride_1():
    pytest.importorskip("numba")
    with pytest.raises(ValueError, match="method='direct' needs stride 1"):
        conv2d_forward(np.zeros((1, 1, 5, 5)), np.zeros((1, 1, 3, 3)), None, (2, 2),
                       method="direct")


@pytest.mark.parametrize("fwd_threads,bwd_threads", [(2, 1), (1, 2), (2, 2)])
def test_direct_conv_thread_counts(fwd_threads, bwd_threads):
    """Samples split among threads (each thread sums its own dw), also when the thread
    count changes between forward and backward: the loop reference either way."""
    pytest.importorskip("numba")
    from distnn import kernels
    rng = np.random.default_rng(7)
    x = rng.standard_normal((5, 3, 9, 8))
    w = rng.standard_normal((6, 3, 3, 3))
    b = rng.standard_normal(6)
    dy = rng.standard_normal((5, 6, 9, 8))
    y_ref, *grads_ref = ref_conv(x, w, b, (1, 1), (1,) * 4, (1, 1), dy)
    previous = kernels.get_num_threads()
    try:
        kernels.set_num_threads(fwd_threads)
        y, cache = conv2d_forward(x, w, b, (1, 1), (1,) * 4, method="direct", ws={})
        kernels.set_num_threads(bwd_threads)
        grads = conv2d_backward(dy, cache, w)
    finally:
        kernels.set_num_threads(previous)
    np.testing.assert_allclose(y, y_ref, atol=1e-12)
    for got, ref in zip(grads, grads_ref):
        np.testing.assert_allclose(got, ref, atol=1e-12)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 3), st.integers(1, 3), st.integers(1, 3), st.integers(1, 9),
       st.integers(1, 9), st.integers(1, 3), st.integers(1, 5), st.integers(0, 2**16))
def test_pointwise_conv_matches_loops(n, c, f, h, w, sh, sw, seed):
    """1x1 kernels, any stride, no padding: strided slice + GEMMs, against the loops."""
    pytest.importorskip("numba")
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c, h, w))
    wt = rng.standard_normal((f, c, 1, 1))
    b = rng.standard_normal(f)
    stride, pads = (sh, sw), (0, 0, 0, 0)
    oh, ow = ref_geometry(x.shape, (1, 1), stride, pads, (1, 1))
    dy = rng.standard_normal((n, f, oh, ow))
    y_ref, *grads_ref = ref_conv(x, wt, b, stride, pads, (1, 1), dy)
    ws = {}
    for _ in range(2):
        y, cache = conv2d_forward(x, wt, b, stride, pads, ws=ws, method="pointwise")
        assert cache.pointwise
        np.testing.assert_allclose(y, y_ref, atol=1e-12)
        for got, ref in zip(conv2d_backward(dy, cache, wt, ws=ws), grads_ref):
            np.testing.assert_allclose(got, ref, atol=1e-12)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("stride", [1, 2])
def test_pointwise_conv_float32_threads(stride, threads):
    """resnet20's 1x1 stride-2 shortcut shape (scaled down) in float32, 1 and 2 threads."""
    pytest.importorskip("numba")
    from distnn import kernels
    rng = np.random.default_rng(stride)
    x = rng.standard_normal((5, 16, 8, 8)).astype(np.float32)
    w = rng.standard_normal((32, 16, 1, 1)).astype(np.float32)
    previous = kernels.get_num_threads()
    try:
        kernels.set_num_threads(threads)
        y, cache = conv2d_forward(x, w, None, (stride, stride), method="pointwise")
        dy = rng.standard_normal(y.shape).astype(np.float32)
        dx, dw, db = conv2d_backward(dy, cache, w)
    finally:
        kernels.set_num_threads(previous)
    assert y.dtype == dx.dtype == dw.dtype == db.dtype == np.float32
    refs = ref_conv(x.astype(np.float64), w.astype(np.float64), None, (stride, stride),
                    (0,) * 4, (1, 1), dy.astype(np.float64))
    for got, ref in zip((y, dx, dw, db), refs):
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


def test_pointwise_conv_needs_1x1_without_padding():
    pytest.importorskip("numba")
    with pytest.raises(ValueError, match="method='pointwise' needs a 1x1 kernel and no pad"):
        conv2d_forward(np.zeros((1, 1, 5, 5)), np.zeros((1, 1, 1, 1)), None, (1, 1),
                       (1, 1, 1, 1), method="pointwise")


@pytest.mark.parametrize("c,f,hw", [(16, 32, 2), (3, 2, 9)])
def test_pointwise_dw_both_ways(c, f, hw):
    """dw of 1x1 layers: one GEMM over transposed copies when F*C outweighs (F+C)*P (deep
    layers on small planes, first case), else per-sample products summed (second)."""
    pytest.importorskip("numba")
    rng = np.random.default_rng(c)
    x = rng.standard_normal((4, c, hw, hw))
    w = rng.standard_normal((f, c, 1, 1))
    y, cache = conv2d_forward(x, w, None, method="pointwise")
    dy = rng.standard_normal(y.shape)
    ref = ref_conv(x, w, None, (1, 1), (0,) * 4, (1, 1), dy)
    for got, r in zip(conv2d_backward(dy, cache, w), ref[1:]):
        np.testing.assert_allclose(got, r, atol=1e-11)
