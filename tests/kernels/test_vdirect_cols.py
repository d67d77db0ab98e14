"""The register-tiled direct convolution over column-shifted copies of the input
(kernels/_vdirect_cols.py, ``plan.vector_cols``): the copies themselves, float32 y, dx, dw
and db against the float64 loop reference, the same bits as the flat tiles where the
sums run in the same order; and the backward of resnet20's 64->64 8x8 Winograd layers on
them (``plan.vector_backward``) at 1 and 2 threads."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from test_conv_kernels import ref_conv

pytest.importorskip("numba")
from distnn.kernels import _vdirect_cols as vc  # noqa: E402
from distnn.kernels import conv as K  # noqa: E402
from distnn.kernels import planner as plan  # noqa: E402

pytestmark = pytest.mark.skipif(
    plan.TARGET.kind != "avx512",
    reason="needs an AVX-512 CPU (on AVX2 plan.use_vector and plan.vector_backward never "
           "pick the register-tiled kernels, tests/kernels/test_plan.py)")


# tests/kernels/conftest.py skips the NumPy backend for this module
COMPILED_ONLY = "the register-tiled kernels are compiled only"


@pytest.fixture
def anywhere(limits):
    """use_vector for every shape it can take (not only where it was measured faster)."""
    limits(vector_max_cf=1 << 30, vector_max_cf2=1 << 30, vector_min_area=1,
           vector_cols_max_cf=1 << 30)


def _rel(got, want):
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))


def _run(x, w, b, pads, dil, dy):
    y, cache = K.conv2d_forward(x, w, b, (1, 1), pads, dil)
    assert cache.vector
    return (y,) + K.conv2d_backward(dy, cache, w)


def _case(x_shape, w_shape, pads, dil, seed):
    """float32 arguments for ``_run`` and the float64 loops' y, dx, dw, db."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(x_shape)
    w = rng.standard_normal(w_shape) / np.sqrt(np.prod(w_shape[1:]))
    b = rng.standard_normal(w_shape[0])
    y_ref = ref_conv(x, w, b, (1, 1), pads, dil)
    dy = rng.standard_normal(y_ref.shape)
    refs = (y_ref,) + tuple(ref_conv(x, w, b, (1, 1), pads, dil, dy)[1:])
    args = (*(a.astype(np.float32) for a in (x, w, b)), pads, dil, dy.astype(np.float32))
    return args, refs


# copies as wide as x (one shifted run a copy) and not (row by row), paddings of either sign
@pytest.mark.parametrize("pt,pl,kw,dw,hp,ow", [(1, 1, 3, 1, 10, 8), (-1, -1, 2, 1, 6, 8),
                                               (3, 2, 3, 2, 12, 8), (0, 0, 3, 1, 6, 6),
                                               (-2, 3, 2, 2, 5, 4), (2, -1, 1, 1, 3, 9)])
def test_copies_are_the_shifted_padded_planes(pt, pl, kw, dw, hp, ow):
    rng = np.random.default_rng(hp * ow)
    x = rng.standard_normal((3, 2, 7, 8)).astype(np.float32)
    n0, n1 = 1, 3
    out = np.full((n1 - n0) * 2 * kw * hp * ow, np.nan, np.float32)
    vc.pad_cols(x, n0, n1, pt, pl, kw, dw, hp, ow, out)
    # the padded plane, rows -pt.. and columns -pl.. of x, zeros outside
    big = np.zeros((3, 2, 7 + 2 * 8, 8 + 2 * 8), np.float32)
    big[:, :, 8:15, 8:16] = x
    want = np.stack([big[n0:n1, :, 8 - pt:8 - pt + hp, 8 - pl + j * dw:8 - pl + j * dw + ow]
                     for j in range(kw)], axis=2)
    np.testing.assert_array_equal(out.reshape(want.shape), want)


