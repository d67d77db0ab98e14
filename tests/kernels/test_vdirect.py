"""The register-tiled direct convolution (kernels/_vdirect.py, chosen by
``plan.use_vector``): float32 against the float64 loop reference for y, dx, dw and db
(the reference is the one the layers' gradient checks hold against), padding, dilation,
kernel sizes, stride 2 (by input phases), odd batches and positions past a tile, 1 and 2
threads; and the choice."""
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from test_conv_kernels import ref_conv

pytest.importorskip("numba")
from distnn import kernels  # noqa: E402
from distnn.kernels import conv as K  # noqa: E402
from distnn.kernels import planner as plan  # noqa: E402

pytestmark = pytest.mark.skipif(
    plan.TARGET.kind != "avx512",
    reason="needs an AVX-512 CPU (built for AVX-512 only; on AVX2 plan.use_vector never picks "
           "them, tests/kernels/test_plan.py)")


# tests/kernels/conftest.py skips the NumPy backend for this module
COMPILED_ONLY = "the register-tiled kernels are compiled only"


@pytest.fixture
def anywhere(limits):
    """use_vector for every shape it can take (not only where it was measured faster)."""
    limits(vector_max_cf=1 << 30, vector_max_cf2=1 << 30, vector_min_area=1)


def _rel(got, want):
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))


def run(x, w, b, stride, pads, dil, dy, need_dx=True):
    y, cache = K.conv2d_forward(x, w, b, stride, pads, dil)
    assert cache.direct and not cache.winograd  # the direct kernels took it
    dx, dw, db = K.conv2d_backward(dy, cache, w, need_dx=need_dx)
    return y, dx, dw, db


@st.composite
def cases(draw):
    k = draw(st.sampled_from([(3, 3), (1, 3), (5, 5), (2, 2)]))
    dil = draw(st.sampled_from([(1, 1), (2, 1)]))
    pads = tuple(draw(st.integers(0, 2)) for _ in range(4))
    n = draw(st.integers(1, 5))
    c, f = 8 * draw(st.integers(1, 3)), 8 * draw(st.integers(1, 3))
    need_h = dil[0] * (k[0] - 1) + 1 - pads[0] - pads[1]
    need_w = dil[1] * (k[1] - 1) + 1 - pads[2] - pads[3]
    h = draw(st.integers(max(1, need_h), 13))
    w = draw(st.integers(max(1, need_w), 13))
    return (n, c, h, w), (f, c) + k, pads, dil, draw(st.integers(0, 2**16))


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # patched once
@given(case=cases())
def test_matches_float64_loops(anywhere, case):
    args, refs = _float32_args_and_float64_refs(case)
    got = run(*args)
    for name, g, r in zip(("y", "dx", "dw", "db"), got, refs):
        assert g.dtype == np.float32
        assert _rel(g, r) < 2e-6, name


def _float32_args_and_float64_refs(case):
    """A stride-1 case's float32 arguments for ``run`` and the float64 loops' y, dx, dw, db."""
    x_shape, w_shape, pads, dil, seed = case
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(x_shape)
    w = rng.standard_normal(w_shape) / np.sqrt(np.prod(w_shape[1:]))
    b = rng.standard_normal(w_shape[0])
    y_ref = ref_conv(x, w, b, (1, 1), pads, dil)
    dy = rng.standard_normal(y_ref.shape)
    refs = (y_ref,) + tuple(ref_conv(x, w, b, (1, 1), pads, dil, dy)[1:])
    args = (*(a.astype(np.float32) for a in (x, w, b)), (1, 1), pads, dil,
            dy.astype(np.float32))
    return args, refs


