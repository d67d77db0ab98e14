"""Batched small-matrix products for the Winograd GEMMs, with register tiles of 16-float
(AVX-512) or 8-float (AVX2) vectors (LLVM IR written through numba intrinsics), float32
only.

The Winograd GEMMs of few-channel layers are skinny, (F, C) @ (C, T) with F, C = 16..64 at
each of 16 or 36 transformed positions: BLAS spends them packing and, where OpenBLAS runs
its AVX2 kernels on an AVX-512 CPU (OPENBLAS_CORETYPE=Haswell on this project's machines),
at half the vector width. Here a tile of the product (8 rows x 32 columns on AVX-512, 4 x 24
on AVX2: 16 and 12 vector accumulators) stays in registers across the whole sum, the
right-hand rows are read as vectors and the left-hand entries broadcast: no packing,
nothing but the two operands read. Measured, 1 thread, float32, in cache (36 positions):
AVX-512, 16x16 @ 16x192 233 GFLOP/s vs OpenBLAS-Haswell 88; 32x32 @ 32x1024 180 vs 96;
64x64 @ 64x256 242 vs 117. AVX2 (AMD Zen 3): 16x16 @ 16x192 52-54 vs 32-36 (see WIDTH).

``matmul(a, b, out)`` is out[p] = a[p] @ b[p] and ``matmul_nt(a, b, out, add)`` is out[p]
(+)= a[p] @ b[p]^T (a sum over the long axis, NT_ROWS x NT_COLS tiles of vector partial
sums). Both take views whose last axis is contiguous (the driver's work arrays), any row
strides. ``usable`` says when they apply (float32, row counts multiples of the tile's, a
CPU with AVX-512F or AVX2 and FMA — LLVM would split the vectors elsewhere, where BLAS is
the better bet); otherwise the caller keeps ``np.matmul``. ``product`` and ``product_nt``
(the Python loops' GEMMs) take them on AVX-512 only (PRODUCTS); compiled callers
(``_winograd_blocks``) call ``matmul_flat`` and ``matmul_nt_flat`` directly. Sums run in
a different order than BLAS's, so results agree to float32 rounding, not bit for bit.
"""
from __future__ import annotations

import os

import numba as nb
import numpy as np
from llvmlite import binding as llvm_binding
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ._numba_runtime import _U

_jit = nb.njit(cache=True, nogil=True)

_I64 = ir.IntType(64)
_I32 = ir.IntType(32)


def _vector(width: int) -> ir.VectorType:
    return ir.VectorType(ir.FloatType(), width)


def _features() -> dict:
    try:
        return dict(llvm_binding.get_host_cpu_features())
    except RuntimeError:  # no feature list on this platform
        return {}


_HOST = _features()
AVX512 = bool(_HOST.get("avx512f", False))
AVX2 = bool(_HOST.get("avx2", False) and _HOST.get("fma", False))

# The tiles of this CPU. AVX-512 (32 vector registers): 8 rows x 2 vectors of 16 floats (16
# accumulators) for out = a b, 4 x 4 sums of 16-float partials for a b^T. AVX2 (16
# registers of 8 floats): 4 rows x 3 vectors (12 accumulators, 3 loads and a broadcast),
# 4 x 2 sums. Measured on the AVX2 host (AMD EPYC Zen 3, 1 thread, 36 positions, GFLOP/s
# against OpenBLAS): a b 16x16 @ 16x192 51.8-54.4 vs 32.2-36.1, 32x32 @ 32x112 58.9 vs 43.3,
# 64x64 @ 64x56 72.8 vs 54.6 (4 x 2 vectors 45-65, 8 x 1 34-38); a b^T 16x16 over 192
# columns 56-58 vs 29-44, 32x32 over 112 43 vs 41, but 64x64 over 56 39 vs 57 (a short sum
# over many outputs: BLAS's, see NT_MAX and NT_MIN_COLS).
WIDTH, ROWS, NV, NT_ROWS, NT_COLS = (16, 8, 2, 4, 4) if AVX512 else (8, 4, 3, 4, 2)
COLS = WIDTH * NV  # columns of a product tile


def _fma(builder, width: int = 16):
    v = _vector(width)
    return cgutils.get_or_insert_function(builder.module, ir.FunctionType(v, [v] * 3),
                                          f"llvm.fma.v{width}f32")


def _vptr(builder, base, offset, width: int = 16):
    return builder.bitcast(builder.gep(base, [offset]), _vector(width).as_pointer())


def _splat(builder, x, width: int = 16):
    v = _vector(width)
    x = builder.insert_element(ir.Constant(v, ir.Undefined), x, ir.Constant(_I32, 0))
    return builder.shuffle_vector(x, ir.Constant(v, ir.Undefined),
                                  ir.Constant(ir.VectorType(_I32, width), [0] * width))


