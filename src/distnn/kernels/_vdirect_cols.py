"""The register-tiled direct convolution (``_vdirect``) on small planes, over column-shifted
copies of the input.

On planes whose rows are not whole vectors (8x8: ``plan.vector_rows`` does not take
them) the flat tiles of ``_vdirect.forward`` run over padded rows Wp apart, computing the
Wp - OW padding columns between them (96 positions for 64 outputs on a padded 8x8) and
copying the outputs out of a work array. Here each padded plane is stored as KW copies,
copy j holding columns j*dw .. j*dw + OW - 1 of every padded row (Hp rows of OW): output
position k = p*OW + q of tap (i, j) then reads copy j at k + i*dh*OW, so that the OH*OW
outputs of a plane are one run whose input is one run per channel and tap, like a row of
32 for ``rows_forward``. Its tile (8 filters x 2 vectors of 16) takes 32 outputs at a
time straight into y (no padding columns, no work array, no copy); dx is the same over
copies of dy padded for the full correlation; dw (``_vdirect.weight_grad_t`` and
``weight_grad``) reads the copies as rows of OW, the positions one run per sample (no
zeros between rows). 3x3 kernels sum channels outer and their 9 taps inner, unrolled (one
run of weights a filter, a channel's copies reread from L1; a loop of 9 taps would pay
its exit every channel); other kernels and dw with the filters in the lanes give the
same sums in the same order as the flat tiles, the same bits. ``plan.vector_cols`` says
where it applies (OH*OW and H*W multiples of 32); ``plan.vector_backward`` where a
Winograd layer (resnet20's 64->64 8x8) takes its backward here, from the same x.

Reads stay inside each channel's KW*Hp*OW copies.
"""
from __future__ import annotations

import numba as nb
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ._numba_runtime import _U
from ._vgemm import (_I64, _accumulators, _broadcast_step, _data, _store_tile,
                     _tap_channel_steps)

_jit = nb.njit(cache=True, nogil=True)
ROWS = 8  # filters a tile
LANES = 16  # positions a vector; a tile two vectors, 32 outputs


def _make_tile(ntaps: int):
    """The intrinsic c[co + r*crs + l] = sum over channels k < nc, taps t < ntaps (taps
    inner, unrolled) of a[ao + r*ars + k*ntaps + t] * b[bo + offs[t] + k*cs + l], plus
    bias[fo + r], r < 8, l < 32: each filter's weights one run, a channel's copies reread
    from L1 by its taps."""
    @intrinsic
    def tile(typingctx, a, ao, ars, b, bo, offs, cs, nc, bias, fo, c, co, crs):
        sig = types.void(a, ao, ars, b, bo, offs, cs, nc, bias, fo, c, co, crs)

        def codegen(context, builder, sig, args):
            _, ao_, ars_, _, bo_, _, cs_, nc_, _, fo_, _, co_, crs_ = args
            ap, bp, op, biasp, cp = (_data(context, builder, sig, args, i)
                                     for i in (0, 3, 5, 8, 10))
            toffs = [builder.load(builder.gep(op, [ir.Constant(_I64, t)]))
                     for t in range(ntaps)]
            acc = _accumulators(builder, ROWS, 2)
            nt = ir.Constant(_I64, ntaps)
            with cgutils.for_range(builder, nc_) as chans:
                k = chans.index
                kb = builder.add(bo_, builder.mul(k, cs_))
                ka = builder.add(ao_, builder.mul(k, nt))
                for t in range(ntaps):
                    _broadcast_step(builder, acc, ap, builder.add(ka, ir.Constant(_I64, t)),
                                    ars_, bp, builder.add(kb, toffs[t]), LANES)
            _store_tile(builder, cp, co_, crs_, acc, LANES, bias=(biasp, fo_))
            return context.get_dummy_value()
        return sig, codegen
    return tile


_tile9 = _make_tile(9)