@st.composite
def strided_cases(draw):
    k = draw(st.sampled_from([(3, 3), (2, 2), (5, 5), (4, 3)]))
    pads = tuple(draw(st.integers(0, 2)) for _ in range(4))
    n = draw(st.integers(1, 4))
    c, f = 8 * draw(st.integers(1, 2)), 8 * draw(st.integers(1, 3))
    h = draw(st.integers(max(1, k[0] - pads[0] - pads[1]), 14))
    w = draw(st.integers(max(1, k[1] - pads[2] - pads[3]), 14))
    return (n, c, h, w), (f, c) + k, pads, draw(st.integers(0, 2**16))


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # patched once
@given(case=strided_cases())
def test_stride_2_by_phases_matches_float64_loops(anywhere, case):
    x_shape, w_shape, pads, seed = case
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(x_shape)
    w = rng.standard_normal(w_shape) / np.sqrt(np.prod(w_shape[1:]))
    b = rng.standard_normal(w_shape[0])
    y_ref = ref_conv(x, w, b, (2, 2), pads, (1, 1))
    dy = rng.standard_normal(y_ref.shape)
    refs = (y_ref,) + tuple(ref_conv(x, w, b, (2, 2), pads, (1, 1), dy)[1:])
    got = run(*(a.astype(np.float32) for a in (x, w, b)), (2, 2), pads, (1, 1),
              dy.astype(np.float32))
    for name, g, r in zip(("y", "dx", "dw", "db"), got, refs):
        assert _rel(g, r) < 2e-6, name


@pytest.mark.parametrize("n,c,f,h", [(7, 16, 16, 32), (3, 32, 32, 16), (64, 16, 16, 32),
                                     (5, 8, 24, 11)])