def _data(context, builder, sig, args, i):
    """The data pointer of array argument i of an intrinsic."""
    return context.make_array(sig.args[i])(context, builder, args[i]).data


def _accumulators(builder, rows: int, cols: int, width: int = 16):
    """rows x cols accumulators of ``width`` floats, zero (allocas that LLVM keeps in
    registers)."""
    zero = ir.Constant(_vector(width), [0.0] * width)
    return [[cgutils.alloca_once_value(builder, zero) for _ in range(cols)]
            for _ in range(rows)]


def _outer_fma(builder, acc, avs, bvs) -> None:
    """acc[i][j] += avs[i] * bvs[j]."""
    fma = _fma(builder, avs[0].type.count)
    for i, av in enumerate(avs):
        for j, bv in enumerate(bvs):
            builder.store(builder.call(fma, [av, bv, builder.load(acc[i][j])]), acc[i][j])


def _broadcast_step(builder, acc, ap, acol, ars, bp, brow, width: int = 16) -> None:
    """One k of a tile: acc[r][j] += a[acol + r*ars] * b[brow + width*j : +width]."""
    bv = [builder.load(_vptr(builder, bp, builder.add(brow, ir.Constant(_I64, width * j)),
                             width), align=4) for j in range(len(acc[0]))]
    av = [_splat(builder, builder.load(builder.gep(ap, [builder.add(
        acol, builder.mul(ir.Constant(_I64, r), ars))])), width) for r in range(len(acc))]
    _outer_fma(builder, acc, av, bv)


def _store_tile(builder, cp, co, crs, acc, width: int = 16) -> None:
    """c[co + r*crs + width*j : +width] = acc[r][j]."""
    for r, row in enumerate(acc):
        crow = builder.add(co, builder.mul(ir.Constant(_I64, r), crs))
        for j, a in enumerate(row):
            builder.store(builder.load(a), _vptr(builder, cp, builder.add(
                crow, ir.Constant(_I64, width * j)), width), align=4)


def _tile_nn(nv: int, rows: int, width: int):
    """c[co + r*crs + j] = sum_k a[ao + r*ars + k*aks] * b[bo + k*brs + j], r < rows,
    j < width*nv (flat element offsets into the arrays' data)."""
    @intrinsic
    def tile(typingctx, a, ao, ars, aks, b, bo, brs, c, co, crs, k):
        sig = types.void(a, ao, ars, aks, b, bo, brs, c, co, crs, k)

        def codegen(context, builder, sig, args):
            _, ao_, ars_, aks_, _, bo_, brs_, _, co_, crs_, k_ = args
            ap, bp, cp = (_data(context, builder, sig, args, i) for i in (0, 4, 7))
            acc = _accumulators(builder, rows, nv, width)
            with cgutils.for_range(builder, k_) as loop:
                kk = loop.index
                _broadcast_step(builder, acc, ap, builder.add(ao_, builder.mul(kk, aks_)), ars_,
                                bp, builder.add(bo_, builder.mul(kk, brs_)), width)
            _store_tile(builder, cp, co_, crs_, acc, width)
            return context.get_dummy_value()
        return sig, codegen
    return tile


_tile_main = _tile_nn(NV, ROWS, WIDTH)
_tile_one = _tile_nn(1, ROWS, WIDTH)


def _make_tile_nt(ni: int, nj: int, width: int):
    """The intrinsic s[i*nj + j] = sum over samples m < ns and t < width*nw of
    a[ao + m*sa + i*ars + t] * b[bo + m*sb + j*brs + t], i < ni, j < nj: ``width`` partial
    sums a lane, halved pairwise at the end (the same order on every call)."""
    @intrinsic
    def tile(typingctx, a, ao, ars, sa, b, bo, brs, sb, ns, nw, s):
        sig = types.void(a, ao, ars, sa, b, bo, brs, sb, ns, nw, s)

        def codegen(context, builder, sig, args):
            _, ao_, ars_, sa_, _, bo_, brs_, sb_, ns_, nw_, _ = args
            ap, bp, sp = (_data(context, builder, sig, args, i) for i in (0, 4, 10))
            acc = _accumulators(builder, ni, nj, width)
            with cgutils.for_range(builder, ns_) as samples:
                m = samples.index
                am = builder.add(ao_, builder.mul(m, sa_))
                bm = builder.add(bo_, builder.mul(m, sb_))
                with cgutils.for_range(builder, nw_) as loop:
                    t = builder.mul(loop.index, ir.Constant(_I64, width))
                    av = [builder.load(_vptr(builder, ap, builder.add(
                        builder.add(am, builder.mul(ir.Constant(_I64, i), ars_)), t), width),
                        align=4) for i in range(ni)]
                    bv = [builder.load(_vptr(builder, bp, builder.add(
                        builder.add(bm, builder.mul(ir.Constant(_I64, j), brs_)), t), width),
                        align=4) for j in range(nj)]
                    _outer_fma(builder, acc, av, bv)
            for i in range(ni):
                for j in range(nj):
                    v = builder.load(acc[i][j])
                    w = width
                    while w > 1:  # pairwise halves
                        w //= 2
                        lo = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_I32, w),
                                                                      list(range(w))))
                        hi = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_I32, w),
                                                                      list(range(w, 2 * w))))
                        v = builder.fadd(lo, hi)
                    builder.store(builder.extract_element(v, ir.Constant(_I32, 0)),
                                  builder.gep(sp, [ir.Constant(_I64, i * nj + j)]))
            return context.get_dummy_value()
        return sig, codegen
    return tile