@_jit
def pad_cols(x, n0, n1, pt, pl, kw, dw, hp, ow, out):
    """out (flat) = the kw column-shifted copies of the padded planes of x[n0:n1]:
    out[((n - n0)*C + c)*kw*hp*ow + (j*hp + r)*ow + q] = x[n, c, r - pt, q + j*dw - pl]
    (zero outside x; pt and pl may be negative). Where the copies are as wide as x, each
    is x's plane copied as one run shifted by j*dw - pl, then its columns outside x
    zeroed; otherwise row by row."""
    _, c_, h_, w_ = x.shape
    xf = x.ravel()
    z = xf.dtype.type(0)
    size = hp * ow
    # the copies' rows that hold x's rows
    ra, rb = min(max(pt, 0), hp), min(max(pt + h_, 0), hp)
    rb = max(ra, rb)
    for t in range((n1 - n0) * c_):
        s0 = (n0 * c_ + t) * h_ * w_
        for j in range(kw):
            c0 = j * dw - pl  # x's column of q = 0
            qa = min(ow, max(0, -c0))
            qb = max(qa, min(ow, w_ - c0))
            d = (t * kw + j) * size
            for k in range(ra * ow):
                out[_U(d + k)] = z
            for k in range(rb * ow, size):
                out[_U(d + k)] = z
            if ow == w_:
                off = c0 - pt * ow  # x's plane index of copy index k
                ka, kb = max(ra * ow, -off), min(rb * ow, h_ * w_ - off)
                for k in range(ka, kb):
                    out[_U(d + k)] = xf[_U(s0 + k + off)]
                for q in range(qa):  # columns outside x (and the ends of the run)
                    for r in range(ra, rb):
                        out[_U(d + r * ow + q)] = z
                for q in range(qb, ow):
                    for r in range(ra, rb):
                        out[_U(d + r * ow + q)] = z
                continue
            for r in range(ra, rb):
                e = d + r * ow
                src = s0 + (r - pt) * w_ + c0
                for q in range(qa):
                    out[_U(e + q)] = z
                for q in range(qa, qb):
                    out[_U(e + q)] = xf[_U(src + q)]
                for q in range(qb, ow):
                    out[_U(e + q)] = z


def tap_offsets(kh: int, kw: int, dh: int, dw: int, hp: int, ow: int) -> np.ndarray:
    """Tap (i, j)'s offset in a channel's copies (``pad_cols``): copy j, i*dh rows down."""
    return np.array([j * hp * ow + i * dh * ow for i in range(kh) for j in range(kw)],
                    np.int64)


def layout(g):
    """(rows, channel stride, tap offsets) of the input's copies for a geometry."""
    return g.ow, g.kw * g.hp * g.ow, tap_offsets(g.kh, g.kw, g.dh, g.dw, g.hp, g.ow)


def dx_layout(g):
    """(channel stride, tap offsets) of dy's copies for dx: dy padded for the full
    correlation (``direct._dx_parts``), H + dh*(KH - 1) rows of W."""
    hq = g.h + g.dh * (g.kh - 1)
    return g.kw * hq * g.w, tap_offsets(g.kh, g.kw, g.dh, g.dw, hq, g.w)


@_jit
def forward(xpf, c_, cs, w, b, n0, n1, offs, y):
    """y[n0:n1] (N, F, OH, OW; OH*OW a multiple of 32, F of 8) of the copies of samples
    n0..n1-1 (flat in xpf from its start, channels cs apart) with w (F, C, taps) plus b:
    3x3 kernels by ``_tile9`` (channels outer), others by ``rows_forward``' tile (taps
    outer, the flat tiles' order)."""
    f_ = w.shape[0]
    ntaps = offs.shape[0]
    wf = w.ravel()
    yr = y.ravel()
    plane = y.shape[2] * y.shape[3]
    for n in range(n0, n1):
        base = (n - n0) * c_ * cs
        for t0 in range(0, plane, 2 * LANES):
            for f0 in range(0, f_, ROWS):
                if ntaps == 9:
                    _tile9(wf, f0 * c_ * ntaps, c_ * ntaps, xpf, base + t0, offs, cs,
                           c_, b, f0, yr, (n * f_ + f0) * plane + t0, plane)
                else:
                    _tile_rows(wf, f0 * c_ * ntaps, c_ * ntaps, xpf, base + t0,
                                     LANES, offs, ntaps, cs, c_, b, f0, yr,
                                     (n * f_ + f0) * plane + t0, plane, LANES)