def test_threads_give_the_same_results(anywhere, threads, n, c, f, h):
    rng = np.random.default_rng(n + h)
    x = rng.standard_normal((n, c, h, h)).astype(np.float32)
    w = (rng.standard_normal((f, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32)
    dy = rng.standard_normal((n, f, h, h)).astype(np.float32)
    got = run(x, w, None, (1, 1), (1, 1, 1, 1), (1, 1), dy)
    y_ref = ref_conv(x.astype(np.float64), w.astype(np.float64), None, (1, 1), (1, 1, 1, 1),
                     (1, 1))
    _, dx_ref, dw_ref, _ = ref_conv(x.astype(np.float64), w.astype(np.float64), None, (1, 1),
                                    (1, 1, 1, 1), (1, 1), dy.astype(np.float64))
    for g, r in zip(got[:3], (y_ref, dx_ref, dw_ref)):
        assert _rel(g, r) < 2e-6
    again = run(x, w, None, (1, 1), (1, 1, 1, 1), (1, 1), dy)
    for g, a in zip(got[:3], again[:3]):  # the same thread count sums in the same order
        np.testing.assert_array_equal(g, a)


def _check_dw_in_the_lanes(monkeypatch, x, w, b, stride, pads, dil, dy):
    """The float32 run's dx, dw and db against the float64 loops', and its dw and db against
    the other dw kernel's (``lanes_apply`` off) to float32 rounding."""
    from distnn.kernels import _vdirect
    refs = ref_conv(x, w, b, stride, pads, dil, dy)[1:]
    args = [a.astype(np.float32) for a in (x, w, b)] + [stride, pads, dil,
                                                        dy.astype(np.float32)]
    got = run(*args)
    for name, g, r in zip(("dx", "dw", "db"), got[1:], refs):
        assert _rel(g, r) < 2e-6, name
    monkeypatch.setattr(_vdirect, "lanes_apply", lambda f, kw: False)
    other = run(*args)
    for g, o in zip(got[2:], other[2:]):
        assert _rel(g, o) < 1e-6


@pytest.mark.parametrize("f", [16, 32, 48, 64])
@pytest.mark.parametrize("k,stride,dil", [((3, 3), (1, 1), (1, 1)), ((3, 3), (2, 2), (1, 1)),
                                          ((1, 3), (1, 1), (1, 2)), ((3, 3), (1, 1), (2, 1))])
def test_dw_with_filters_in_the_lanes(anywhere, monkeypatch, f, k, stride, dil):
    """Filters a multiple of 16 and kernel rows of 3 taps take ``weight_grad_t``: it gives
    the float64 loops' dw and db, and the other dw kernel's to float32 rounding."""
    from distnn.kernels import _vdirect
    assert _vdirect.lanes_apply(f, k[1])
    rng = np.random.default_rng(f)
    x = rng.standard_normal((3, 16, 13, 12))
    w = rng.standard_normal((f, 16) + k) / np.sqrt(16 * k[0] * k[1])
    b = rng.standard_normal(f)
    pads = (1, 0, 2, 1)
    y_ref = ref_conv(x, w, b, stride, pads, dil)
    dy = rng.standard_normal(y_ref.shape)
    _check_dw_in_the_lanes(monkeypatch, x, w, b, stride, pads, dil, dy)


@settings(max_examples=25, deadline=None)
@given(ars=st.integers(16, 40), crs=st.integers(16, 40), ao=st.integers(0, 7),
       co=st.integers(0, 7))
def test_transpose16_moves_every_element(ars, crs, ao, co):
    """``_transpose16``: c[co + j*crs + i] = a[ao + i*ars + j] for i, j < 16, nothing else
    written."""
    import numba as nb
    from distnn.kernels._vdirect import _transpose16

    @nb.njit
    def call(a, ao, ars, c, co, crs):
        _transpose16(a, ao, ars, c, co, crs)

    a = np.random.default_rng(ars * crs).standard_normal(ao + 16 * ars).astype(np.float32)
    c = np.full(co + 16 * crs, np.nan, np.float32)
    call(a, ao, ars, c, co, crs)
    want = np.full_like(c, np.nan)
    for i in range(16):
        for j in range(16):
            want[co + j * crs + i] = a[ao + i * ars + j]
    np.testing.assert_array_equal(c, want)


@pytest.mark.parametrize("f,width", [(16, 16), (16, 21), (32, 33), (48, 18)])
def test_dw_in_the_lanes_on_rows_of_16_and_more(anywhere, monkeypatch, f, width):
    """Output rows of 16 positions and more go through ``_transpose16`` (with a remainder
    when not a multiple of 16): the same dw and db as the float64 reference and as the
    other dw kernel."""
    rng = np.random.default_rng(width)
    x = rng.standard_normal((2, 8, 5, width))
    w = rng.standard_normal((f, 8, 3, 3)) / np.sqrt(72)
    b = rng.standard_normal(f)
    pads = (1, 1, 1, 1)
    dy = rng.standard_normal(ref_conv(x, w, b, (1, 1), pads, (1, 1)).shape)
    _check_dw_in_the_lanes(monkeypatch, x, w, b, (1, 1), pads, (1, 1), dy)


@settings(max_examples=40, deadline=None)
@given(c=st.integers(1, 3), h=st.integers(1, 40), w=st.integers(1, 70),
       pads=st.tuples(*[st.integers(0, 3)] * 4), n0=st.integers(0, 1))
def test_pad_phases_splits_the_padded_planes(c, h, w, pads, n0):
    """``pad_phases`` against NumPy: the padded planes' 4 phases (rows and columns of
    each parity), zeros outside x; rows wide enough for whole vectors (wph >= 16) too."""
    from distnn.kernels._vdirect import pad_phases
    pt, pb, pl, pr = pads
    x = np.random.default_rng(h * w).standard_normal((2, c, h, w)).astype(np.float32)
    hp, wp = h + pt + pb, w + pl + pr
    hph, wph = -(-hp // 2), -(-wp // 2)
    out = np.full((2 - n0) * c * 4 * hph * wph, np.nan, np.float32)
    pad_phases(x, n0, 2, pt, pl, hph, wph, out)
    padded = np.zeros((2 - n0, c, 2 * hph, 2 * wph), np.float32)
    padded[:, :, pt:pt + h, pl:pl + w] = x[n0:]
    want = np.stack([padded[:, :, a::2, b::2] for a in (0, 1) for b in (0, 1)], axis=2)
    np.testing.assert_array_equal(out.reshape(want.shape), want)


def test_no_dx_for_first_layers(anywhere):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 8, 9, 9)).astype(np.float32)
    w = rng.standard_normal((8, 8, 3, 3)).astype(np.float32)
    dy = rng.standard_normal((2, 8, 9, 9)).astype(np.float32)
    dx, dw, db = run(x, w, None, (1, 1), (1, 1, 1, 1), (1, 1), dy, need_dx=False)[1:]
    assert dx is None and dw.shape == w.shape and db.shape == (8,)


def test_choice_follows_the_measurements():
    def geo(c, h):
        return K.conv_geometry((64, c, h, h), (3, 3), padding=(1, 1, 1, 1))
    assert plan.use_vector(geo(16, 32), 16, np.float32)      # resnet20's first stage
    assert plan.use_vector(geo(32, 16), 32, np.float32)      # its second
    assert not plan.use_vector(geo(64, 8), 64, np.float32)   # Winograd F(4x4) is faster
    assert not plan.use_vector(geo(16, 32), 16, np.float64)  # float32 only
    assert not plan.use_vector(geo(12, 32), 16, np.float32)  # channels not a multiple of 8
    strided = K.conv_geometry((64, 16, 32, 32), (3, 3), stride=(2, 2), padding=(1, 1, 1, 1))
    assert plan.use_vector(strided, 32, np.float32)          # resnet20's downsampling convs
    deep = K.conv_geometry((64, 64, 8, 8), (3, 3), stride=(2, 2), padding=(1, 1, 1, 1))
    assert not plan.use_vector(deep, 128, np.float32)        # im2col is faster there
    pointwise = K.conv_geometry((64, 16, 32, 32), (1, 1), stride=(2, 2))
    assert not plan.use_vector(pointwise, 32, np.float32)    # 1x1: the strided-slice GEMM
    _, cache = K.conv2d_forward(np.zeros((2, 16, 32, 32), np.float32),
                                np.zeros((16, 16, 3, 3), np.float32), None, (1, 1),
                                (1, 1, 1, 1))
    assert cache.direct and not cache.winograd


@st.composite
def row_cases(draw):
    """Outputs whose rows the row tiles take (``plan.vector_rows``): 16 wide in an even
    number of rows, or a multiple of 32 wide; any kernel, padding and dilation."""
    k = draw(st.sampled_from([(3, 3), (1, 3), (5, 5), (2, 2)]))
    dil = draw(st.sampled_from([(1, 1), (2, 1)]))
    pads = tuple(draw(st.integers(0, 2)) for _ in range(4))
    ow = draw(st.sampled_from([16, 32, 64]))
    oh = 2 * draw(st.integers(1, 5)) if ow == 16 else draw(st.integers(1, 6))
    n = draw(st.integers(1, 3))
    c, f = 8 * draw(st.integers(1, 3)), 8 * draw(st.integers(1, 3))
    h = oh - pads[0] - pads[1] + dil[0] * (k[0] - 1)
    w = ow - pads[2] - pads[3] + dil[1] * (k[1] - 1)
    assume(h >= 1 and w >= 1)
    return (n, c, h, w), (f, c) + k, pads, dil, draw(st.integers(0, 2**16))


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # patched once
@given(case=row_cases())
def test_row_tiles_match_float64_loops_and_the_flat_tiles_bit_for_bit(anywhere, case):
    args, refs = _float32_args_and_float64_refs(case)
    assert plan.vector_rows(*refs[0].shape[2:])
    got = run(*args)
    for name, g, r in zip(("y", "dx", "dw", "db"), got, refs):
        assert _rel(g, r) < 2e-6, name
    with plan.using(vector_rows=False):  # the same sums in the same order
        flat = run(*args)
    for name, g, r in zip(("y", "dx", "dw", "db"), got, flat):
        np.testing.assert_array_equal(g, r, err_msg=name)


def test_row_tiles_on_resnets_shapes_at_both_threads(threads):
    """16->16 32x32, 32->32 16x16 and the stride-2 16->32 32x32 (16x16 outputs): the row
    tiles where the planner sends them, the float64 reference's results."""
    _resnet_shapes(np.float32)


def test_float64_on_resnets_shapes_takes_other_kernels():
    """float64 is not sent to the row tiles and gives the reference's results (at one
    thread: its kernels compile for each thread count, and this checks the routing)."""
    previous = kernels.get_num_threads()
    kernels.set_num_threads(1)
    try:
        _resnet_shapes(np.float64)
    finally:
        kernels.set_num_threads(previous)


def _resnet_shapes(dtype):
    rng = np.random.default_rng(7)
    for c, f, h, s in [(16, 16, 32, 1), (32, 32, 16, 1), (16, 32, 32, 2)]:
        x = rng.standard_normal((5, c, h, h))
        w = rng.standard_normal((f, c, 3, 3)) / np.sqrt(9 * c)
        b = rng.standard_normal(f)
        y_ref = ref_conv(x, w, b, (s, s), (1, 1, 1, 1), (1, 1))
        dy = rng.standard_normal(y_ref.shape)
        refs = (y_ref,) + tuple(ref_conv(x, w, b, (s, s), (1, 1, 1, 1), (1, 1), dy)[1:])
        y, cache = K.conv2d_forward(*(a.astype(dtype) for a in (x, w, b)), (s, s),
                                    (1, 1, 1, 1))
        assert cache.vector == (dtype == np.float32)
        got = (y,) + K.conv2d_backward(dy.astype(dtype), cache, w.astype(dtype))
        for name, g, r in zip(("y", "dx", "dw", "db"), got, refs):
            assert g.dtype == dtype
            assert _rel(g, r) < (2e-6 if dtype == np.float32 else 1e-12), name


@st.composite
def shift_cases(draw):
    """16 or 48 filters (one vector left over a multiple of 32), rows of 3 taps, stride 1."""
    kh = draw(st.sampled_from([1, 3]))
    dil = draw(st.sampled_from([(1, 1), (1, 2), (2, 3)]))
    pads = tuple(draw(st.integers(0, 2)) for _ in range(4))
    n, c, f = draw(st.integers(1, 3)), 8 * draw(st.integers(1, 3)), draw(st.sampled_from([16, 48]))
    h = draw(st.integers(max(1, dil[0] * (kh - 1) + 1 - pads[0] - pads[1]), 12))
    w = draw(st.integers(max(1, 2 * dil[1] + 1 - pads[2] - pads[3]), 40))
    return (n, c, h, w), (f, c, kh, 3), pads, dil, draw(st.integers(0, 2**16))


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # patched once
@given(case=shift_cases())
def test_dw_by_shifted_dy_matches_float64_loops_and_the_broadcasts_bit_for_bit(anywhere, case):
    """``plan.dw_shift``: dw of 16 filters summed by shifting dy (``_vdirect_dw``) gives
    the float64 loops' dw and the same bits as the tile that broadcasts every tap."""
    x_shape, w_shape, pads, dil, seed = case
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(x_shape)
    w = rng.standard_normal(w_shape) / np.sqrt(np.prod(w_shape[1:]))
    b = rng.standard_normal(w_shape[0])
    dy = rng.standard_normal(ref_conv(x, w, b, (1, 1), pads, dil).shape)
    refs = ref_conv(x, w, b, (1, 1), pads, dil, dy)[1:]
    args = (*(a.astype(np.float32) for a in (x, w, b)), (1, 1), pads, dil,
            dy.astype(np.float32))
    got = run(*args)
    for name, g, r in zip(("dx", "dw", "db"), got[1:], refs):
        assert _rel(g, r) < 2e-6, name
    with plan.using(dw_shift=False):
        other = run(*args)
    for name, g, o in zip(("dx", "dw", "db"), got[1:], other[1:]):
        np.testing.assert_array_equal(g, o, err_msg=name)
