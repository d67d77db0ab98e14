"""The register-tiled direct convolution (``_vdirect``) with tiles on whole output rows.

``_vdirect.forward`` tiles a sample's flat padded rows (Wp apart) 32 positions at a time:
its tiles straddle output rows, so they compute the Wp - OW padding columns between them
and go through a work array from which a second loop copies the outputs (plus bias) into
y. Where the output rows are whole vectors (``plan.vector_rows``: OW a multiple of 32, or
OW 16 with an even number of rows), a tile of 8 filters x 2 vectors of 16 positions here
covers either one stretch of 32 outputs of a row (the two vectors 16 apart in the input
and in y) or the 16 outputs of two consecutive rows (Wp apart in the input, OW in y). The
input of each vector is still one contiguous run per channel and tap, and the tile's sums
go with the bias straight from the registers into y: no padding columns computed, no work
array, no copy. Every output is the same sum in the same order as ``_vdirect.forward``'s
(taps outer, channels inner, fused multiply-adds from zero, then + bias): the same bits.

Reads stay inside each channel's padded plane (no SLACK needed past the last one).
"""
from __future__ import annotations

import numba as nb
from numba import types
from numba.extending import intrinsic

from ._vgemm import _accumulators, _data, _store_tile, _tap_channel_steps

_jit = nb.njit(cache=True, nogil=True)
ROWS = 8  # filters a tile
LANES = 16  # positions a vector


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
def forward(xpf, c_, cs, wp, w, b, n0, n1, offs, oh, ow, y):
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
