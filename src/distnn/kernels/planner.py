"""The planner of the compiled kernels: which method computes a layer, from the layer's
geometry, its dtype, the threads and the CPU kind.

Every threshold and switch that decides between implementations, and every decision taken
from CPU features, is here, so a reader can review them in one file and a test can ask
what would run on another CPU (``plan_conv(g, f, dtype, cpu=CPU("avx2"))``) without
that CPU. The kernels read ``LIMITS`` when they are called; ``using(**changes)`` replaces
some of them for a block (tests and benchmarks compare methods that way).

The CPU the compiled code is built for is numba's target: the host's, or the one named by
numba's own switches ``NUMBA_CPU_NAME`` and ``NUMBA_CPU_FEATURES`` (``NUMBA_CPU_NAME=haswell
NUMBA_CPU_FEATURES=""`` runs the AVX2 code on an AVX-512 host; tests/kernels does that).
The measurements behind each value are in benchmarks/history/kernel-planner-measurements.md
(moved from the kernels' comments) and the per-layer rates in benchmarks/RESULTS.md.
"""
from __future__ import annotations

import contextlib
import importlib.util
import math
import os
import sys
from dataclasses import dataclass, fields, replace
from typing import Iterator, Mapping

import numpy as np

KINDS = ("avx512", "avx2", "generic")

# LLVM CPU names by the widest float vectors with FMA they have (for NUMBA_CPU_NAME given
# without NUMBA_CPU_FEATURES, where numba compiles with the name's own features)
_NAMED = {
    "avx512": ("skylake-avx512", "cascadelake", "cooperlake", "cannonlake", "icelake-client",
               "icelake-server", "tigerlake", "rocketlake", "sapphirerapids",
               "emeraldrapids", "graniterapids", "znver4", "znver5", "x86-64-v4"),
    "avx2": ("haswell", "broadwell", "skylake", "alderlake", "raptorlake", "meteorlake",
             "znver1", "znver2", "znver3", "bdver4", "x86-64-v3"),
}


@dataclass(frozen=True)
class CPU:
    """A CPU kind as the compiled kernels see it.

    Args:
        kind: "avx512" (16-float vectors, 32 registers), "avx2" (8-float vectors with FMA,
            16 registers) or "generic" (neither: no register tiles, BLAS for every GEMM).
    """
    kind: str

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"CPU kind must be one of {KINDS}, got {self.kind!r}")

    @property
    def tiles(self) -> bool:
        """Whether the register tiles (``_vgemm``) are built for this CPU."""
        return self.kind != "generic"


def cpu_from_features(features: Mapping[str, bool]) -> CPU:
    """The kind of a CPU with these LLVM features ({"avx512f": True, "avx2": True, ...})."""
    if features.get("avx512f"):
        return CPU("avx512")
    if features.get("avx2") and features.get("fma"):
        return CPU("avx2")
    return CPU("generic")


def parse_features(spec: str) -> dict[str, bool]:
    """LLVM's feature string ("+avx2,+fma,-avx512f") as a dict."""
    out = {}
    for item in spec.split(","):
        item = item.strip()
        if item[:1] in "+-" and len(item) > 1:
            out[item[1:]] = item[0] == "+"
    return out


def target_cpu(name: str | None = None, features: str | None = None,
               host: Mapping[str, bool] | None = None) -> CPU:
    """The CPU kind numba compiles for, the way numba decides it: ``features`` (numba's
    NUMBA_CPU_FEATURES) when given and not empty; else with a ``name`` (NUMBA_CPU_NAME)
    and empty features, that CPU's own features; else the host's (``host``, LLVM's
    host feature map, read when not given)."""
    if features:
        return cpu_from_features(parse_features(features))
    if name and name.lower() not in ("host", "") and features is not None:
        lowered = name.lower()
        for kind, names in _NAMED.items():
            if lowered in names:
                return CPU(kind)
        return CPU("generic")
    if host is None:
        host = _host_features()
    return cpu_from_features(host)


def _host_features() -> dict[str, bool]:
    try:
        from llvmlite import binding
        return dict(binding.get_host_cpu_features())
    except (ImportError, RuntimeError):  # no llvmlite, or no feature list on this platform
        return {}