# 4 x 4 sums of 16-float partials (``_vdirect``'s weight gradients, AVX-512)
_tile_nt = _make_tile_nt(4, 4, 16)
_tile_nt_host = _tile_nt if AVX512 else _make_tile_nt(NT_ROWS, NT_COLS, WIDTH)


@_jit
def matmul_flat(a, ps, rs, ks, b, bps, brs, c, cps, crs, npos, rows, kdim, t_all):
    """c[p*cps + r*crs + t] = sum_k a[p*ps + r*rs + k*ks] * b[p*bps + k*brs + t] for
    p < npos, r < rows (a multiple of ROWS), t < t_all, on 1-D views (any element strides
    of the positions and rows; compiled callers pass their work arrays as they are)."""
    t_main = t_all - t_all % COLS
    t_vec = t_all - t_all % WIDTH
    for p in range(npos):
        for t0 in range(0, t_main, COLS):
            for r0 in range(0, rows, ROWS):
                _tile_main(a, p * ps + r0 * rs, rs, ks, b, p * bps + t0, brs, c,
                           p * cps + r0 * crs + t0, crs, kdim)
        for t0 in range(t_main, t_vec, WIDTH):
            for r0 in range(0, rows, ROWS):
                _tile_one(a, p * ps + r0 * rs, rs, ks, b, p * bps + t0, brs, c,
                          p * cps + r0 * crs + t0, crs, kdim)
        for r in range(rows):
            for t in range(t_vec, t_all):
                s = np.float32(0)
                for k in range(kdim):
                    s += a[_U(p * ps + r * rs + k * ks)] * b[_U(p * bps + k * brs + t)]
                c[_U(p * cps + r * crs + t)] = s