@st.composite
def cols_cases(draw):
    """Planes the copies take (``plan.vector_cols``): 'same' padding split at random
    between the sides, any kernel and dilation, so that OH*OW = H*W, a multiple of 32."""
    k = draw(st.sampled_from([(3, 3), (1, 3), (5, 5), (2, 2), (3, 1)]))
    dil = draw(st.sampled_from([(1, 1), (2, 1), (1, 2)]))
    h, w = draw(st.sampled_from([(8, 8), (4, 8), (12, 8), (8, 4), (16, 4), (8, 12), (32, 1)]))
    th, tw = dil[0] * (k[0] - 1), dil[1] * (k[1] - 1)
    pt, pl = draw(st.integers(0, th)), draw(st.integers(0, tw))
    n, c = draw(st.integers(1, 3)), 8 * draw(st.integers(1, 3))
    f = draw(st.sampled_from([8, 16, 24, 32, 48, 64]))
    return (n, c, h, w), (f, c) + k, (pt, th - pt, pl, tw - pl), dil, draw(st.integers(0, 2**16))


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # patched once
@given(case=cols_cases())
def test_copies_match_float64_loops_and_the_flat_tiles(anywhere, case):
    """The float64 loops' results; the flat tiles' bits too where the sums run in the same
    order: y and dx but for 3x3 kernels (channels outer there), dw and db with the filters
    in the vector lanes (F a multiple of 16, rows of 3 taps; the other dw sums lanes of
    positions, which the copies place differently)."""
    args, refs = _case(*case)
    g = K.conv_geometry(args[0].shape, args[1].shape[2:], (1, 1), args[3], args[4])
    assert plan.vector_cols(g)
    got = _run(*args)
    for name, r, want in zip(("y", "dx", "dw", "db"), got, refs):
        assert r.dtype == np.float32
        assert _rel(r, want) < 2e-6, name
    with plan.using(vector_cols=False):
        flat = _run(*args)
    same = {"y": args[1].shape[2:] != (3, 3), "dw": args[1].shape[0] % 16 == 0
            and args[1].shape[3] == 3}
    same["dx"], same["db"] = same["y"], same["dw"]
    for name, r, o in zip(("y", "dx", "dw", "db"), got, flat):
        if same[name]:
            np.testing.assert_array_equal(r, o, err_msg=name)
        else:
            assert _rel(r, o) < 2e-6, name


def test_padding_past_the_kernel(anywhere):
    """1x3 kernels with 2 rows of padding above and below: dy's copies for dx start 2 rows
    inside dy (a negative padding for the full correlation)."""
    args, refs = _case((2, 8, 4, 8), (16, 8, 1, 3), (2, 2, 1, 1), (1, 1), 5)
    got = _run(*args)
    assert got[0].shape[2:] == (8, 8)
    for name, r, want in zip(("y", "dx", "dw", "db"), got, refs):
        assert _rel(r, want) < 2e-6, name


def test_resnet20s_64_to_64_8x8_at_both_threads(threads):
    """Where the planner sends resnet20's third stage: Winograd's forward, the copies'
    backward from its x, the float64 reference's results in float32 (with and without dx
    and db) and Winograd's own backward's to its rounding; float64 and an explicit
    method keep Winograd's backward."""
    (x, w, b, pads, dil, dy), refs = _case((5, 64, 8, 8), (64, 64, 3, 3), (1, 1, 1, 1),
                                           (1, 1), 11)
    with plan.using(onednn_backward=False):  # at 1 thread the planner's is oneDNN's
        y, cache = K.conv2d_forward(x, w, b, (1, 1), pads)
    assert cache.winograd and cache.vector_backward
    got = (y,) + K.conv2d_backward(dy, cache, w)
    for name, r, want in zip(("y", "dx", "dw", "db"), got, refs):
        assert r.dtype == np.float32
        assert _rel(r, want) < (1e-5 if name == "y" else 2e-6), name
    dx, dw, db = K.conv2d_backward(dy, cache, w, need_dx=False, need_db=False)
    assert dx is None and db is None
    np.testing.assert_array_equal(dw, got[2])
    with plan.using(vector_cols=False):
        y2, own = K.conv2d_forward(x, w, b, (1, 1), pads)
    assert own.winograd and not own.vector_backward
    for name, r, o in zip(("dx", "dw", "db"), got[1:], K.conv2d_backward(dy, own, w)):
        assert _rel(r, o) < 1e-5, name
    assert not K.conv2d_forward(x, w, b, (1, 1), pads, method="winograd4")[1].vector_backward
    assert not K.conv2d_forward(*(a.astype(np.float64) for a in (x, w, b)), (1, 1),
                                pads)[1].vector_backward
