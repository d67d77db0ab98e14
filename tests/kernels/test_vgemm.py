"""The register-tiled batched products (kernels/_vgemm.py) against float64 references:
odd column counts (vector and scalar tails), transposed and strided operands, accumulation,
and the convolutions that route their GEMMs through them."""
from __future__ import annotations

import numpy as np
import pytest

from distnn.kernels import _vgemm, planner as plan

pytestmark = pytest.mark.skipif(not plan.TARGET.tiles, reason="needs an AVX-512 or AVX2 CPU "
                                "(the tiles are built for those kinds only)")


def _rel(got, want):
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))


def _work(rng, p, rows, t, pad=16):
    """A (p, rows, t) view of a padded (p, rows * t + pad) array, as the Winograd driver's."""
    a2 = rng.standard_normal((p, rows * t + pad)).astype(np.float32)
    return a2[:, :rows * t].reshape(p, rows, t)


@pytest.mark.parametrize("p,r,k,t", [(1, 8, 1, 64), (16, 16, 16, 64), (36, 16, 16, 75),
                                     (3, 24, 7, 97), (2, 32, 33, 80), (4, 64, 64, 79),
                                     (1, 8, 144, 200), (5, 512, 40, 67)])
def test_matmul_matches_float64(p, r, k, t):
    rng = np.random.default_rng(p * 1000 + t)
    a = rng.standard_normal((p, r, k)).astype(np.float32)
    b = _work(rng, p, k, t)
    out = _work(rng, p, r, t)
    assert _vgemm.usable(a, b, out)
    _vgemm.matmul(a, b, out)
    want = np.matmul(a.astype(np.float64), b.astype(np.float64))
    assert _rel(out, want) < 1e-6 * np.sqrt(k)


@pytest.mark.parametrize("p,r,k,t", [(36, 16, 16, 64), (16, 32, 8, 65), (1, 144, 32, 70)])
def test_matmul_reads_a_transposed_view_in_place(p, r, k, t):
    rng = np.random.default_rng(7)
    u = rng.standard_normal((p, k, r)).astype(np.float32)  # its transpose is (p, r, k)
    b = _work(rng, p, k, t)
    out = np.empty((p, r, t), np.float32)
    assert _vgemm.usable(u.transpose(0, 2, 1), b, out)
    _vgemm.matmul(u.transpose(0, 2, 1), b, out)
    want = np.matmul(u.transpose(0, 2, 1).astype(np.float64), b.astype(np.float64))
    assert _rel(out, want) < 1e-6 * np.sqrt(k)


@pytest.mark.parametrize("p,i,j,t", [(36, 16, 16, 100), (16, 4, 8, 111), (3, 32, 12, 1000),
                                     (1, 8, 144, 257)])
def test_matmul_nt_sets_and_adds(p, i, j, t):
    rng = np.random.default_rng(t)
    a = _work(rng, p, i, t)
    b = _work(rng, p, j, t)
    out = np.full((p, i, j), 7.0, np.float32)
    assert _vgemm.usable(a, b, out, nt=True)
    want = np.matmul(a.astype(np.float64), b.astype(np.float64).transpose(0, 2, 1))
    _vgemm.matmul_nt(a, b, out)
    assert _rel(out, want) < 1e-6 * np.sqrt(t)
    _vgemm.matmul_nt(a, b, out, add=True)
    assert _rel(out, 2 * want) < 1e-6 * np.sqrt(t)


def test_usable_refuses_what_the_tiles_cannot_take():
    a = np.ones((2, 8, 4), np.float32)
    b = np.ones((2, 4, 64), np.float32)
    out = np.ones((2, 8, 64), np.float32)
    assert _vgemm.usable(a, b, out)
    assert not _vgemm.usable(a, b[:, :, :31], out[:, :, :31])  # too few columns: BLAS
    assert not _vgemm.usable(a.astype(np.float64), b.astype(np.float64), out.astype(np.float64))
    assert not _vgemm.usable(a[:, :6], b, out[:, :6])            # rows not a multiple of 8
    assert not _vgemm.usable(a, b[:, :, ::2], out[:, :, :32])    # columns not contiguous
    assert not _vgemm.usable(a[:, :, ::-1], b, out)              # negative strides
    assert not _vgemm.usable(out, b[:, :3], out[:, :8, :8], nt=True)  # 3 rows of b
    assert not _vgemm.usable(out[:, :, :20], b[:, :, :20], out[:, :, :8], nt=True)  # short


