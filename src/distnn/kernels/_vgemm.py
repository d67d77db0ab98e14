"""Batched small-matrix products for the Winograd GEMMs, with register tiles of 16-float
vectors (LLVM IR written through numba intrinsics), float32 only.

The Winograd GEMMs of few-channel layers are skinny, (F, C) @ (C, T) with F, C = 16..64 at
each of 16 or 36 transformed positions: BLAS spends them packing and, where OpenBLAS runs
its AVX2 kernels on an AVX-512 CPU (OPENBLAS_CORETYPE=Haswell on this project's machines),
at half the vector width. Here a tile of 8 rows x 32 columns of the product (16 vector
accumulators) stays in registers across the whole sum, the right-hand rows are read as
vectors and the left-hand entries broadcast: no packing, nothing but the two operands read.
Measured, 1 thread, float32, in cache (36 positions): 16x16 @ 16x192 233 GFLOP/s vs
OpenBLAS-Haswell 88; 32x32 @ 32x1024 180 vs 96; 64x64 @ 64x256 242 vs 117.

``matmul(a, b, out)`` is out[p] = a[p] @ b[p] and ``matmul_nt(a, b, out, add)`` is out[p]
(+)= a[p] @ b[p]^T (a sum over the long axis, 4 x 4 tiles of 16-float partial sums). Both
take views whose last axis is contiguous (the driver's work arrays), any row strides.
``usable`` says when they apply (float32, row counts multiples of 8 / 4, a CPU with
AVX-512F — LLVM would split the 16-float vectors elsewhere, where BLAS is the better bet);
otherwise the caller keeps ``np.matmul``. Sums run in a different order than BLAS's, so
results agree to float32 rounding, not bit for bit.
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

V16 = ir.VectorType(ir.FloatType(), 16)
_I64 = ir.IntType(64)
ROWS = 8        # rows of a product tile (matmul)
COLS = 32       # columns of a product tile (two vectors)
NT_ROWS = 4     # matmul_nt tiles: 4 x 4 sums


def _avx512() -> bool:
    try:
        return bool(llvm_binding.get_host_cpu_features().get("avx512f", False))
    except RuntimeError:  # no feature list on this platform
        return False


AVX512 = _avx512()


def _fma(builder):
    return cgutils.get_or_insert_function(builder.module, ir.FunctionType(V16, [V16] * 3),
                                          "llvm.fma.v16f32")


def _vptr(builder, base, offset):
    return builder.bitcast(builder.gep(base, [offset]), V16.as_pointer())


def _splat(builder, x):
    v = builder.insert_element(ir.Constant(V16, ir.Undefined), x, ir.Constant(ir.IntType(32), 0))
    return builder.shuffle_vector(v, ir.Constant(V16, ir.Undefined),
                                  ir.Constant(ir.VectorType(ir.IntType(32), 16), [0] * 16))


def _data(context, builder, sig, args, i):
    """The data pointer of array argument i of an intrinsic."""
    return context.make_array(sig.args[i])(context, builder, args[i]).data


def _accumulators(builder, rows: int, cols: int):
    """rows x cols 16-float accumulators, zero (allocas that LLVM keeps in registers)."""
    zero = ir.Constant(V16, [0.0] * 16)
    return [[cgutils.alloca_once_value(builder, zero) for _ in range(cols)]
            for _ in range(rows)]


def _outer_fma(builder, acc, avs, bvs) -> None:
    """acc[i][j] += avs[i] * bvs[j]."""
    fma = _fma(builder)
    for i, av in enumerate(avs):
        for j, bv in enumerate(bvs):
            builder.store(builder.call(fma, [av, bv, builder.load(acc[i][j])]), acc[i][j])


def _broadcast_step(builder, acc, ap, acol, ars, bp, brow) -> None:
    """One k of an 8-row tile: acc[r][j] += a[acol + r*ars] * b[brow + 16*j : +16]."""
    bv = [builder.load(_vptr(builder, bp, builder.add(brow, ir.Constant(_I64, 16 * j))),
                       align=4) for j in range(len(acc[0]))]
    av = [_splat(builder, builder.load(builder.gep(ap, [builder.add(
        acol, builder.mul(ir.Constant(_I64, r), ars))]))) for r in range(len(acc))]
    _outer_fma(builder, acc, av, bv)


def _store_tile(builder, cp, co, crs, acc) -> None:
    """c[co + r*crs + 16*j : +16] = acc[r][j]."""
    for r, row in enumerate(acc):
        crow = builder.add(co, builder.mul(ir.Constant(_I64, r), crs))
        for j, a in enumerate(row):
            builder.store(builder.load(a),
                          _vptr(builder, cp, builder.add(crow, ir.Constant(_I64, 16 * j))),
                          align=4)


def _tile_nn(nv: int):
    """c[co + r*crs + j] = sum_k a[ao + r*ars + k*aks] * b[bo + k*brs + j], r < 8, j < 16*nv
    (flat element offsets into the arrays' data)."""
    @intrinsic
    def tile(typingctx, a, ao, ars, aks, b, bo, brs, c, co, crs, k):
        sig = types.void(a, ao, ars, aks, b, bo, brs, c, co, crs, k)

        def codegen(context, builder, sig, args):
            _, ao_, ars_, aks_, _, bo_, brs_, _, co_, crs_, k_ = args
            ap, bp, cp = (_data(context, builder, sig, args, i) for i in (0, 4, 7))
            acc = _accumulators(builder, ROWS, nv)
            with cgutils.for_range(builder, k_) as loop:
                kk = loop.index
                _broadcast_step(builder, acc, ap, builder.add(ao_, builder.mul(kk, aks_)), ars_,
                                bp, builder.add(bo_, builder.mul(kk, brs_)))
            _store_tile(builder, cp, co_, crs_, acc)
            return context.get_dummy_value()
        return sig, codegen
    return tile


_tile_nn2 = _tile_nn(2)
_tile_nn1 = _tile_nn(1)


@intrinsic
def _tile_nt(typingctx, a, ao, ars, sa, b, bo, brs, sb, ns, n16, s):
    """s[i*4 + j] = sum over samples m < ns and t < 16*n16 of a[ao + m*sa + i*ars + t] *
    b[bo + m*sb + j*brs + t], i, j < 4: 16 partial sums a lane, halved pairwise at the end
    (the same order on every call)."""
    sig = types.void(a, ao, ars, sa, b, bo, brs, sb, ns, n16, s)

    def codegen(context, builder, sig, args):
        _, ao_, ars_, sa_, _, bo_, brs_, sb_, ns_, n16_, _ = args
        ap, bp, sp = (_data(context, builder, sig, args, i) for i in (0, 4, 10))
        acc = _accumulators(builder, NT_ROWS, NT_ROWS)
        with cgutils.for_range(builder, ns_) as samples:
            m = samples.index
            am = builder.add(ao_, builder.mul(m, sa_))
            bm = builder.add(bo_, builder.mul(m, sb_))
            with cgutils.for_range(builder, n16_) as loop:
                t = builder.mul(loop.index, ir.Constant(_I64, 16))
                av = [builder.load(_vptr(builder, ap, builder.add(
                    builder.add(am, builder.mul(ir.Constant(_I64, i), ars_)), t)), align=4)
                    for i in range(NT_ROWS)]
                bv = [builder.load(_vptr(builder, bp, builder.add(
                    builder.add(bm, builder.mul(ir.Constant(_I64, j), brs_)), t)), align=4)
                    for j in range(NT_ROWS)]
                _outer_fma(builder, acc, av, bv)
        i32 = ir.IntType(32)
        for i in range(NT_ROWS):
            for j in range(NT_ROWS):
                v = builder.load(acc[i][j])
                width = 16
                while width > 1:  # pairwise halves
                    width //= 2
                    lo = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(i32, width),
                                                                  list(range(width))))
                    hi = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(i32, width),
                                                                  list(range(width, 2 * width))))
                    v = builder.fadd(lo, hi)
                builder.store(builder.extract_element(v, ir.Constant(i32, 0)),
                              builder.gep(sp, [ir.Constant(_I64, i * NT_ROWS + j)]))
        return context.get_dummy_value()
    return sig, codegen


