"""Batched small-matrix products for the Winograd GEMMs, with register tiles of 16-float
(AVX-512) or 8-float (AVX2) vectors (LLVM IR written through numba intrinsics), float32
only.

The Winograd GEMMs of few-channel layers are skinny, (F, C) @ (C, T) with F, C = 16..64 at
each of 16 or 36 transformed positions: BLAS spends them packing and, where OpenBLAS runs
its AVX2 kernels on an AVX-512 CPU, at half the vector width. Here a tile of the product
(``planner.TILES``: 8 rows x 32 columns on AVX-512, 4 x 24 on AVX2) stays in registers
across the whole sum, the right-hand rows are read as vectors and the left-hand entries
broadcast: no packing, nothing but the two operands read.

``matmul(a, b, out)`` is out[p] = a[p] @ b[p] and ``matmul_nt(a, b, out, add)`` is out[p]
(+)= a[p] @ b[p]^T (a sum over the long axis, NT_ROWS x NT_COLS tiles of vector partial
sums). Both take views whose last axis is contiguous (the driver's work arrays), any row
strides. ``usable`` says when they apply (float32, row counts multiples of the tile's, a
CPU kind with tiles, ``planner.tiles_on``); otherwise the caller keeps ``np.matmul``.
``product`` and ``product_nt`` (the Python loops' GEMMs) take them where
``planner.tile_products`` says; compiled callers (``_winograd4``) call ``matmul_flat``
and ``matmul_nt_flat`` directly. Sums run in a different order than BLAS's, so results
agree to float32 rounding, not bit for bit. The tiles are built for the CPU numba compiles
for (``planner.TARGET``).
"""
from __future__ import annotations

import numba as nb
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from . import planner
from ._numba_runtime import _U

_jit = nb.njit(cache=True, nogil=True)

_I64 = ir.IntType(64)
_I32 = ir.IntType(32)


def _vector(width: int) -> ir.VectorType:
    return ir.VectorType(ir.FloatType(), width)


# The tiles of the CPU numba compiles for (``planner.TILES``): AVX-512 8 rows x 2 vectors of
# 16 floats, 4 x 4 sums for a b^T; AVX2 4 x 3 vectors of 8, 4 x 2 sums.
AVX512 = planner.TARGET.kind == "avx512"
_TILE = planner.TILES.get(planner.TARGET.kind, planner.TILES["avx2"])
WIDTH, ROWS, NV, NT_ROWS, NT_COLS = (_TILE.width, _TILE.rows, _TILE.vectors, _TILE.nt_rows,
                                     _TILE.nt_cols)
COLS = _TILE.cols  # columns of a product tile


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


def _step_offset(builder, j: int, width: int, step):
    """j vectors along: width*j elements, or j*step for an i64 ``step``."""
    if step is None:
        return ir.Constant(_I64, width * j)
    return builder.mul(ir.Constant(_I64, j), step)


def _broadcast_step(builder, acc, ap, acol, ars, bp, brow, width: int = 16,
                    bstep=None) -> None:
    """One k of a tile: acc[r][j] += a[acol + r*ars] * b[brow + j*bstep : +width]
    (``bstep`` an i64 value; None: width)."""
    bv = [builder.load(_vptr(builder, bp, builder.add(
        brow, _step_offset(builder, j, width, bstep)), width), align=4)
        for j in range(len(acc[0]))]
    av = [_splat(builder, builder.load(builder.gep(ap, [builder.add(
        acol, builder.mul(ir.Constant(_I64, r), ars))])), width) for r in range(len(acc))]
    _outer_fma(builder, acc, av, bv)


def _tap_channel_steps(builder, acc, ap, ao, ars, bp, bo, op, ntaps, nc, cs,
                       bstep=None) -> None:
    """acc[r][j] += a[ao + r*ars + k*ntaps + t] * b[bo + offs[t] + k*cs + j*bstep : +16]
    over taps t < ntaps (offs at ``op``) and channels k < nc: a direct tile's loops."""
    with cgutils.for_range(builder, ntaps) as taps:
        t = taps.index
        tb = builder.add(bo, builder.load(builder.gep(op, [t])))
        ta = builder.add(ao, t)
        with cgutils.for_range(builder, nc) as chans:
            k = chans.index
            _broadcast_step(builder, acc, ap, builder.add(ta, builder.mul(k, ntaps)), ars,
                            bp, builder.add(tb, builder.mul(k, cs)), bstep=bstep)


def _store_tile(builder, cp, co, crs, acc, width: int = 16, cstep=None,
                bias=None) -> None:
    """c[co + r*crs + j*cstep : +width] = acc[r][j] (``cstep`` an i64 value; None:
    width), plus bias[fo + r] in every lane with ``bias=(bias pointer, fo)``."""
    for r, row in enumerate(acc):
        crow = builder.add(co, builder.mul(ir.Constant(_I64, r), crs))
        add = None if bias is None else _splat(builder, builder.load(builder.gep(
            bias[0], [builder.add(bias[1], ir.Constant(_I64, r))])), width)
        for j, a in enumerate(row):
            v = builder.load(a)
            if add is not None:
                v = builder.fadd(v, add)
            builder.store(v, _vptr(builder, cp, builder.add(
                crow, _step_offset(builder, j, width, cstep)), width), align=4)


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
    if not (planner.tiles_on() and _rows_ok(b) and _rows_ok(out)):
        return False
    if nt:
        return (_rows_ok(a) and a.shape[1] % NT_ROWS == 0 and b.shape[1] % NT_COLS == 0
                and a.shape[2] >= _TILE.nt_min_cols)
    return (out.shape[2] >= planner.LIMITS.tile_min_cols and a.dtype == np.float32 and a.ndim == 3
            and min(a.strides) > 0 and all(st % 4 == 0 for st in a.strides)
            and out.shape[1] % ROWS == 0)




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
    (``planner.tile_products``), else BLAS."""
    if planner.tile_products() and usable(a, b, out):
        return matmul(a, b, out)
    return np.matmul(a, b, out=out)


def product_nt(a: np.ndarray, b: np.ndarray, out: np.ndarray, add: bool,
               part: np.ndarray | None) -> np.ndarray:
    """out[p] (+)= a[p] @ b[p]^T (3-D): on the tiles where ``usable`` on an AVX-512 CPU
    (``planner.tile_products``) and the result is at most the tile's nt_max values a
    position, else BLAS (``part``: its scratch for the sum when adding)."""
    if (planner.tile_products() and out.shape[1] * out.shape[2] <= _TILE.nt_max
            and usable(a, b, out, nt=True)):
        return matmul_nt(a, b, out, add)
    if add:
        np.matmul(a, b.transpose(0, 2, 1), out=part)
        out += part
    else:
        np.matmul(a, b.transpose(0, 2, 1), out=out)
    return out
