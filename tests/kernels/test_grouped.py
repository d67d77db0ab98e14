"""Grouped and depthwise convolution kernels (``kernels.grouped``, the compiled depthwise
loops) against a naive float64 loop reference, through ``conv2d_forward(groups=...)``."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from distnn import kernels
from distnn.kernels import grouped
from distnn.kernels.conv import conv2d_backward, conv2d_forward, conv_output_size


def ref_grouped(x, w, b, stride, pads, dil, groups, dy):
    """(y, dx, dw, db) in float64 by loops over output pixels and groups."""
    x, w, dy = (a.astype(np.float64) for a in (x, w, dy))
    n, c, h, wd = x.shape
    f, cg, kh, kw = w.shape
    fg = f // groups
    oh = conv_output_size(h, kh, stride[0], pads[0], pads[1], dil[0])
    ow = conv_output_size(wd, kw, stride[1], pads[2], pads[3], dil[1])
    xp = np.pad(x, ((0, 0), (0, 0), (pads[0], pads[1]), (pads[2], pads[3])))
    y = np.zeros((n, f, oh, ow))
    dxp, dw = np.zeros_like(xp), np.zeros_like(w)
    for s in range(n):
        for i in range(oh):
            for j in range(ow):
                hs = slice(i * stride[0], i * stride[0] + dil[0] * (kh - 1) + 1, dil[0])
                ws = slice(j * stride[1], j * stride[1] + dil[1] * (kw - 1) + 1, dil[1])
                for k in range(groups):
                    fs, cs = slice(k * fg, (k + 1) * fg), slice(k * cg, (k + 1) * cg)
                    patch = xp[s, cs, hs, ws]
                    y[s, fs, i, j] = np.tensordot(w[fs], patch, axes=3)
                    dxp[s, cs, hs, ws] += np.tensordot(dy[s, fs, i, j], w[fs], axes=1)
                    dw[fs] += dy[s, fs, i, j][:, None, None, None] * patch
    if b is not None:
        y += b.astype(np.float64)[None, :, None, None]
    dx = dxp[:, :, pads[0]:pads[0] + h, pads[2]:pads[2] + wd]
    return y, dx, dw, dy.sum(axis=(0, 2, 3))


@st.composite
def grouped_cases(draw, depthwise=False):
    k = (draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    stride = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    dil = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    pads = tuple(draw(st.integers(0, 2)) for _ in range(4))
    groups = draw(st.integers(2 if depthwise else 1, 4))
    cg = 1 if depthwise else draw(st.integers(1, 3))
    fg = draw(st.integers(1, 2)) if depthwise else draw(st.integers(1, 3))
    n = draw(st.integers(1, 3))
    h = draw(st.integers(max(1, dil[0] * (k[0] - 1) + 1 - pads[0] - pads[1]), 9))
    w = draw(st.integers(max(1, dil[1] * (k[1] - 1) + 1 - pads[2] - pads[3]), 9))
    bias = draw(st.booleans())
    seed = draw(st.integers(0, 2**16))
    return (n, groups * cg, h, w), groups * fg, k, stride, pads, dil, groups, bias, seed


def _check(case, dtype, rtol):
    x_shape, f, k, stride, pads, dil, groups, bias, seed = case
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(x_shape).astype(dtype)
    w = rng.standard_normal((f, x_shape[1] // groups) + k).astype(dtype)
    b = rng.standard_normal(f).astype(dtype) if bias else None
    y, cache = conv2d_forward(x, w, b, stride, pads, dil, groups=groups)
    dy = rng.standard_normal(y.shape).astype(dtype)
    y_ref, dx_ref, dw_ref, db_ref = ref_grouped(x, w, b, stride, pads, dil, groups, dy)
    assert y.dtype == dtype and y.shape == y_ref.shape

    def close(a, ref, what):
        scale = max(1.0, float(np.max(np.abs(ref))))
        np.testing.assert_allclose(a, ref, atol=rtol * scale, rtol=rtol, err_msg=what)

    close(y, y_ref, "y")
    dw_out = np.full(w.shape, np.nan, dtype)  # overwritten, not accumulated
    dx, dw, db = conv2d_backward(dy, cache, w, dw_out=dw_out, need_db=bias)
    assert dw is dw_out and dx.dtype == dtype
    close(dx, dx_ref, "dx")
    close(dw, dw_ref, "dw")
    if bias:
        close(db, db_ref, "db")
    else:
        assert db is None
    return cache


@settings(max_examples=40, deadline=None)
@given(grouped_cases())
def test_grouped_matches_loops_float64(case):
    _check(case, np.float64, 1e-10)


@settings(max_examples=20, deadline=None)
@given(grouped_cases())
def test_grouped_matches_loops_float32(case):
    _check(case, np.float32, 2e-5)


@pytest.mark.parametrize("dtype, rtol", [(np.float64, 1e-10), (np.float32, 2e-5)])
@settings(max_examples=25, deadline=None)
@given(case=grouped_cases(depthwise=True))
def test_depthwise_matches_loops_at_1_and_2_threads(case, dtype, rtol, kernel_backend):
    """Depthwise (with channel multipliers 1 and 2): the compiled loops on the compiled
    backend (the cache says so), the NumPy reference on the other; the same bits at 1 and 2
    threads (each plane is one thread's)."""
    x_shape, f, k, stride, pads, dil, groups, bias, seed = case
    case = (x_shape, f, k, stride, pads, dil, x_shape[1], bias, seed)
    results = []
    previous = kernels.get_num_threads()
    try:
        for threads in (1, 2):
            kernels.set_num_threads(threads)
            cache = _check(case, dtype, rtol)
            assert cache.method == ("depthwise" if kernel_backend == "numba" else "shifted")
            rng = np.random.default_rng(seed)
            x = rng.standard_normal(x_shape).astype(dtype)
            w = rng.standard_normal((f, 1) + k).astype(dtype)
            y, c2 = conv2d_forward(x, w, None, stride, pads, dil, groups=x_shape[1])
            results.append((y, *conv2d_backward(np.ones_like(y), c2, w, need_db=False)[:2]))
    finally:
        kernels.set_num_threads(previous)
    for a, b in zip(results[0], results[1]):
        np.testing.assert_array_equal(a, b)


def test_groups_one_keeps_the_ungrouped_path():
    x = np.random.default_rng(0).standard_normal((2, 4, 6, 6))
    w = np.random.default_rng(1).standard_normal((8, 4, 3, 3))
    y1, c1 = conv2d_forward(x, w, None, (1, 1), (1, 1, 1, 1))
    y2, c2 = conv2d_forward(x, w, None, (1, 1), (1, 1, 1, 1), groups=1)
    assert type(c1).__name__ == type(c2).__name__ == "ConvCache"
    np.testing.assert_array_equal(y1, y2)


def test_groups_must_divide_channels_and_filters():
    x = np.zeros((1, 6, 5, 5))
    with pytest.raises(ValueError, match=r"groups=4 must divide both the input channels "
                                         r"\(6\) and the filters \(8\)"):
        conv2d_forward(x, np.zeros((8, 1, 3, 3)), groups=4)
    with pytest.raises(ValueError, match="3 input channels per group"):
        conv2d_forward(x, np.zeros((6, 3, 3, 3)), groups=3)
    with pytest.raises(ValueError, match="method='depthwise' needs groups == channels"):
        grouped.forward(x, np.zeros((6, 2, 3, 3)), None,
                        grouped.ConvGeometry(1, 6, 5, 5, 3, 3, 1, 1, 0, 0, 0, 0, 1, 1, 3, 3),
                        3, method="depthwise")