@_jit
def _matmul(a, ps, rs, ks, b, c):
    """c[p, r, t] = sum_k A_p[r, k] * b[p, k, t] with A_p[r, k] = a[p*ps + r*rs + k*ks]."""
    npos, rows, t_all = c.shape
    kdim = b.shape[1]
    bps, brs = b.strides[0] // 4, b.strides[1] // 4
    cps, crs = c.strides[0] // 4, c.strides[1] // 4
    t32 = t_all - t_all % COLS
    t16 = t_all - t_all % 16
    for p in range(npos):
        for t0 in range(0, t32, COLS):
            for r0 in range(0, rows, ROWS):
                _tile_nn2(a, p * ps + r0 * rs, rs, ks, b, p * bps + t0, brs, c,
                          p * cps + r0 * crs + t0, crs, kdim)
        if t16 > t32:
            for r0 in range(0, rows, ROWS):
                _tile_nn1(a, p * ps + r0 * rs, rs, ks, b, p * bps + t32, brs, c,
                          p * cps + r0 * crs + t32, crs, kdim)
        for r in range(rows):
            for t in range(t16, t_all):
                s = np.float32(0)
                for k in range(kdim):
                    s += a[_U(p * ps + r * rs + k * ks)] * b[_U(p), _U(k), _U(t)]
                c[p, r, t] = s