def _numba_target() -> CPU:
    """numba's target, read without importing numba (0.3-0.5 s a process, which the NumPy
    backend does not need): its config reads NUMBA_CPU_NAME, and NUMBA_CPU_FEATURES with
    "" as the default when the name is "generic"."""
    if "numba" in sys.modules:
        from numba.core import config
        return target_cpu(config.CPU_NAME, config.CPU_FEATURES)
    if importlib.util.find_spec("numba") is None:
        return CPU("generic")
    name = os.environ.get("NUMBA_CPU_NAME")
    features = os.environ.get("NUMBA_CPU_FEATURES",
                              "" if str(name).lower() == "generic" else None)
    return target_cpu(name, features)


_TARGET: list[CPU] = []


def target() -> CPU:
    """The CPU the compiled kernels are built for (``TARGET``), read on first use: the
    host's feature list comes from llvmlite (0.1-0.2 s of import), which a process on the
    NumPy backend never needs."""
    if not _TARGET:
        _TARGET.append(_numba_target())
    return _TARGET[0]


def __getattr__(name: str):
    if name == "TARGET":
        return target()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(frozen=True)
class Tile:
    """The register tiles' shape on a CPU kind (``_vgemm``): out = a b in ``rows`` x
    ``vectors`` vectors of ``width`` floats; out = a b^T in ``nt_rows`` x ``nt_cols``
    sums of vector partials; ``nt_max`` outputs a position and ``nt_min_cols`` summed
    columns bound where a b^T runs on them in the Python loops."""
    width: int
    rows: int
    vectors: int
    nt_rows: int
    nt_cols: int
    nt_max: int
    nt_min_cols: int

    @property
    def cols(self) -> int:
        return self.width * self.vectors


# AVX-512 (32 registers): 8 x 2 vectors of 16 (16 accumulators), 4 x 4 sums. AVX2 (16
# registers): 4 x 3 vectors of 8 (12 accumulators), 4 x 2 sums. a b^T: a long sum over few
# outputs is BLAS's ground, the more so with AVX2's halving of short sums.
TILES = {"avx512": Tile(16, 8, 2, 4, 4, 128 * 128, 32),
         "avx2": Tile(8, 4, 3, 4, 2, 32 * 32, 96)}


