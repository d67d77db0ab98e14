"""The weight gradient of the register-tiled direct convolution (``_vdirect.weight_grad_t``)
for 16 filters (one vector) with its taps by shifting dy rather than the input.

``_vdirect``'s tile for 16 filters sums dw[(row r, tap q), f] over positions k of
x[r, k + cols[q]] * dy[k, f]: per position one vector of dy and a broadcast for each of
its rows x taps (12 of them for 12 multiply-adds), so that loads, not multiply-adds, bound
it. Here the same sum runs over k' = k + cols[q]: dw[(r, q), f] += x[r, k'] * dy[k' -
cols[q], f], so that per position each row's input is broadcast once for its 3 taps and dy
is read at 3 shifts (L1 hits): 6 rows x 3 taps = 18 multiply-adds for 6 broadcasts and 3
vector loads. Each accumulator gets the same products in the same order as before; the
positions where a tap's dy falls outside the sample read zeros from margins of cols[2]
positions around dyt, adding x * 0 (exact for finite x): the same bits.
"""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ._vgemm import _I64, _accumulators, _data, _outer_fma, _splat, _vptr

ROWS = 6  # input rows a tile (of ``_vdirect.DW_ROWS``, a multiple of it)
TAPS = 3


@intrinsic
def _tile_dw_shift(typingctx, a, ao, aks, b, bo, roffs, ro, cols, nk, c, co):
    """c[co + (p*3 + q)*16 + l] = sum over k < nk of a[ao + (k - cols[q])*aks + l] *
    b[bo + roffs[ro + p] + k], p < 6, q < 3, l < 16 (a readable cols[2]*aks before ao)."""
    sig = types.void(a, ao, aks, b, bo, roffs, ro, cols, nk, c, co)

    def codegen(context, builder, sig, args):
        _, ao_, aks_, _, bo_, _, ro_, _, nk_, _, co_ = args
        ap, bp, rp, qp, cp = (_data(context, builder, sig, args, i) for i in (0, 3, 5, 7, 9))
        shifts = [builder.mul(builder.load(builder.gep(qp, [ir.Constant(_I64, q)])), aks_)
                  for q in range(TAPS)]
        ptrs = [builder.gep(bp, [builder.add(bo_, builder.load(builder.gep(
            rp, [builder.add(ro_, ir.Constant(_I64, r))])))]) for r in range(ROWS)]
        acc = _accumulators(builder, ROWS, TAPS)
        with cgutils.for_range(builder, nk_) as loop:
            k = loop.index
            ak = builder.add(ao_, builder.mul(k, aks_))
            dv = [builder.load(_vptr(builder, ap, builder.sub(ak, s)), align=4) for s in shifts]
            xv = [_splat(builder, builder.load(builder.gep(ptr, [k]))) for ptr in ptrs]
            # acc[p][q] += x[p] * dy shifted by tap q: one row's taps side by side
            _outer_fma(builder, acc, xv, dv)
        for r in range(ROWS):
            for q in range(TAPS):
                builder.store(builder.load(acc[r][q]), _vptr(builder, cp, builder.add(
                    co_, ir.Constant(_I64, (r * TAPS + q) * 16))), align=4)
        return context.get_dummy_value()
    return sig, codegen


@intrinsic
def _widen_add(typingctx, s, so, c, co):
    """c[co + l] += float64(s[so + l]), l < 16: a tile's float32 sums added into the
    float64 dw in two vectors (numba's loop stays scalar there: it cannot tell the
    arrays apart). Each element the same conversion and addition: the same bits."""
    sig = types.void(s, so, c, co)

    def codegen(context, builder, sig, args):
        _, so_, _, co_ = args
        sp, cp = (_data(context, builder, sig, args, i) for i in (0, 2))
        wide = ir.VectorType(ir.DoubleType(), 16)
        v = builder.fpext(builder.load(_vptr(builder, sp, so_), align=4), wide)
        dst = builder.bitcast(builder.gep(cp, [co_]), wide.as_pointer())
        builder.store(builder.fadd(builder.load(dst, align=8), v), dst, align=8)
        return context.get_dummy_value()
    return sig, codegen