@_jit
def _matmul_nt(a, b, c, add):
    """c[p, i, j] (+)= sum_t a[p, i, t] * b[p, j, t]."""
    npos, ni, t_all = a.shape
    nj = b.shape[1]
    aps, ars = a.strides[0] // 4, a.strides[1] // 4
    bps, brs = b.strides[0] // 4, b.strides[1] // 4
    t16 = t_all - t_all % 16
    s = np.empty(NT_ROWS * NT_ROWS, np.float32)
    for p in range(npos):
        for i0 in range(0, ni, NT_ROWS):
            for j0 in range(0, nj, NT_ROWS):
                _tile_nt(a, p * aps + i0 * ars, ars, 0, b, p * bps + j0 * brs, brs, 0, 1,
                         t16 // 16, s)
                for i in range(NT_ROWS):
                    for j in range(NT_ROWS):
                        x = s[i * NT_ROWS + j]
                        for t in range(t16, t_all):
                            x += a[_U(p), _U(i0 + i), _U(t)] * b[_U(p), _U(j0 + j), _U(t)]
                        if add:
                            c[p, i0 + i, j0 + j] += x
                        else:
                            c[p, i0 + i, j0 + j] = x


def _rows_ok(x: np.ndarray) -> bool:
    return x.dtype == np.float32 and x.ndim == 3 and x.strides[2] == 4 and \
        x.strides[0] % 4 == 0 and x.strides[1] % 4 == 0


def usable(a: np.ndarray, b: np.ndarray, out: np.ndarray, nt: bool = False) -> bool:
    """Whether ``matmul`` (or ``matmul_nt``) takes these operands: float32, last axes
    contiguous, out's rows (and for nt b's rows) a multiple of the tile, an AVX-512 CPU."""
    if not (ENABLED and AVX512 and _rows_ok(b) and _rows_ok(out)):
        return False
    if nt:
        return (_rows_ok(a) and a.shape[1] % NT_ROWS == 0 and b.shape[1] % NT_ROWS == 0
                and a.shape[2] >= MIN_COLS)
    return (out.shape[2] >= MIN_COLS and a.dtype == np.float32 and a.ndim == 3
            and min(a.strides) > 0 and all(st % 4 == 0 for st in a.strides)
            and out.shape[1] % ROWS == 0)


# DISTNN_REGISTER_TILES=0 turns the register tiles off (every GEMM on BLAS, no
# register-tiled direct convolutions): the engine as it was before them, for comparison
ENABLED = os.environ.get("DISTNN_REGISTER_TILES", "1") != "0"
# Columns (the long axis) from which the tiles run: below, the scalar remainder loops would
# do most of the work (a batch of 2 on 8x8 Winograd planes: 8 columns, 0.5-1 ms a product
# against BLAS's 0.02). Not higher: vgg11bn's 4x4 and 2x2 layers at 2 threads have 32
# columns a block (one tile a sample), and on BLAS its step took 178 ms instead of 160.
MIN_COLS = 32
# F * C up to which out = a b^T runs here (measured 1.3-1.9x BLAS up to 128x128 outputs,
# a tie at 256x256, 0.8x at 512x512: a long sum over few outputs is BLAS's ground)
NT_MAX = 128 * 128


def matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> np.ndarray:
    """out[p] = a[p] @ b[p] for a (P, R, K) (any strides: a transposed view of a contiguous
    array is read in place), b (P, K, T), out (P, R, T); see ``usable``."""
    s = a.strides
    _matmul(_flat(a), s[0] // 4, s[1] // 4, s[2] // 4, b, out)
    return out


def _flat(a: np.ndarray) -> np.ndarray:
    """A 1-D view from a's first element over all of a's elements (no copy; a's strides
    positive)."""
    span = sum((n - 1) * st for n, st in zip(a.shape, a.strides)) // a.itemsize + 1
    return np.lib.stride_tricks.as_strided(a, shape=(span,), strides=(a.itemsize,))


def matmul_nt(a: np.ndarray, b: np.ndarray, out: np.ndarray, add: bool = False) -> np.ndarray:
    """out[p] = a[p] @ b[p]^T (or += when ``add``) for a (P, I, T), b (P, J, T)."""
    _matmul_nt(a, b, out, add)
    return out


def product(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> np.ndarray:
    """out[p] = a[p] @ b[p] (3-D): on the tiles where ``usable``, else BLAS."""
    if usable(a, b, out):
        return matmul(a, b, out)
    return np.matmul(a, b, out=out)


def product_nt(a: np.ndarray, b: np.ndarray, out: np.ndarray, add: bool,
               part: np.ndarray | None) -> np.ndarray:
    """out[p] (+)= a[p] @ b[p]^T (3-D): on the tiles where ``usable`` and the result is at
    most NT_MAX values a position, else BLAS (``part``: its scratch for the sum when
    adding)."""
    if out.shape[1] * out.shape[2] <= NT_MAX and usable(a, b, out, nt=True):
        return matmul_nt(a, b, out, add)
    if add:
        np.matmul(a, b.transpose(0, 2, 1), out=part)
        out += part
    else:
        np.matmul(a, b.transpose(0, 2, 1), out=out)
    return out