@dataclass(frozen=True)
class Limits:
    """Every threshold and switch of the compiled kernels (defaults are the measured
    choices; benchmarks/RESULTS.md, "Kernel planner").

    Switches:
        register_tiles: the register-tiled GEMMs and direct kernels (env
            DISTNN_REGISTER_TILES=0 turns them off: the engine on BLAS alone).
        block_drivers: Winograd's blocks in the compiled drivers (``_winograd4``)
            where they apply; False keeps the Python loop over blocks.
        tile_products: the Python loops' GEMMs on the register tiles; None: by CPU kind
            (AVX-512 only: on AVX2 they tied or lost against BLAS there).
        add_relu: a residual block's sum and the ReLU after it as one pass (``fuse_add_relu``).
        vector_rows: the register-tiled direct kernels' tiles on whole output rows where
            they fit (``vector_rows``); False keeps the tiles over flat padded rows.
        dw_shift: the register-tiled direct kernels' weight gradient for 16 filters with
            its taps by shifting dy (``dw_shift``); False keeps the input's broadcasts.
        vector_cols: the register-tiled direct kernels over column-shifted copies of the
            input on narrow planes (``vector_cols``), and there the backward of Winograd's
            layers on them (``vector_backward``); False keeps the flat tiles and Winograd.
        onednn_backward: the backward (dx, dw, db) of the layers ``onednn_backward`` names
            on oneDNN's primitives where its library is here; False keeps the forward's own.
    """
    register_tiles: bool = True
    block_drivers: bool = True
    tile_products: bool | None = None
    add_relu: bool = True
    vector_rows: bool = True
    dw_shift: bool = True
    vector_cols: bool = True
    # Winograd over im2col for 3x3 stride-1 layers with this many channels, outputs this
    # wide (the transforms cost more than the 2.25x fewer multiplies save below)
    winograd_min_channels: int = 16
    winograd_min_size: int = 2
    # F(4x4) over F(2x2) from 4x4 outputs with C*F or output area this large (F(2x2) keeps
    # the small, few-channel layers: a tie there, with ~8x less rounding error)
    winograd4_min_size: int = 4
    winograd4_min_cf: int = 32 * 32
    winograd4_min_area: int = 16 * 16
    # the direct kernels for stride-1 layers up to this C*KH*KW (few input channels)
    direct_max_ckk: int = 108
    # the register-tiled direct kernels (AVX-512): few channels on big planes at stride 1,
    # up to vector_max_cf2 filter pairs at stride 2
    vector_max_cf: int = 32 * 32
    vector_min_area: int = 16 * 16
    vector_max_cf2: int = 32 * 64
    # Winograd layers' backward on them over column copies up to this C*F
    vector_cols_max_cf: int = 64 * 64
    # oneDNN's backward for 3x3 layers with this many channels and filters, up to this C*F
    # (resnet20's 32- and 64-channel layers on an Intel AVX-512 host at 1 thread; fewer
    # channels tied, vgg11bn's wider Winograd layers were faster on their own backward)
    onednn_backward: bool = True
    onednn_min_channels: int = 32
    onednn_max_cf: int = 64 * 64
    # the 1x1 kernels up to this F*C (more channels on small planes: im2col's one GEMM)
    pointwise_max_fc: int = 1 << 16
    # Winograd's compiled block drivers up to this F*C (beyond, dU = dM V^T is BLAS's)
    drivers_max_fc: int = 64 * 64
    # register-tiled products from this many columns (below, the remainder loops dominate)
    tile_min_cols: int = 32
    # Winograd blocks: V and M of a block about block_bytes; at least min_tiles tiles a
    # GEMM when U is big; 2+ threads split every kernel when U outweighs u_over_vm times a
    # thread's V and M, or the GEMM exceeds split_mnk multiply-adds; the weight transform
    # split among threads from split_weights filter pairs
    block_bytes: int = 1 << 20
    min_tiles: int = 256
    u_over_vm: int = 2
    split_mnk: int = 1 << 62
    split_weights: int = 256 * 128
    # im2col: columns built ~chunk_bytes a block, kept for backward up to keep_columns_bytes
    chunk_bytes: int = 2 << 20
    keep_columns_bytes: int = 8 << 20
    # threads: element-wise loops in parallel from parallel_min elements; compiled
    # element-wise jobs of the block threads from elementwise_min, in pieces of
    # elementwise_piece; a threaded BLAS call from small_gemm multiply-adds (2^21: every
    # GEMM of gpt_mini's blocks runs threaded at 2 threads, 20.1k -> 26.6k tokens/s on an
    # idle AVX-512 host; with 2^26 they all ran on one BLAS thread)
    parallel_min: int = (1 << 20) + 1
    elementwise_min: int = 1 << 19
    elementwise_piece: int = 1 << 12
    small_gemm: int = 1 << 21
    # the block threads: pieces a thread of ``pieces`` (env DISTNN_PIECES); how long an
    # idle thread looks for its next share, in sched_yield calls, before it sleeps (env
    # DISTNN_SPIN_YIELDS; 0: at once); shares taken as threads come free (False: fixed
    # round-robin shares, for comparison)
    pieces_per_thread: int = 4
    spin_yields: int = 100_000
    dynamic: bool = True

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "tile_products":
                if value is not None and not isinstance(value, bool):
                    raise ValueError(f"Limits.tile_products must be None or a bool, "
                                     f"got {value!r}")
            elif isinstance(value, bool) != (f.type in ("bool", bool)):
                raise ValueError(f"Limits.{f.name} must be a {f.type}, got {value!r}")
            elif not isinstance(value, bool) and (not isinstance(value, int) or value < 0):
                raise ValueError(f"Limits.{f.name} must be a non-negative int, got {value!r}")


def _from_env(env: Mapping[str, str]) -> Limits:
    """``Limits`` with the environment's switches (read once, when kernels are imported)."""
    def number(name: str, default: int, low: int) -> int:
        text = env.get(name, "").strip()
        if not text:
            return default
        try:
            return max(low, int(text))
        except ValueError:
            raise ValueError(f"{name} must be an integer, got {text!r}") from None

    return Limits(register_tiles=env.get("DISTNN_REGISTER_TILES", "1") != "0",
                  pieces_per_thread=number("DISTNN_PIECES", 4, 1),
                  spin_yields=number("DISTNN_SPIN_YIELDS", 100_000, 0))


