"""The compiled backend against the NumPy reference, and the backend switch itself."""
import numpy as np
import pytest

from distnn import kernels
from distnn.kernels import batchnorm as B
from distnn.kernels import conv as C
from distnn.kernels import pooling as P
from distnn.nn.activations import ReLU

numba = pytest.importorskip("numba")

CONV_CASES = [  # (n, c, h, w), (f, kh, kw), stride, pads (t, b, l, r), dilation
    ((5, 3, 9, 8), (4, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),
    ((3, 1, 28, 28), (4, 3, 3), (1, 1), (0, 0, 0, 0), (1, 1)),
    ((4, 6, 14, 14), (16, 5, 5), (1, 1), (2, 2, 2, 2), (1, 1)),
    ((2, 4, 11, 9), (3, 3, 2), (2, 3), (0, 1, 2, 0), (1, 1)),
    ((3, 2, 10, 10), (5, 3, 3), (1, 1), (2, 2, 2, 2), (2, 2)),
    ((7, 16, 8, 8), (8, 1, 1), (2, 2), (0, 0, 0, 0), (1, 1)),
]


def both(fn):
    """fn() under the NumPy backend, then under numba."""
    out = []
    previous = kernels.backend()
    try:
        for name in ("numpy", "numba"):
            kernels.set_backend(name)
            out.append(fn())
    finally:
        kernels.set_backend(previous)
    return out


@pytest.mark.parametrize("threads", [1, 2], indirect=True)
@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-12), (np.float32, 2e-5)])
@pytest.mark.parametrize("chunk", [None, 1])
@pytest.mark.parametrize("xs,ws,stride,pads,dil", CONV_CASES)
def test_conv_matches_numpy(xs, ws, stride, pads, dil, chunk, dtype, tol, threads, limits):
    """With 2 threads each thread takes whole blocks of samples (kept columns included)."""
    if chunk is not None:  # one sample per column block, nothing kept for backward
        limits(chunk_bytes=chunk, keep_columns_bytes=0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal(xs).astype(dtype)
    w = rng.standard_normal((ws[0], xs[1]) + ws[1:]).astype(dtype)
    b = rng.standard_normal(ws[0]).astype(dtype)

    def run():
        y, cache = C.conv2d_forward(x, w, b, stride, pads, dil, ws={})
        dy = np.random.default_rng(1).standard_normal(y.shape).astype(dtype)
        return (y,) + C.conv2d_backward(dy, cache, w, ws={})

    ref, got = both(run)
    for r, g in zip(ref, got):
        assert g.dtype == r.dtype and g.shape == r.shape
        np.testing.assert_allclose(g, r, rtol=tol, atol=tol * 10)


def test_conv_kept_columns_when_the_thread_count_changes_before_backward(limits):
    """Columns kept in blocks for 2 threads, backward on 1 (or the reverse): the blocks no
    longer match, so backward builds the columns again and still gives the reference."""
    limits(direct_max_ckk=0)  # the im2col path
    rng = np.random.default_rng(3)
    x = rng.standard_normal((5, 3, 9, 8))
    w = rng.standard_normal((4, 3, 3, 3))
    dy = rng.standard_normal((5, 4, 9, 8))
    previous, backend = kernels.get_num_threads(), kernels.backend()
    try:
        kernels.set_backend("numpy")
        y_ref, cache = C.conv2d_forward(x, w, None, (1, 1), (1, 1, 1, 1))
        ref = C.conv2d_backward(dy, cache, w, need_db=False)
        kernels.set_backend("numba")
        for fwd_threads, bwd_threads in ((2, 1), (1, 2)):
            kernels.set_num_threads(fwd_threads)
            y, cache = C.conv2d_forward(x, w, None, (1, 1), (1, 1, 1, 1), ws={})
            assert cache.col is not None  # kept
            kernels.set_num_threads(bwd_threads)
            got = C.conv2d_backward(dy, cache, w, need_db=False)
            np.testing.assert_allclose(y, y_ref, atol=1e-12)
            for g, r in zip(got[:2], ref[:2]):
                np.testing.assert_allclose(g, r, atol=1e-12)
    finally:
        kernels.set_num_threads(previous)
        kernels.set_backend(backend)


@pytest.mark.parametrize("xs,pool,stride,pad", [
    ((2, 3, 8, 8), (2, 2), (2, 2), (0, 0)),
    ((2, 3, 9, 7), (2, 2), (2, 2), (0, 0)),
    ((2, 3, 9, 7), (3, 3), (2, 2), (1, 1)),
    ((1, 2, 6, 6), (3, 2), (1, 2), (1, 0)),
])
def test_maxpool_matches_numpy(xs, pool, stride, pad):
    x = np.random.default_rng(0).standard_normal(xs)

    def run():
        y, cache = P.maxpool2d_forward(x, pool, stride, pad)
        return y, P.maxpool2d_backward(np.random.default_rng(1).standard_normal(y.shape), cache)

    (y0, dx0), (y1, dx1) = both(run)
    np.testing.assert_array_equal(y1, y0)
    np.testing.assert_allclose(dx1, dx0, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-11), (np.float32, 1e-4)])
