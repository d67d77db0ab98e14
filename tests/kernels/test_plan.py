"""The planner (kernels/planner.py) as data: its decisions for each CPU kind, passed in rather
than read from the host, and the CPU kind numba compiles for; and the code of the other
kind run for real where the host can (the AVX2 code on an AVX-512 host, compiled for an
older CPU through numba's NUMBA_CPU_NAME / NUMBA_CPU_FEATURES)."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import avx2_on_host

from distnn.kernels import planner as plan
from distnn.kernels.im2col import conv_geometry

AVX512, AVX2, GENERIC = plan.CPU("avx512"), plan.CPU("avx2"), plan.CPU("generic")
ROOT = Path(__file__).resolve().parents[2]


def geo(n, c, h, k=3, stride=1, pad=1):
    return conv_geometry((n, c, h, h), (k, k), (stride, stride), (pad,) * 4)


# (geometry, filters, dtype) -> the method on AVX-512 | AVX2 | neither, at 1 thread:
# resnet20's, vgg11bn's and the small CNNs' layers, batch 64
CASES = [
    ("resnet20 3->16 32x32", geo(64, 3, 32), 16, np.float32, "direct", "direct", "direct"),
    ("resnet20 16->16 32x32", geo(64, 16, 32), 16, np.float32,
     "vector", ("winograd", 4, True), ("winograd", 4, False)),
    ("resnet20 16->32 s2", geo(64, 16, 32, stride=2), 32, np.float32,
     "vector", "im2col", "im2col"),
    ("resnet20 16->32 1x1 s2", geo(64, 16, 32, k=1, stride=2, pad=0), 32, np.float32,
     "pointwise", "pointwise", "pointwise"),
    ("resnet20 32->32 16x16", geo(64, 32, 16), 32, np.float32,
     "vector", ("winograd", 4, True), ("winograd", 4, False)),
    ("resnet20 64->64 8x8", geo(64, 64, 8), 64, np.float32,
     ("winograd", 4, True), ("winograd", 4, True), ("winograd", 4, False)),
    ("resnet20 64->64 8x8 float64", geo(64, 64, 8), 64, np.float64,
     ("winograd", 4, False), ("winograd", 4, False), ("winograd", 4, False)),
    ("vgg11bn 64->128 16x16", geo(64, 64, 16), 128, np.float32,
     ("winograd", 4, False), ("winograd", 4, False), ("winograd", 4, False)),
    ("vgg11bn 512->512 2x2", geo(64, 512, 2), 512, np.float32,
     ("winograd", 2, False), ("winograd", 2, False), ("winograd", 2, False)),
    # F(2x2) (small planes, few channels; no zoo layer) has no compiled drivers
    ("16->16 14x14", geo(64, 16, 14), 16, np.float32,
     ("winograd", 2, False), ("winograd", 2, False), ("winograd", 2, False)),
    ("lenet 1->6 5x5", geo(64, 1, 28, k=5, pad=2), 6, np.float32, "direct", "direct", "direct"),
    ("6->16 5x5 14x14", geo(64, 6, 14, k=5, pad=0), 16, np.float32,
     "im2col", "im2col", "im2col"),
]


def _expect(want):
    return plan.ConvPlan(want) if isinstance(want, str) else plan.ConvPlan(*want)


@pytest.mark.parametrize("name,g,f,dtype,on512,on2,generic", CASES, ids=[c[0] for c in CASES])
def test_conv_plans_for_every_cpu_kind(name, g, f, dtype, on512, on2, generic):
    for cpu, want in ((AVX512, on512), (AVX2, on2), (GENERIC, generic)):
        assert plan.plan_conv(g, f, dtype, cpu=cpu) == _expect(want), cpu



# (output rows, output width) -> whether the vector kernels tile whole rows: resnet20's
# 32x32 and 16x16 planes (forward and dx), wider multiples of 32; not odd counts of 16-wide
# rows, nor widths that are not whole vectors
ROW_CASES = [((32, 32), True), ((16, 16), True), ((5, 64), True), ((15, 16), False),
             ((8, 8), False), ((30, 30), False), ((16, 48), False), ((1, 32), True)]


@pytest.mark.parametrize("shape,want", ROW_CASES, ids=[f"{h}x{w}" for (h, w), _ in ROW_CASES])
def test_vector_kernels_tile_whole_rows_where_they_fit(shape, want):
    assert plan.vector_rows(*shape) is want
    # only the register-tiled kernels ask, which only AVX-512 runs (float32)
    assert plan.vector_rows(*shape, limits=replace(plan.LIMITS, vector_rows=False)) is False


def test_dw_by_shifted_dy_at_stride_1_only():
    """A row's 3 taps are one shift apart in the input at stride 1 (dilated or not); at
    stride 2 they lie in different phases of it."""
    assert plan.dw_shift(geo(64, 16, 32))
    assert plan.dw_shift(conv_geometry((2, 8, 9, 9), (3, 3), (1, 1), (1,) * 4, (2, 2)))
    assert not plan.dw_shift(geo(64, 16, 32, stride=2))
    assert not plan.dw_shift(geo(64, 16, 32), limits=replace(plan.LIMITS, dw_shift=False))


# (C, H, F) 3x3 'same', batch 64 -> whether a Winograd layer's backward runs on the
# register-tiled kernels over column copies (``plan.vector_backward``) on AVX-512: narrow
# planes of whole tiles, up to vector_cols_max_cf filter pairs; 16x16 planes are the row
# tiles' (forward and backward)
COLS_CASES = [((64, 8, 64), True), ((32, 8, 32), True), ((16, 8, 16), True),
              ((64, 8, 128), False), ((128, 8, 128), False), ((64, 7, 64), False),
              ((32, 16, 32), False), ((64, 4, 64), False)]


@pytest.mark.parametrize("shape,want", COLS_CASES,
                         ids=[f"{c}->{f} {h}x{h}" for (c, h, f), _ in COLS_CASES])
def test_winograds_backward_over_column_copies_on_avx512_only(shape, want):
    c, h, f = shape
    g = geo(64, c, h)
    assert plan.vector_backward(g, f, np.float32, cpu=AVX512) is want
    assert not plan.vector_backward(g, f, np.float32, cpu=AVX2)
    assert not plan.vector_backward(g, f, np.float64, cpu=AVX512)
    off = replace(plan.LIMITS, vector_cols=False)
    assert not plan.vector_backward(g, f, np.float32, cpu=AVX512, limits=off)
    assert not plan.vector_backward(g, f, np.float32, cpu=AVX512,
                                    limits=replace(plan.LIMITS, register_tiles=False))
    if want:  # the forward stays Winograd's
        assert plan.plan_conv(g, f, np.float32, cpu=AVX512).method == "winograd"


# (layer, geometry, filters) -> whether its backward runs on oneDNN's primitives
# (``plan.onednn_backward``) on AVX-512, float32, 1 thread: resnet20's 32- and 64-channel
# 3x3 layers; not its 16-channel ones (a tie), not vgg11bn's wider ones, not 1x1 kernels
ONEDNN_CASES = [
    ("resnet20 3->16 32x32", geo(64, 3, 32), 16, False),
    ("resnet20 16->16 32x32", geo(64, 16, 32), 16, False),
    ("resnet20 16->32 s2", geo(64, 16, 32, stride=2), 32, False),
    ("resnet20 32->32 16x16", geo(64, 32, 16), 32, True),
    ("resnet20 32->64 s2", geo(64, 32, 16, stride=2), 64, True),
    ("resnet20 32->64 1x1 s2", geo(64, 32, 16, k=1, stride=2, pad=0), 64, False),
    ("resnet20 64->64 8x8", geo(64, 64, 8), 64, True),
    ("resnet20 64->64 8x8 batch 32", geo(32, 64, 8), 64, True),
    ("vgg11bn 64->128 16x16", geo(64, 64, 16), 128, False),
    ("vgg11bn 512->512 2x2", geo(64, 512, 2), 512, False),
]


@pytest.mark.parametrize("name,g,f,want", ONEDNN_CASES, ids=[c[0] for c in ONEDNN_CASES])
def test_onednns_backward_on_avx512_at_one_thread_only(name, g, f, want):
    assert plan.onednn_backward(g, f, np.float32, 1, cpu=AVX512) is want
    for cpu in (AVX2, GENERIC):  # the other kinds' plans do not change
        assert not plan.onednn_backward(g, f, np.float32, 1, cpu=cpu)
    assert not plan.onednn_backward(g, f, np.float64, 1, cpu=AVX512)
    assert not plan.onednn_backward(g, f, np.float32, 2, cpu=AVX512)
    off = replace(plan.LIMITS, onednn_backward=False)
    assert not plan.onednn_backward(g, f, np.float32, 1, cpu=AVX512, limits=off)
    if want:  # the forward stays the compiled path's
        assert plan.plan_conv(g, f, np.float32, cpu=AVX512).method in ("vector", "winograd")


def test_the_tiles_switch_sends_every_kind_to_blas_and_the_loops():
    off = replace(plan.LIMITS, register_tiles=False)
    for cpu in (AVX512, AVX2):
        assert plan.plan_conv(geo(64, 16, 32), 16, np.float32, cpu=cpu, limits=off) == \
            plan.ConvPlan("winograd", 4, False)
        assert not plan.tile_products(cpu, off) and not plan.tiles_on(cpu, off)


def test_products_on_the_tiles_on_avx512_only():
    assert plan.tile_products(AVX512) and not plan.tile_products(AVX2)
    assert not plan.tile_products(GENERIC)
    forced = replace(plan.LIMITS, tile_products=True)
    assert plan.tile_products(AVX2, forced) and not plan.tile_products(GENERIC, forced)


def test_two_threads_keep_the_drivers_for_whole_blocks_only():
    """At 2 threads vgg11bn's 512-filter layers split every kernel (the Python loop); the
    small layers take whole blocks a thread, in the drivers."""
    small = plan.plan_conv(geo(64, 16, 32), 16, np.float32, threads=2, cpu=AVX2)
    assert small == plan.ConvPlan("winograd", 4, True)
    assert plan.winograd_blocks(64, 512, 512, 1, 1, 4, 36, 2)[2] == 1
    assert not plan.winograd_drivers(np.float32, 64, 64, 1, 2, cpu=AVX2)
    assert plan.winograd_drivers(np.float32, 64, 64, 2, 2, cpu=AVX2)


def test_forward_blocks_in_whole_tiles_of_columns_for_every_cpu_kind():
    """A Winograd forward on the register tiles (the drivers, one thread) with a big U
    that still fits block_bytes takes the fewest samples that fill whole tiles of columns
    (32 on AVX-512, 24 on AVX2); backward, and every other layer, keep their blocks."""
    assert plan.forward_cols(np.float32, 64, 64, 1, cpu=AVX512) == 32
    assert plan.forward_cols(np.float32, 64, 64, 1, cpu=AVX2) == 24
    assert plan.forward_cols(np.float32, 64, 64, 1, cpu=GENERIC) == 0
    assert plan.forward_cols(np.float64, 64, 64, 1, cpu=AVX512) == 0    # no drivers
    assert plan.forward_cols(np.float32, 64, 128, 1, cpu=AVX512) == 0   # BLAS's loop
    assert plan.forward_cols(np.float32, 64, 64, 2, cpu=AVX512) == 0    # one thread only
    # resnet20's 64->64 8x8 on F(4x4): 2x2 tiles a sample
    for cols, k in ((32, 8), (24, 6)):
        got, blocks, workers = plan.winograd_blocks(64, 64, 64, 2, 2, 4, 36, 1, cols=cols)
        assert (got, workers, len(blocks)) == (k, 1, -(-64 // k)) and blocks[-1][1] == 64
    assert plan.winograd_blocks(64, 64, 64, 2, 2, 4, 36, 1)[0] == 64    # backward
    assert plan.winograd_blocks(63, 64, 64, 2, 2, 4, 36, 1, cols=32)[1][-1] == (56, 63)
    # small U (16->16 32x32 F(4x4)) and U past block_bytes (64->128) keep theirs
    for args in ((64, 16, 16, 8, 8, 4, 36), (64, 64, 128, 2, 2, 4, 36)):
        assert (plan.winograd_blocks(*args, 1, cols=32)
                == plan.winograd_blocks(*args, 1)), args


def test_tile_shapes_per_kind():
    t512, t2 = plan.TILES["avx512"], plan.TILES["avx2"]
    assert (t512.width, t512.rows, t512.cols) == (16, 8, 32)
    assert (t2.width, t2.rows, t2.cols) == (8, 4, 24)
    # accumulators fit the register files (32 and 16 vector registers), with room to load
    assert t512.rows * t512.vectors <= 32 - t512.vectors - 1
    assert t2.rows * t2.vectors <= 16 - t2.vectors - 1


@pytest.mark.parametrize("name,features,host,want", [
    (None, None, {"avx512f": True, "avx2": True, "fma": True}, "avx512"),
    (None, None, {"avx2": True, "fma": True}, "avx2"),
    (None, None, {"avx2": True, "fma": False}, "generic"),
    ("haswell", "", {"avx512f": True}, "avx2"),
    ("skylake-avx512", "", {"avx2": True, "fma": True}, "avx512"),
    ("generic", "", {"avx512f": True}, "generic"),
    ("haswell", None, {"avx512f": True}, "avx512"),  # numba keeps the host's features then
    ("haswell", "+avx2,+fma,-avx512f", {"avx512f": True}, "avx2"),
    (None, "+avx512f,+avx2,+fma", {}, "avx512"),
])
def test_target_cpu_follows_numbas_switches(name, features, host, want):
    assert plan.target_cpu(name, features, host) == plan.CPU(want)


def test_bad_limits_and_kinds_are_named():
    with pytest.raises(ValueError, match="CPU kind must be one of"):
        plan.CPU("sse2")
    with pytest.raises(ValueError, match="Limits.winograd_min_channels must be a non-negative"):
        plan.Limits(winograd_min_channels=-1)
    with pytest.raises(ValueError, match="Limits.register_tiles must be a bool"):
        plan.Limits(register_tiles=1)
    with pytest.raises(ValueError, match="DISTNN_PIECES must be an integer, got 'many'"):
        plan._from_env({"DISTNN_PIECES": "many"})
    env = plan._from_env({"DISTNN_REGISTER_TILES": "0", "DISTNN_SPIN_YIELDS": "0"})
    assert not env.register_tiles and env.spin_yields == 0 and env.pieces_per_thread == 4


def test_using_restores_the_limits():
    before = plan.LIMITS
    with plan.using(winograd_min_channels=1) as changed:
        assert plan.LIMITS is changed and changed.winograd_min_channels == 1
    assert plan.LIMITS is before


def test_host_plan_is_what_the_kernels_run(kernel_backend):
    """On this host the compiled conv takes the planner's method (its cache says which)."""
    if kernel_backend != "numba":
        pytest.skip("the NumPy reference path has no planner")
    from distnn.kernels import conv as K
    from distnn.kernels import get_num_threads
    rng = np.random.default_rng(0)
    for c, f, h, stride in ((16, 16, 32, 1), (64, 64, 8, 1), (3, 16, 32, 1), (16, 32, 32, 2)):
        x = rng.standard_normal((4, c, h, h)).astype(np.float32)
        w = rng.standard_normal((f, c, 3, 3)).astype(np.float32)
        g = conv_geometry(x.shape, (3, 3), (stride, stride), (1, 1, 1, 1))
        want = plan.plan_conv(g, f, np.float32, threads=get_num_threads())
        cache = K.conv2d_forward(x, w, None, (stride, stride), (1, 1, 1, 1))[1]
        got = ("winograd" if cache.winograd else "vector" if cache.vector else
               "direct" if cache.direct else "pointwise" if cache.pointwise else "im2col")
        assert got == want.method and (not cache.winograd or cache.tile == want.tile)


@pytest.mark.timeout(900)
def test_the_avx2_code_runs_on_this_host(kernel_backend):
    """The AVX2 tiles and drivers, compiled for an older CPU (NUMBA_CPU_NAME=haswell), run
    the register-tile and driver tests on an AVX-512 host. On an AVX2 host the suite runs
    that code itself; the AVX-512 code cannot run there."""
    if kernel_backend != "numba":
        pytest.skip("runs once, with the compiled backend (its subprocess runs both)")
    if plan.target_cpu(None, None) != AVX512:
        pytest.skip("needs an AVX-512 host (an AVX2 host runs the AVX2 code in the suite "
                    "itself; the AVX-512 code needs AVX-512)")
    result = avx2_on_host.result()  # started by the controller under pytest -n N
    assert result["probe"] == ["avx2", "8", "False"], result["probe_err"]
    tail = result["tail"]
    assert result["rc"] == 0, tail
    assert " passed" in tail and " failed" not in tail, tail