LIMITS = _from_env(os.environ)


@contextlib.contextmanager
def using(**changes) -> Iterator[Limits]:
    """Replace some of ``LIMITS`` inside a with-block (restored after)."""
    global LIMITS
    saved = LIMITS
    LIMITS = replace(saved, **changes)
    try:
        yield LIMITS
    finally:
        LIMITS = saved


def _limits(limits: Limits | None) -> Limits:
    return LIMITS if limits is None else limits


def tiles_on(cpu: CPU | None = None, limits: Limits | None = None) -> bool:
    """Whether the register tiles run: built for this CPU and not switched off."""
    return _limits(limits).register_tiles and (cpu or target()).tiles


def tile_products(cpu: CPU | None = None, limits: Limits | None = None) -> bool:
    """Whether the Python loops' GEMMs (``_vgemm.product``) take the register tiles: on
    AVX-512 (on AVX2 the tiles pay only inside the compiled drivers)."""
    lim, cpu = _limits(limits), cpu or target()
    if not tiles_on(cpu, lim):
        return False
    return lim.tile_products if lim.tile_products is not None else cpu.kind == "avx512"


def fuse_add_relu(dtype, limits: Limits | None = None) -> bool:
    """Whether a residual sum and the ReLU after it run fused on the compiled path: forward
    max(a + b, 0) in one pass; backward the ReLU's mask into a new array, into which the
    branches' gradients are then summed in place. Floats, switch on (the layer also asks
    for contiguous arrays of one shape)."""
    return _limits(limits).add_relu and np.dtype(dtype).kind == "f"


def fuse_bn_relu(dtype, limits: Limits | None = None) -> bool:
    """Whether a batch norm and the ReLU after it run as one pass: for floats, on either
    backend (the batch-norm kernels take the ReLU: ``bn_relu_*``)."""
    return np.dtype(dtype).kind == "f"


# the fusions of a layer and the ReLU after it, by the name a layer declares
# (``relu_fusion``; nn/fusion.py asks ``fuses`` by that name)
FUSIONS = {"bn_relu": fuse_bn_relu, "add_relu": fuse_add_relu}


def fuses(name: str, dtype, limits: Limits | None = None) -> bool:
    """Whether the fusion ``name`` (a key of ``FUSIONS``) runs for this dtype."""
    if name not in FUSIONS:
        raise ValueError(f"fusion name: one of {', '.join(FUSIONS)}; got {name!r}")
    return FUSIONS[name](dtype, limits)


# -- convolution --------------------------------------------------------------------------
@dataclass(frozen=True)
class ConvPlan:
    """How the compiled path computes one convolution.

    method: "winograd" (``tile`` 2 or 4; ``drivers``: its blocks in the compiled drivers,
    F(4x4) only),
    "vector" (register-tiled direct kernels), "direct", "pointwise" (1x1) or "im2col".
    """
    method: str
    tile: int = 0
    drivers: bool = False


def winograd_applies(g) -> bool:
    """Whether Winograd F(2x2, 3x3) computes this convolution: 3x3, stride 1, undilated."""
    return (g.kh, g.kw, g.sh, g.sw, g.dh, g.dw) == (3, 3, 1, 1, 1, 1)


def direct_applies(g) -> bool:
    """Whether the direct kernels compute this convolution: stride 1 (any padding,
    dilation and kernel size)."""
    return (g.sh, g.sw) == (1, 1)


def vector_applies(g) -> bool:
    """Whether the register-tiled direct kernels compute this convolution: stride 1 (any
    dilation), or stride 2 undilated with kernels of 2x2 and up (by input phases)."""
    return (g.sh, g.sw) == (1, 1) or ((g.sh, g.sw) == (2, 2) and (g.dh, g.dw) == (1, 1)
                                       and min(g.kh, g.kw) >= 2)


def pointwise_applies(g) -> bool:
    """Whether the 1x1 kernels compute this convolution: 1x1, no padding."""
    return (g.kh, g.kw) == (1, 1) and not any((g.pt, g.pb, g.pl, g.pr))