@pytest.mark.parametrize("shape", [(8, 5, 6, 6), (16, 7), (3, 4, 5)])
def test_batchnorm_and_relu_match_numpy(shape, dtype, tol):
    rng = np.random.default_rng(0)
    x = (3 * rng.standard_normal(shape) + 1).astype(dtype)
    dy = rng.standard_normal(shape).astype(dtype)
    gamma, beta = (rng.standard_normal(shape[1]).astype(dtype) for _ in range(2))

    def run():
        y, xhat, mean, var, invstd = B.bn_forward_train(x, gamma, beta, 1e-5)
        s1, s2 = B.bn_grad_sums(dy, xhat)
        dx = B.bn_backward_dx(dy, xhat, gamma, invstd, s1, s2, x.size // x.shape[1])
        yi = B.bn_inference(x, mean, var, gamma, beta, 1e-5)
        relu = ReLU()
        relu.build(shape[1:], rng=rng, dtype=dtype)
        return y, xhat, mean, var, invstd, s1, s2, dx, yi, relu.forward(x), relu.backward(dy)

    for r, g in zip(*both(run)):
        assert g.dtype == r.dtype and g.shape == r.shape
        np.testing.assert_allclose(g, r, rtol=tol, atol=tol)


def test_set_backend_and_env(monkeypatch):
    previous = kernels.backend()
    try:
        assert kernels.set_backend("numpy") == "numpy" and kernels.backend() == "numpy"
        assert kernels.set_backend("numba") == "numba"
        monkeypatch.setenv("DISTNN_KERNELS", "numpy")
        assert kernels.set_backend(None) == "numpy"
        monkeypatch.setenv("DISTNN_KERNELS", "fortran")
        with pytest.raises(ValueError, match="DISTNN_KERNELS"):
            kernels.set_backend(None)
    finally:
        kernels.set_backend(previous)


@pytest.mark.parametrize("threads", [1, 2])
def test_thread_counts_agree(threads):
    """Serial (1 thread) and parallel compilations give the NumPy result."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 3, 9, 9))
    w = rng.standard_normal((5, 3, 3, 3))
    before = kernels.get_num_threads()
    try:
        def run():
            kernels.set_num_threads(threads)
            y, cache = C.conv2d_forward(x, w, None, (1, 1), (1, 1, 1, 1))
            dx, dw, _ = C.conv2d_backward(np.ones_like(y), cache, w, need_db=False)
            yb, xhat, *_ = B.bn_forward_train(y, np.ones(5), np.zeros(5), 1e-5)
            return y, dx, dw, yb
        for r, g in zip(*both(run)):
            np.testing.assert_allclose(g, r, rtol=1e-12, atol=1e-12)
    finally:
        kernels.set_num_threads(before)


@pytest.mark.parametrize("threads", [1, 2], indirect=True)
@pytest.mark.parametrize("m,k,n", [(64, 512, 512), (3, 5, 7), (600, 600, 600)])
def test_matmul_small_on_one_blas_thread_same_result(m, k, n, threads):
    """kernels.matmul gives np.matmul's result (into out= too) at 1 and 2 threads, whether
    the product is small enough for one BLAS thread or not, and leaves BLAS's thread count
    as it was."""
    from threadpoolctl import threadpool_info
    rng = np.random.default_rng(m)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    before = [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]
    out = np.empty((m, n), np.float32)
    np.testing.assert_allclose(kernels.matmul(a, b), a @ b, rtol=1e-5, atol=1e-4)
    assert kernels.matmul(a.T.copy().T, b, out=out) is out
    np.testing.assert_allclose(out, a @ b, rtol=1e-5, atol=1e-4)
    assert [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"] == before


@pytest.mark.parametrize("parallel_min", ["default", 0], ids=["small-serial", "all-parallel"])
@pytest.mark.parametrize("shape", [(2, 3, 8, 8), (64, 16, 32, 32)], ids=str)
def test_relu_and_maxpool_at_two_threads_whatever_the_size(shape, parallel_min, limits):
    """At 2 threads ReLU and max-pooling run their serial loops below the planner's
    parallel_min elements (a second thread's wake-up costs more than it saves there) and
    the parallel ones from it; either way, and with every size sent to the parallel loops,
    they give the NumPy backend's results, through the layers and the pooling kernels."""
    if parallel_min != "default":
        limits(parallel_min=parallel_min)
    rng = np.random.default_rng(7)
    x = rng.standard_normal(shape).astype(np.float32)
    dy = rng.standard_normal(shape).astype(np.float32)
    before = kernels.get_num_threads()

    def run():
        kernels.set_num_threads(2)
        relu = ReLU()
        relu.build(shape[1:], rng=rng, dtype=np.float32)
        out = [relu.forward(x, training=True), relu.backward(dy)]
        for pool, stride, pad in (((2, 2), (2, 2), (0, 0)), ((3, 3), (2, 2), (1, 1))):
            y, cache = P.maxpool2d_forward(x, pool, stride, pad)
            out += [y, P.maxpool2d_backward(np.ones_like(y), cache)]
        return out

    try:
        for r, g in zip(*both(run)):
            np.testing.assert_array_equal(g, r)
    finally:
        kernels.set_num_threads(before)
