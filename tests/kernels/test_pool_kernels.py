"""Max / average / global-average pooling kernels against naive loop references."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from distnn.kernels.pooling import (avgpool2d_backward, avgpool2d_forward,
                                    global_avgpool2d_backward, global_avgpool2d_forward,
                                    maxpool2d_backward, maxpool2d_forward)


def ref_pool(x, dy, k, s, p, mode):
    """(y, dx) by loops over output pixels; max gives dy to the first maximum (row-major)."""
    n, c, h, w = x.shape
    oh, ow = (h + 2 * p[0] - k[0]) // s[0] + 1, (w + 2 * p[1] - k[1]) // s[1] + 1
    fill = -np.inf if mode == "max" else 0.0
    xp = np.pad(x, ((0, 0), (0, 0), (p[0], p[0]), (p[1], p[1])), constant_values=fill)
    y = np.zeros((n, c, oh, ow))
    dxp = np.zeros_like(xp)
    for b in range(n):
        for ch in range(c):
            for i in range(oh):
                for j in range(ow):
                    hs = slice(i * s[0], i * s[0] + k[0])
                    ws = slice(j * s[1], j * s[1] + k[1])
                    win = xp[b, ch, hs, ws]
                    if mode == "max":
                        a = np.argmax(win)  # first occurrence
                        y[b, ch, i, j] = win.flat[a]
                        dxp[b, ch, hs, ws].flat[a] += dy[b, ch, i, j]
                    else:
                        y[b, ch, i, j] = win.mean()
                        dxp[b, ch, hs, ws] += dy[b, ch, i, j] / win.size
    return y, dxp[:, :, p[0]:p[0] + h, p[1]:p[1] + w]


@st.composite
def pool_cases(draw):
    k = (draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    s = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    p = (draw(st.integers(0, k[0] // 2)), draw(st.integers(0, k[1] // 2)))
    h = draw(st.integers(max(1, k[0] - 2 * p[0]), 9))
    w = draw(st.integers(max(1, k[1] - 2 * p[1]), 9))
    n, c = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    ties = draw(st.booleans())
    return (n, c, h, w), k, s, p, ties, draw(st.integers(0, 2**16))


def _data(shape, ties, seed):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 3, shape).astype(np.float64) if ties else rng.standard_normal(shape)
    return x, rng


@settings(max_examples=100, deadline=None)
@given(pool_cases())
def test_maxpool_matches_loops(case):
    shape, k, s, p, ties, seed = case
    x, rng = _data(shape, ties, seed)
    y, cache = maxpool2d_forward(x, k, s, p)
    dy = rng.standard_normal(y.shape)
    y_ref, dx_ref = ref_pool(x, dy, k, s, p, "max")
    np.testing.assert_array_equal(y, y_ref)
    np.testing.assert_allclose(maxpool2d_backward(dy, cache), dx_ref, atol=1e-12)


@settings(max_examples=100, deadline=None)
@given(pool_cases())
def test_avgpool_matches_loops(case):
    shape, k, s, p, ties, seed = case
    x, rng = _data(shape, ties, seed)
    y, cache = avgpool2d_forward(x, k, s, p)
    dy = rng.standard_normal(y.shape)
    y_ref, dx_ref = ref_pool(x, dy, k, s, p, "avg")
    np.testing.assert_allclose(y, y_ref, atol=1e-12)
    np.testing.assert_allclose(avgpool2d_backward(dy, cache), dx_ref, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("hw", [(4, 6), (8, 8), (5, 6), (7, 5)])  # even: NumPy fast path
def test_maxpool_2x2(dtype, ties, hw):
    x, rng = _data((3, 2) + hw, ties, 7)
    x = x.astype(dtype)
    y, cache = maxpool2d_forward(x, (2, 2), (2, 2))
    dy = rng.standard_normal(y.shape).astype(dtype)
    dx = maxpool2d_backward(dy, cache)
    assert y.dtype == dtype and dx.dtype == dtype
    y_ref, dx_ref = ref_pool(x.astype(np.float64), dy.astype(np.float64), (2, 2), (2, 2),
                             (0, 0), "max")
    np.testing.assert_array_equal(y, y_ref.astype(dtype))
    np.testing.assert_array_equal(dx, dx_ref.astype(dtype))
    # exactly one element of each window receives the gradient
    h2, w2 = hw[0] // 2 * 2, hw[1] // 2 * 2
    windows = (dx[:, :, :h2, :w2] != 0).reshape(3, 2, h2 // 2, 2, w2 // 2, 2)
    assert (windows.sum(axis=(3, 5)) == 1).all()


def test_maxpool_all_equal_window_gives_first():
    x = np.ones((1, 1, 2, 2))
    y, cache = maxpool2d_forward(x, (2, 2), (2, 2))
    np.testing.assert_array_equal(maxpool2d_backward(np.ones((1, 1, 1, 1)), cache),
                                  [[[[1, 0], [0, 0]]]])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_global_avgpool(dtype):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((3, 4, 5, 6)).astype(dtype)
    y = global_avgpool2d_forward(x)
    assert y.shape == (3, 4) and y.dtype == dtype
    np.testing.assert_allclose(y, x.mean(axis=(2, 3)), rtol=1e-5)
    dy = rng.standard_normal((3, 4)).astype(dtype)
    dx = global_avgpool2d_backward(dy, x.shape)
    assert dx.dtype == dtype
    np.testing.assert_allclose(dx, np.broadcast_to(dy[:, :, None, None] / 30, x.shape),
                               rtol=1e-6)