def winograd_tile(g, f: int, limits: Limits | None = None) -> int:
    """Winograd's output tile for this convolution: 4 (F(4x4, 3x3)), 2 (F(2x2, 3x3)) or 0
    (not Winograd)."""
    lim = _limits(limits)
    if not (winograd_applies(g) and g.c >= lim.winograd_min_channels
            and min(g.oh, g.ow) >= lim.winograd_min_size):
        return 0
    big = g.c * f >= lim.winograd4_min_cf or g.oh * g.ow >= lim.winograd4_min_area
    return 4 if min(g.oh, g.ow) >= lim.winograd4_min_size and big else 2


def use_vector(g, f: int, dtype, cpu: CPU | None = None, limits: Limits | None = None
               ) -> bool:
    """The register-tiled direct kernels: float32 on AVX-512, filters and channels
    multiples of 8, few channels on big planes (stride 1) or few filter pairs (stride 2)."""
    lim, cpu = _limits(limits), cpu or target()
    if not (tiles_on(cpu, lim) and cpu.kind == "avx512" and np.dtype(dtype) == np.float32
            and vector_applies(g) and f % 8 == 0 and g.c % 8 == 0):
        return False
    if (g.sh, g.sw) == (2, 2):
        return g.c * f <= lim.vector_max_cf2
    return g.c * f <= lim.vector_max_cf and g.oh * g.ow >= lim.vector_min_area


def vector_rows(oh: int, ow: int, limits: Limits | None = None) -> bool:
    """Whether a register-tiled direct kernel writing oh x ow outputs at step 1 tiles
    whole output rows (``_vdirect_cols.rows_forward``): rows of a multiple of 32 outputs (a
    tile 32 of one row) or of 16 in an even number of rows (a tile two rows), the switch on. Its
    tiles then skip the padding columns between rows and store into the output directly,
    with the same sums (the flat tiles compute Wp - OW wasted columns a row and copy)."""
    return _limits(limits).vector_rows and (ow % 32 == 0 or (ow == 16 and oh % 2 == 0))


def vector_cols(g, limits: Limits | None = None) -> bool:
    """Whether the register-tiled direct kernels of a stride-1 layer run over KW
    column-shifted copies of the input (``_vdirect_cols``): rows narrower than 16 that the
    row tiles do not take, OH*OW and H*W multiples of 32 (each plane then whole tiles of
    32 outputs, dx's too), the switch on. The flat tiles' sums (3x3 forwards and dx in
    another order)."""
    return (_limits(limits).vector_cols and (g.sh, g.sw) == (1, 1) and g.ow < 16
            and (g.oh * g.ow) % 32 == 0 and (g.h * g.w) % 32 == 0)


def vector_backward(g, f: int, dtype, cpu: CPU | None = None, limits: Limits | None = None
                    ) -> bool:
    """Whether a Winograd layer's backward (dx, dw, db) runs on the register-tiled direct
    kernels over column copies (its forward stays Winograd's): float32 on AVX-512, filters
    and channels multiples of 8, ``vector_cols`` planes, up to vector_cols_max_cf filter
    pairs (resnet20's 64->64 8x8)."""
    lim, cpu = _limits(limits), cpu or target()
    return (tiles_on(cpu, lim) and cpu.kind == "avx512" and np.dtype(dtype) == np.float32
            and f % 8 == 0 and g.c % 8 == 0 and vector_cols(g, lim)
            and g.c * f <= lim.vector_cols_max_cf)


def onednn_backward(g, f: int, dtype, threads: int = 1, cpu: CPU | None = None,
                    limits: Limits | None = None) -> bool:
    """Whether a register-tiled or Winograd layer's backward (dx, dw, db) runs on oneDNN's
    primitives, its forward staying the compiled path's (where oneDNN's library is here:
    ``registry`` asks that): float32 on AVX-512 at 1 thread, 3x3 undilated kernels, at
    least onednn_min_channels channels and filters, up to onednn_max_cf filter pairs, the
    switch on. Measured faster there in resnet20's step (its 32->32 16x16, 32->64 stride-2
    and 64->64 8x8 layers); at 2 threads oneDNN's OpenMP pool and the block threads slowed
    each other (benchmarks/history/2026-12-03-details.md: where resnet20's step goes)."""
    lim, cpu = _limits(limits), cpu or target()
    return (lim.onednn_backward and cpu.kind == "avx512" and np.dtype(dtype) == np.float32
            and threads == 1 and (g.kh, g.kw, g.dh, g.dw) == (3, 3, 1, 1)
            and min(g.c, f) >= lim.onednn_min_channels and g.c * f <= lim.onednn_max_cf)