@pytest.mark.parametrize("drivers", [True, False], ids=["drivers", "python-loop"])
@pytest.mark.parametrize("shape,method", [((16, 16, 12), "winograd"), ((16, 16, 16), "winograd4"),
                                          ((32, 16, 9), "winograd"), ((16, 32, 10), None),
                                          ((12, 32, 10), None)])
def test_conv_on_the_tiles_equals_conv_on_blas(shape, method, drivers, kernel_backend,
                                               monkeypatch, limits):
    """A conv whose GEMMs run on the tiles gives BLAS's results to float32 rounding, forward
    and backward (the stride-2 case runs im2col's GEMMs on them), and they run where the
    planner says: inside Winograd's compiled block drivers where ``plan.winograd_drivers``
    takes an F(4x4) layer, else in the Python loop over blocks, on the tiles where
    ``plan.tile_products`` says (AVX-512), on BLAS otherwise. F(4x4)'s own error is 2-5e-6
    relative (winograd.py), so two summation orders may differ by twice that."""
    from distnn.kernels import _winograd4, planner as plan
    from distnn.kernels import conv as K
    if kernel_backend != "numba":
        pytest.skip("the NumPy reference path does not use the tiles")
    limits(block_drivers=drivers)
    c, f, h = shape
    rng = np.random.default_rng(c + f + h)
    x = rng.standard_normal((9, c, h, h)).astype(np.float32)  # 32+ columns a block
    w = (rng.standard_normal((f, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32)
    stride = (1, 1) if method else (2, 2)
    kw = {"method": method} if method else {}
    calls = []
    for name in ("matmul", "matmul_nt"):
        real = getattr(_vgemm, name)
        monkeypatch.setattr(_vgemm, name, lambda *a, _f=real, _n=name, **k: (
            calls.append((_n, plan.LIMITS.register_tiles)), _f(*a, **k))[1])
    for name in ("forward_blocks", "backward_blocks"):
        real = getattr(_winograd4, name)
        monkeypatch.setattr(_winograd4, name, lambda *a, _f=real, _n=name: (
            calls.append((_n, plan.LIMITS.register_tiles)), _f(*a))[1])
    outs = []
    for enabled in (True, False):
        with plan.using(register_tiles=enabled):
            y, cache = K.conv2d_forward(x, w, None, stride, (1, 1, 1, 1), **kw)
            dy = np.random.default_rng(1).standard_normal(y.shape).astype(np.float32)
            dx, dw, _ = K.conv2d_backward(dy, cache, w)
        outs.append((y, dx, dw))
    errors = [_rel(got, want) for got, want in zip(*outs)]
    assert max(errors) < (1e-5 if method == "winograd4" else 2e-6), errors
    # nothing on the tiles while they are off
    assert all(enabled for _, enabled in calls)
    g = K.conv_geometry(x.shape, (3, 3), stride, (1, 1, 1, 1))
    if not method:
        if plan.plan_conv(g, f, np.float32, threads=K.get_num_threads()).method == "vector":
            assert not calls  # the register-tiled direct kernels (AVX-512): their own tiles
        else:  # im2col's products stay on BLAS but for dw where the loops take the tiles
            assert {n for n, _ in calls} <= {"matmul_nt"}
            assert bool(calls) == plan.tile_products()
        return
    tile = 4 if method == "winograd4" else 2
    workers = plan.winograd_blocks(g.n, c, f, -(-g.oh // tile), -(-g.ow // tile), 4,
                                   (tile + 2) ** 2, K.get_num_threads())[2]
    names = {n for n, _ in calls}
    if tile == 4 and plan.winograd_drivers(np.float32, c, f, workers, K.get_num_threads()):
        assert drivers and names == {"forward_blocks", "backward_blocks"}
        return
    assert tile == 2 or not drivers  # F(2x2) has no drivers: the loop, switch on or off
    if plan.tile_products():
        assert "matmul" in names and not names & {"forward_blocks", "backward_blocks"}
    else:
        assert not calls


def test_environment_switch_turns_the_tiles_off():
    """DISTNN_REGISTER_TILES=0 (read at import) sends every product back to BLAS and every
    convolution back to Winograd / im2col."""
    import os
    import subprocess
    import sys
    code = ("from distnn.kernels import conv, planner as plan; import numpy as np; "
            "g = conv.conv_geometry((64, 16, 32, 32), (3, 3), padding=(1, 1, 1, 1)); "
            "print(plan.LIMITS.register_tiles, plan.use_vector(g, 16, np.float32))")
    for value, want in (("0", "False False"), ("1", f"True {_vgemm.AVX512}")):
        env = dict(os.environ, DISTNN_REGISTER_TILES=value)
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, check=True).stdout.split("\n")[-2]
        assert out == want