@_jit
def matmul_nt_flat(a, aps, ars, b, bps, brs, c, cps, crs, npos, ni, nj, t_all, add):
    """c[p*cps + i*crs + j] (+)= sum_t a[p*aps + i*ars + t] * b[p*bps + j*brs + t] for
    p < npos, i < ni (a multiple of NT_ROWS), j < nj (of NT_COLS), t < t_all, on 1-D
    views."""
    t_vec = t_all - t_all % WIDTH
    s = np.empty(NT_ROWS * NT_COLS, np.float32)
    for p in range(npos):
        for i0 in range(0, ni, NT_ROWS):
            for j0 in range(0, nj, NT_COLS):
                ao = p * aps + i0 * ars
                bo = p * bps + j0 * brs
                _tile_nt_host(a, ao, ars, 0, b, bo, brs, 0, 1, t_vec // WIDTH, s)
                for i in range(NT_ROWS):
                    for j in range(NT_COLS):
                        x = s[i * NT_COLS + j]
                        for t in range(t_vec, t_all):
                            x += a[_U(ao + i * ars + t)] * b[_U(bo + j * brs + t)]
                        o = p * cps + (i0 + i) * crs + j0 + j
                        if add:
                            c[_U(o)] += x
                        else:
                            c[_U(o)] = x


def _rows_ok(x: np.ndarray) -> bool:
    return x.dtype == np.float32 and x.ndim == 3 and x.strides[2] == 4 and \
        x.strides[0] % 4 == 0 and x.strides[1] % 4 == 0


def usable(a: np.ndarray, b: np.ndarray, out: np.ndarray, nt: bool = False) -> bool:
    """Whether ``matmul`` (or ``matmul_nt``) takes these operands: float32, last axes
    contiguous, out's rows (and for nt b's rows) a multiple of the tile, an AVX-512 or
    AVX2 (with FMA) CPU."""
    if not (ENABLED and TILES and _rows_ok(b) and _rows_ok(out)):
        return False
    if nt:
        return (_rows_ok(a) and a.shape[1] % NT_ROWS == 0 and b.shape[1] % NT_COLS == 0
                and a.shape[2] >= NT_MIN_COLS)
    return (out.shape[2] >= MIN_COLS and a.dtype == np.float32 and a.ndim == 3
            and min(a.strides) > 0 and all(st % 4 == 0 for st in a.strides)
            and out.shape[1] % ROWS == 0)


# DISTNN_REGISTER_TILES=0 turns the register tiles off (every GEMM on BLAS, no
# register-tiled direct convolutions): the engine as it was before them, for comparison
ENABLED = os.environ.get("DISTNN_REGISTER_TILES", "1") != "0"
# A CPU the tiles are made for (elsewhere LLVM would split the vectors: BLAS is the better
# bet)
TILES = AVX512 or AVX2
# Whether ``product`` and ``product_nt`` (the Python loops' GEMMs) take the tiles. Not on
# AVX2: there, in the Winograd layers, they tied or lost against BLAS (fwd+bwd 0.95-1.04x;
# resnet20's step at 1 and 2 threads 0.97x and 0.93x, alternated in one process) though 1.3-
# 1.5x faster on the same shapes in cache; the AVX2 tiles run inside
# ``_winograd_blocks``' compiled drivers, where they pay.
PRODUCTS = AVX512
# Columns (the long axis) from which the tiles run: below, the scalar remainder loops would
# do most of the work (a batch of 2 on 8x8 Winograd planes: 8 columns, 0.5-1 ms a product
# against BLAS's 0.02). Not higher: vgg11bn's 4x4 and 2x2 layers at 2 threads have 32
# columns a block (one tile a sample), and on BLAS its step took 178 ms instead of 160.
MIN_COLS = 32
# F * C up to which out = a b^T runs here, and the columns (the sum's length) from which:
# AVX-512, measured 1.3-1.9x BLAS up to 128x128 outputs, a tie at 256x256, 0.8x at 512x512
# (a long sum over few outputs is BLAS's ground). AVX2: 1.3-1.9x on 16x16 to 16x32 over 96
# to 192 columns, a tie on 32x32 over 112, 0.4-0.7x on 64x64 over 32-56 (the 4 x 2 sums
# halved at the end of every short sum).
NT_MAX, NT_MIN_COLS = (128 * 128, MIN_COLS) if AVX512 else (32 * 32, 96)


def matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> np.ndarray:
    """out[p] = a[p] @ b[p] for a (P, R, K) (any strides: a transposed view of a contiguous
    array is read in place), b (P, K, T), out (P, R, T); see ``usable``."""
    s, bs, cs = (x // 4 for x in a.strides), b.strides, out.strides
    matmul_flat(_flat(a), *s, _flat(b), bs[0] // 4, bs[1] // 4, _flat(out), cs[0] // 4,
                cs[1] // 4, *out.shape[:2], b.shape[1], out.shape[2])
    return out


def _flat(a: np.ndarray) -> np.ndarray:
    """A 1-D view from a's first element over all of a's elements (no copy; a's strides
    positive)."""
    span = sum((n - 1) * st for n, st in zip(a.shape, a.strides)) // a.itemsize + 1
    return np.lib.stride_tricks.as_strided(a, shape=(span,), strides=(a.itemsize,))


def matmul_nt(a: np.ndarray, b: np.ndarray, out: np.ndarray, add: bool = False) -> np.ndarray:
    """out[p] = a[p] @ b[p]^T (or += when ``add``) for a (P, I, T), b (P, J, T)."""
    as_, bs, cs = a.strides, b.strides, out.strides
    matmul_nt_flat(_flat(a), as_[0] // 4, as_[1] // 4, _flat(b), bs[0] // 4, bs[1] // 4,
                   _flat(out), cs[0] // 4, cs[1] // 4, *out.shape, a.shape[2], add)
    return out


def product(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> np.ndarray:
    """out[p] = a[p] @ b[p] (3-D): on the tiles where ``usable`` on an AVX-512 CPU
    (PRODUCTS), else BLAS."""
    if PRODUCTS and usable(a, b, out):
        return matmul(a, b, out)
    return np.matmul(a, b, out=out)


def product_nt(a: np.ndarray, b: np.ndarray, out: np.ndarray, add: bool,
               part: np.ndarray | None) -> np.ndarray:
    """out[p] (+)= a[p] @ b[p]^T (3-D): on the tiles where ``usable`` on an AVX-512 CPU
    (PRODUCTS) and the result is at most NT_MAX values a position, else BLAS (``part``: its
    scratch for the sum when adding)."""
    if PRODUCTS and out.shape[1] * out.shape[2] <= NT_MAX and usable(a, b, out, nt=True):
        return matmul_nt(a, b, out, add)
    if add:
        np.matmul(a, b.transpose(0, 2, 1), out=part)
        out += part
    else:
        np.matmul(a, b.transpose(0, 2, 1), out=out)
    return out