def dw_shift(g, limits: Limits | None = None) -> bool:
    """Whether the register-tiled direct kernels sum the weight gradient of 16 filters
    (filters in the vector lanes, rows of 3 taps) with the taps by shifting dy: each input
    value is broadcast once for its 3 taps rather than once a tap, so that the
    multiply-adds rather than the loads bound the tile (``_vdirect``'s shift tiles); the same sums.
    Stride 1 only (at stride 2 a row's taps lie in different input phases)."""
    return _limits(limits).dw_shift and (g.sh, g.sw) == (1, 1)


def use_direct(g, f: int, limits: Limits | None = None) -> bool:
    """The direct kernels over im2col + GEMM: stride 1, kernels 2 wide and up, few input
    channels (C*KH*KW up to direct_max_ckk)."""
    return (direct_applies(g) and g.kw >= 2
            and g.c * g.kh * g.kw <= _limits(limits).direct_max_ckk)


def use_pointwise(g, f: int, limits: Limits | None = None) -> bool:
    """The 1x1 kernels over im2col + GEMM, up to pointwise_max_fc filter pairs."""
    return pointwise_applies(g) and f * g.c <= _limits(limits).pointwise_max_fc


def drivers_apply(dtype, c: int, f: int, cpu: CPU | None = None,
                  limits: Limits | None = None) -> bool:
    """Whether Winograd's compiled block drivers take a layer: float32, channels and
    filters multiples of 8 (the tiles' rows on either CPU), at most drivers_max_fc filter
    pairs, register tiles on."""
    lim, cpu = _limits(limits), cpu or target()
    return (lim.block_drivers and tiles_on(cpu, lim) and np.dtype(dtype) == np.float32
            and c % 8 == 0 and f % 8 == 0 and c * f <= lim.drivers_max_fc)


def winograd_drivers(dtype, c: int, f: int, workers: int, threads: int,
                     cpu: CPU | None = None, limits: Limits | None = None) -> bool:
    """Whether a Winograd layer's blocks run in the compiled drivers: where they apply, at
    one thread or with whole blocks a thread (``workers`` > 1; layers that split every
    kernel among the threads keep the Python loop, their products split by positions)."""
    return drivers_apply(dtype, c, f, cpu, limits) and (workers > 1 or threads == 1)