# -- tiles on whole output rows (``rows_forward``) ---------------------------------------
# The register-tiled direct convolution (``_vdirect``) with tiles on whole output rows.
#
# ``_vdirect.forward`` tiles a sample's flat padded rows (Wp apart) 32 positions at a time:
# its tiles straddle output rows, so they compute the Wp - OW padding columns between them
# and go through a work array from which a second loop copies the outputs (plus bias) into
# y. Where the output rows are whole vectors (``plan.vector_rows``: OW a multiple of 32, or
# OW 16 with an even number of rows), a tile of 8 filters x 2 vectors of 16 positions here
# covers either one stretch of 32 outputs of a row (the two vectors 16 apart in the input
# and in y) or the 16 outputs of two consecutive rows (Wp apart in the input, OW in y). The
# input of each vector is still one contiguous run per channel and tap, and the tile's sums
# go with the bias straight from the registers into y: no padding columns computed, no work
# array, no copy. Every output is the same sum in the same order as ``_vdirect.forward``'s
# (taps outer, channels inner, fused multiply-adds from zero, then + bias): the same bits.
#
# Reads stay inside each channel's padded plane (no SLACK needed past the last one).
@intrinsic
def _tile_rows(typingctx, a, ao, ars, b, bo, bjs, offs, ntaps, cs, nc, bias, fo, c, co,
               crs, cjs):
    """c[co + r*crs + j*cjs + l] = sum over taps t < ntaps, channels k < nc of
    a[ao + r*ars + k*ntaps + t] * b[bo + j*bjs + offs[t] + k*cs + l], plus bias[fo + r],
    r < 8, j < 2, l < 16."""
    sig = types.void(a, ao, ars, b, bo, bjs, offs, ntaps, cs, nc, bias, fo, c, co, crs, cjs)

    def codegen(context, builder, sig, args):
        (_, ao_, ars_, _, bo_, bjs_, _, nt_, cs_, nc_, _, fo_, _, co_, crs_,
         cjs_) = args
        ap, bp, op, biasp, cp = (_data(context, builder, sig, args, i)
                                 for i in (0, 3, 6, 10, 12))
        acc = _accumulators(builder, ROWS, 2)
        _tap_channel_steps(builder, acc, ap, ao_, ars_, bp, bo_, op, nt_, nc_, cs_,
                           bstep=bjs_)
        _store_tile(builder, cp, co_, crs_, acc, cstep=cjs_, bias=(biasp, fo_))
        return context.get_dummy_value()
    return sig, codegen


@_jit
def rows_forward(xpf, c_, cs, wp, w, b, n0, n1, offs, oh, ow, y):
    """y[n, f, p, q] (p < oh, q < ow, y (N, F, oh, ow)) of the padded planes of samples
    n0..n1-1 (flat in xpf from its start, channel planes cs apart, rows wp apart) with w
    (F, C, taps) (F a multiple of 8) plus b, where ``plan.vector_rows(oh, ow)``."""
    f_ = w.shape[0]
    ntaps = offs.shape[0]
    wf = w.ravel()
    yr = y.ravel()
    plane = oh * ow
    pair = ow % (2 * LANES) != 0  # 16 wide: two rows a tile
    bjs = wp if pair else LANES
    cjs = ow if pair else LANES
    rstep = 2 if pair else 1
    qstep = ow if pair else 2 * LANES
    for n in range(n0, n1):
        base = (n - n0) * c_ * cs
        for p in range(0, oh, rstep):
            for q0 in range(0, ow, qstep):
                for f0 in range(0, f_, ROWS):
                    _tile_rows(wf, f0 * c_ * ntaps, c_ * ntaps, xpf, base + p * wp + q0, bjs,
                               offs, ntaps, cs, c_, b, f0, yr,
                               (n * f_ + f0) * plane + p * ow + q0, plane, cjs)