def plan_conv(g, f: int, dtype, *, threads: int = 1, cpu: CPU | None = None,
              limits: Limits | None = None) -> ConvPlan:
    """The compiled path's method for a convolution of geometry ``g`` (``ConvGeometry``)
    with ``f`` filters: the register-tiled direct kernels, Winograd, the direct kernels,
    the 1x1 kernels, else im2col + GEMM, in that order of preference where each applies
    and was measured faster, for ``threads`` threads of the rank."""
    lim, cpu = _limits(limits), cpu or target()
    if use_vector(g, f, dtype, cpu, lim):
        return ConvPlan("vector")
    tile = winograd_tile(g, f, lim)
    if tile:
        th, tw = -(-g.oh // tile), -(-g.ow // tile)
        p = (tile + 2) ** 2
        workers = winograd_blocks(g.n, g.c, f, th, tw, np.dtype(dtype).itemsize, p, threads,
                                  lim)[2]
        return ConvPlan("winograd", tile,
                        tile == 4 and winograd_drivers(dtype, g.c, f, workers, threads, cpu,
                                                       lim))
    if use_direct(g, f, lim):
        return ConvPlan("direct")
    if use_pointwise(g, f, lim):
        return ConvPlan("pointwise")
    return ConvPlan("im2col")


# -- Winograd's blocks --------------------------------------------------------------------
def balanced_block(n: int, k: int, workers: int) -> int:
    """Samples per block for n samples in blocks of up to k split among ``workers``: the
    fewest blocks, a multiple of ``workers``, of equal size but the last (so the shares
    differ by at most the last block's shortfall; ``run`` gives that lighter share to the
    calling thread, which also does the serial work)."""
    k = max(1, min(n, k))
    if workers <= 1 or n < workers:
        return k
    per_thread = -(-n // (workers * k))  # blocks each thread takes
    return -(-n // (workers * per_thread))


def split_blocks(n: int, k: int, workers: int) -> list[tuple[int, int]]:
    """Blocks (n0, n1) of up to k samples covering range(n): with 2+ workers the fewest
    blocks that give every worker the same number, sized to differ by at most one sample
    (the shorter ones last), so round-robin shares differ by at most one sample where n
    allows (64 samples in blocks of up to 3: 22 blocks, shares 32 and 32)."""
    k = max(1, min(n, k))
    if workers <= 1 or n < workers:  # one thread: the plain blocks of k
        return [(n0, min(n, n0 + k)) for n0 in range(0, n, k)]
    count = min(n, workers * -(-n // (workers * k)))  # every worker as many, none empty
    size, extra = divmod(n, count)  # the first ``extra`` blocks get one more sample
    bounds, n0 = [], 0
    for i in range(count):
        n1 = n0 + size + (i < extra)
        bounds.append((n0, n1))
        n0 = n1
    return bounds


def split_kernels(f: int, c: int, t: int, limits: Limits | None = None) -> bool:
    """Whether 2+ threads split every kernel and GEMM of a Winograd block (rather than take
    whole blocks each) for F filters, C channels and t tiles a thread's block: when U (F*C
    values a position, read whole by each thread that takes blocks) is more than
    u_over_vm times that block's V and M ((C + F) * t), or the GEMM exceeds split_mnk."""
    lim = _limits(limits)
    return f * c > lim.u_over_vm * (c + f) * t or f * c * t > lim.split_mnk


def forward_cols(dtype, c: int, f: int, threads: int, cpu: CPU | None = None,
                 limits: Limits | None = None) -> int:
    """The register tile's columns where a Winograd forward runs its products on them (in
    the compiled drivers, at one thread), else 0: ``winograd_blocks`` then sizes its blocks
    in whole tiles of columns."""
    lim, cpu = _limits(limits), cpu or target()
    if threads != 1 or not drivers_apply(dtype, c, f, cpu, lim):
        return 0
    return TILES[cpu.kind].cols


def winograd_blocks(n: int, c: int, f: int, th: int, tw: int, itemsize: int, p: int,
                    threads: int, limits: Limits | None = None, cols: int = 0):
    """(k, blocks, workers) of a Winograd layer: samples per block, the blocks (n0, n1),
    and how many threads take whole blocks side by side (1: the blocks one after the
    other, every kernel split among the threads when there are several). ``p``: 16 for
    F(2x2), 36 for F(4x4); th x tw tiles a plane; ``cols``: ``forward_cols`` for a
    forward pass (0 for backward, whose dU = dM V^T wants long blocks)."""
    lim = _limits(limits)
    per_sample = p * (c + f) * th * tw * itemsize
    k = lim.block_bytes // per_sample
    u_bytes = p * f * c * itemsize
    # a forward on the register tiles with U up to block_bytes: the fewest samples that
    # fill whole tiles of columns (V and M stay in the cache, U is re-read from it)
    aligned = cols // math.gcd(cols, th * tw) if cols and u_bytes <= lim.block_bytes else 0
    if u_bytes > lim.block_bytes // 4 and aligned and aligned <= max(k, 1):
        k = aligned
    elif u_bytes > lim.block_bytes // 4:
        # big U: at least min_tiles tiles a GEMM, or re-reading U for every block costs
        # more than V and M leaving the cache
        k = max(k, -(-lim.min_tiles // (th * tw)))
    k = max(1, min(n, k))
    workers = 1
    if (threads > 1 and n >= threads
            and not split_kernels(f, c, min(k, -(-n // threads)) * th * tw, lim)):
        k, workers = min(k, -(-n // threads)), threads
    elif threads > 1:
        k = max(1, min(n, k * threads))
    if workers > 1:
        # as many blocks a thread, shares within a sample of each other
        blocks = split_blocks(n, k, workers)
        return max(n1 - n0 for n0, n1 in blocks), blocks, workers
    return k, [(n0, min(n, n0 + k)) for n0 in range(0, n, k)], workers
