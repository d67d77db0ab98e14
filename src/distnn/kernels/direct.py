"""Convolutions without a column matrix (compiled): direct stride-1 loops for few input
channels, and 1x1 kernels as a strided slice + GEMMs.

im2col + GEMM writes and reads C*KH*KW copies of the input and hands BLAS a skinny GEMM
(F of 4 to 16 rows) that runs far below its peak. For small C*KH*KW the direct loops in
``_direct`` (one long vectorized multiply-add per filter, channel and kernel offset over
a sample's padded plane) do the same multiplies with the data in L1. ``planner.use_direct``
says where that was measured faster; ``conv.conv2d_forward`` calls ``forward`` there (or
always with ``method="direct"``).

Threads: with 2+ threads the batch is split into blocks of samples, one share per thread
(``_threads``); each thread sums its own dw and db, added after in a fixed order.
"""
from __future__ import annotations

import numpy as np

from . import planner
from .geometry import ConvGeometry, _buffer
from .planner import (direct_applies, pointwise_applies, use_direct,  # noqa: F401
                   use_pointwise, use_vector, vector_applies)



def _module():
    from . import _direct
    return _direct


def _padded(x: np.ndarray, g: ConvGeometry, ws) -> np.ndarray:
    """x with its zero borders, (N, C, Hp, Wp); x itself when there is no padding."""
    if not any((g.pt, g.pb, g.pl, g.pr)):
        return x
    xp = _buffer(ws, "direct_xp", (g.n, g.c, g.hp, g.wp), x.dtype)
    _module().pad_planes(x, 0, g.n, g.pt, g.pl, xp)
    return xp


def forward(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, g: ConvGeometry,
            ws: dict | None, vector: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(y, what backward needs) for a stride-1 convolution of NCHW x: the padded input;
    or, on the register-tiled kernels (``vector``, where ``planner.use_vector`` says so; stride 2
    too), x itself."""
    from ._numba_runtime import scratch
    from ._threads import block_workers, run
    k = _module()
    x = np.ascontiguousarray(x)
    w = np.ascontiguousarray(w, x.dtype)
    if vector:
        return _vector_forward(x, w, b, g)
    f = w.shape[0]
    xp = _padded(x, g, ws)
    y = np.empty((g.n, f, g.oh, g.ow), x.dtype)
    bias = np.zeros(f, x.dtype) if b is None else np.ascontiguousarray(b, x.dtype)
    ll = (g.oh - 1) * g.wp + g.ow
    per, workers = block_workers(g.n, g.n)

    def body(indices, serial):
        acc = scratch("direct_acc", (f * ll,), x.dtype)
        for i in indices:
            k.forward(xp, w, bias, i * per, min(g.n, (i + 1) * per),
                      g.dh, g.dw, g.oh, g.ow, acc, y)

    run(-(-g.n // per), workers, body)
    return y, xp


def backward(dy: np.ndarray, xp: np.ndarray, w: np.ndarray, g: ConvGeometry,
             dw_out: np.ndarray, db_out: np.ndarray | None, need_dx: bool,
             ws: dict | None = None, vector: bool = False):
    """(dx or None, dw, db or None) of ``forward`` (``vector`` as it was given); dw and db
    are written into the given arrays. dx is the forward kernel over dy padded for a full
    correlation with the flipped, transposed weights."""
    from ._numba_runtime import scratch
    from ._threads import block_workers, run
    k = _module()
    dy = np.ascontiguousarray(dy)
    if vector:  # forward kept x itself
        return _vector_backward(dy, xp, w, g, dw_out, db_out, need_dx)
    f = w.shape[0]
    ll = (g.oh - 1) * g.wp + g.ow
    if need_dx:
        dx = np.empty((g.n, g.c, g.h, g.w), dy.dtype)
        wt = np.ascontiguousarray(w[:, :, ::-1, ::-1].transpose(1, 0, 2, 3), dy.dtype)
        et, el = g.dh * (g.kh - 1) - g.pt, g.dw * (g.kw - 1) - g.pl
        dyp = _buffer(ws, "direct_dyp", (g.n, f, g.h + g.dh * (g.kh - 1),
                                         g.w + g.dw * (g.kw - 1)), dy.dtype)
        lx = (g.h - 1) * dyp.shape[3] + g.w
        nobias = np.zeros(g.c, dy.dtype)
    zero = np.zeros(1, dy.dtype)
    per, workers = block_workers(g.n, g.n)

    def body(indices, serial):
        dyw = scratch("direct_dyw", (f * ll,), dy.dtype)
        dw64 = np.zeros(w.shape, np.float64)
        db64 = np.zeros(f, np.float64)
        for i in indices:
            n0, n1 = i * per, min(g.n, (i + 1) * per)
            k.weight_grad(xp, dy, n0, n1, g.dh, g.dw, dyw, dw64, db64, zero)
            if need_dx:
                k.pad_planes(dy, n0, n1, et, el, dyp)
                k.forward(dyp, wt, nobias, n0, n1, g.dh, g.dw, g.h, g.w,
                          scratch("direct_acc", (g.c * lx,), dy.dtype), dx)
        return dw64, db64

    _sum_into(run(-(-g.n // per), workers, body), dw_out, db_out)
    return (dx if need_dx else None), dw_out, db_out


def _sum_into(parts, dw_out, db_out) -> None:
    """dw_out and db_out (when not None) = the sums of the threads' (dw64, db64) parts,
    added in share order: the same sums for the same thread count."""
    from ._threads import sum_shares
    dw64, db64 = sum_shares(parts)
    dw_out[...] = dw64.reshape(dw_out.shape)
    if db_out is not None:
        db_out[...] = db64


class _Layout:
    """Where a block of samples' padded input lies in the flat work array of the
    register-tiled kernels: stride 1 as Hp x Wp planes, stride 2 as the 4 phases of each
    plane (``_vdirect.pad_phases``), so that every tap reads contiguous runs; narrow
    planes as KW column-shifted copies of each plane (``planner.vector_cols``)."""

    def __init__(self, g: ConvGeometry):
        from . import _vdirect as v
        from . import _vdirect_cols as vc
        self.g, self.cols = g, planner.vector_cols(g)
        if self.cols:
            self.rows, self.cs, self.offs = vc.layout(g)
        elif (g.sh, g.sw) == (1, 1):
            self.rows, self.cs = g.wp, g.hp * g.wp
            self.offs = v.tap_offsets(g.kh, g.kw, g.dh, g.dw, g.wp)
        else:
            hph, wph = -(-g.hp // 2), -(-g.wp // 2)
            self.hph, self.rows, self.cs = hph, wph, 4 * hph * wph
            self.offs = v.phase_offsets(g.kh, g.kw, hph, wph)

    def pad(self, x, n0, n1, out):
        from . import _vdirect as v
        from . import _vdirect_cols as vc
        g = self.g
        if self.cols:
            vc.pad_cols(x, n0, n1, g.pt, g.pl, g.kw, g.dw, g.hp, g.ow, out)
        elif (g.sh, g.sw) == (1, 1):
            _pad_block(x, n0, n1, g.pt, g.pl, g.hp, g.wp, out)
        else:
            v.pad_phases(x, n0, n1, g.pt, g.pl, self.hph, self.rows, out)
            size = (n1 - n0) * g.c * self.cs
            out[size:size + v.SLACK] = 0


def _pad_block(x, n0, n1, pt, pl, hp, wp, out) -> None:
    """out (flat) = the planes of x[n0:n1] padded to hp x wp (``_direct.pad_planes``),
    then SLACK zeros, which tiles reading past the last plane find."""
    from . import _vdirect as v
    size = (n1 - n0) * x.shape[1] * hp * wp
    _module().pad_planes(x[n0:n1], 0, n1 - n0, pt, pl,
                         out[:size].reshape(n1 - n0, x.shape[1], hp, wp))
    out[size:size + v.SLACK] = 0


def _vector_blocks(g: ConvGeometry, cs: int):
    """(blocks (n0, n1), workers, most samples a block): blocks of about
    VECTOR_BLOCK_BYTES of padded input."""
    from ._threads import block_workers, split_blocks
    k, workers = block_workers(g.n, VECTOR_BLOCK_BYTES // (g.c * cs * 4))
    blocks = split_blocks(g.n, k, workers)
    return blocks, workers, max((n1 - n0 for n0, n1 in blocks), default=1)


# Samples per block: their padded planes about this size, read by every tile from L2
VECTOR_BLOCK_BYTES = 256 << 10


def _vector_forward(x, w, b, g: ConvGeometry):
    """(y, x) on the register-tiled kernels: each block of samples is padded into the
    thread's scratch; backward pads x again (as Winograd transforms it again)."""
    from ._numba_runtime import scratch
    from ._threads import run
    from . import _vdirect as v
    from . import _vdirect_cols as vc
    f = w.shape[0]
    lay = _Layout(g)
    lp = v.tiles_of(g.oh, g.ow, lay.rows)
    y = np.empty((g.n, f, g.oh, g.ow), x.dtype)
    bias = np.zeros(f, x.dtype) if b is None else np.ascontiguousarray(b, x.dtype)
    blocks, workers, k = _vector_blocks(g, lay.cs)
    rows = planner.vector_rows(g.oh, g.ow) or lay.cols

    def body(indices, serial):
        acc = None if rows else scratch("vdirect_acc", (f * lp,), x.dtype)
        xpf = scratch("vdirect_xp", (k * g.c * lay.cs + v.SLACK,), x.dtype)
        for i in indices:
            n0, n1 = blocks[i]
            lay.pad(x, n0, n1, xpf)
            if lay.cols:
                vc.forward(xpf, g.c, lay.cs, w, bias, n0, n1, lay.offs, y)
            elif rows:
                vc.rows_forward(xpf, g.c, lay.cs, lay.rows, w, bias, n0, n1, lay.offs, g.oh,
                           g.ow, y)
            else:
                v.forward(xpf, g.c, lay.cs, lay.rows, w, bias, n0, n1, lay.offs, g.oh, g.ow,
                          acc, y, 0, 0, 1, 1)

    run(len(blocks), workers, body)
    return y, x


# dw's work array (dy of a block of samples as flat rows) about this size: the block's dy
# and input rows stay in L2 while every tap reads them
VECTOR_DW_BYTES = 128 << 10


def _dx_parts(w, g: ConvGeometry):
    """The input gradient as stride-1 correlations of dy, padded (dh, dw) before, each
    (weights (C, F, taps) flipped, tap offsets over rows of ``wq``, output origin and step):
    one for stride 1; for stride 2 one per phase (a, b) of the padded input, with the
    taps i = a, a + 2, ... and j = b, b + 2, ...; with (hq, wq) the padded dy's shape."""
    from . import _vdirect as v
    if (g.sh, g.sw) == (1, 1):
        et, el = g.dh * (g.kh - 1) - g.pt, g.dw * (g.kw - 1) - g.pl
        wq = g.w + g.dw * (g.kw - 1)
        wt = np.ascontiguousarray(w[:, :, ::-1, ::-1].transpose(1, 0, 2, 3))
        parts = [(wt, v.tap_offsets(g.kh, g.kw, g.dh, g.dw, wq), g.h, g.w, 0, 0, 1)]
        return (et, el, g.h + g.dh * (g.kh - 1), wq), parts
    dh, dw = (g.kh - 1) // 2, (g.kw - 1) // 2
    hq, wq = -(-g.hp // 2) + dh, -(-g.wp // 2) + dw
    parts = []
    for a in range(2):
        for b in range(2):
            ka, kb = (g.kh - a + 1) // 2, (g.kw - b + 1) // 2
            wt = np.ascontiguousarray(w[:, :, a::2, b::2][:, :, ::-1, ::-1].transpose(1, 0, 2, 3))
            sa, sb = dh - ka + 1, dw - kb + 1
            offs = np.array([(i + sa) * wq + j + sb for i in range(ka) for j in range(kb)],
                            np.int64)
            parts.append((wt, offs, (g.hp - a + 1) // 2, (g.wp - b + 1) // 2,
                          a - g.pt, b - g.pl, 2))
    return (dh, dw, hq, wq), parts


def _vector_backward(dy, x, w, g: ConvGeometry, dw_out, db_out, need_dx):
    from ._numba_runtime import scratch
    from ._threads import run
    from . import _vdirect as v
    from . import _vdirect_cols as vc
    f = w.shape[0]
    lay = _Layout(g)
    l16 = -(-((g.oh - 1) * lay.rows + g.ow) // 16) * 16
    nb = max(1, VECTOR_DW_BYTES // (f * l16 * dy.itemsize))
    blocks, workers, k = _vector_blocks(g, lay.cs)
    if need_dx:
        dx = np.empty((g.n, g.c, g.h, g.w), dy.dtype)
        (et, el, hq, wq), parts = _dx_parts(w.astype(dy.dtype, copy=False), g)
        lx = max(v.tiles_of(ph, pw, wq) for _, _, ph, pw, _, _, _ in parts)
        nobias = np.zeros(g.c, dy.dtype)
        if lay.cols:  # dx over copies of dy
            cq, offq = vc.dx_layout(g)
    dyv = dy.reshape(g.n, f, 1, -1) if lay.cols else dy  # the copies' positions: one run

    lanes = v.lanes_apply(f, g.kw)
    if lanes:  # tap (i, j) at offs[i*kw + j] = offs[i*kw] + offs[j]
        roffs = v.row_offsets(g.c, lay.cs, lay.offs[::g.kw])
        cols = np.ascontiguousarray(lay.offs[:g.kw])
        shift = planner.dw_shift(g) and not lay.cols

    def body(indices, serial):
        if lanes:  # dy with margins of cols[2] positions (``weight_grad_t``'s shift)
            dyt = scratch("vdirect_dyt", (f * (l16 + 2 * int(cols[-1])),), dy.dtype)
            s = scratch("vdirect_dws", (3 * v.DW_ROWS * 16,), dy.dtype)
        else:
            dyw = scratch("vdirect_dyw", (nb * f * l16,), dy.dtype)
        xpf = scratch("vdirect_xp", (k * g.c * lay.cs + v.SLACK,), dy.dtype)
        if need_dx:
            dypf = scratch("vdirect_dyp", (k * f * (cq if lay.cols else hq * wq) + v.SLACK,),
                           dy.dtype)
            acc = scratch("vdirect_acc", (g.c * lx,), dy.dtype)
        # with the filters in the lanes dw is summed transposed, (C*taps, F)
        dw64 = np.zeros((g.c * g.kh * g.kw, f) if lanes else (f, g.c * g.kh * g.kw),
                        np.float64)
        db64 = np.zeros(f, np.float64)
        for i in indices:
            n0, n1 = blocks[i]
            lay.pad(x, n0, n1, xpf)
            if lanes:
                v.weight_grad_t(xpf, g.c, lay.cs, lay.rows, dyv, n0, n1, roffs, cols, dyt, s,
                                dw64, db64, shift)
            else:
                for m0 in range(n0, n1, nb):
                    v.weight_grad(xpf[(m0 - n0) * g.c * lay.cs:], g.c, lay.cs, lay.rows, dyv,
                                  m0, min(n1, m0 + nb), lay.offs, dyw, dw64, db64)
            if need_dx and lay.cols:
                vc.pad_cols(dy, n0, n1, et, el, g.kw, g.dw, hq, g.w, dypf)
                vc.forward(dypf, f, cq, parts[0][0], nobias, n0, n1, offq, dx)
            elif need_dx:
                _pad_block(dy, n0, n1, et, el, hq, wq, dypf)
                for wt, offs, ph, pw, oy0, ox0, step in parts:
                    if step == 1 and planner.vector_rows(ph, pw):  # whole dx planes
                        vc.rows_forward(dypf, f, hq * wq, wq, wt, nobias, n0, n1, offs, ph, pw, dx)
                    else:
                        v.forward(dypf, f, hq * wq, wq, wt, nobias, n0, n1, offs, ph, pw,
                                  acc, dx, oy0, ox0, step, step)
        return (np.ascontiguousarray(dw64.T) if lanes else dw64), db64

    _sum_into(run(len(blocks), workers, body), dw_out, db_out)
    return (dx if need_dx else None), dw_out, db_out


# -- 1x1 kernels --------------------------------------------------------------------------
def pointwise_forward(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, g: ConvGeometry,
                      ws: dict | None) -> tuple[np.ndarray, np.ndarray]:
    """(y, the strided input (N, C, P) backward needs) of a 1x1 convolution."""
    from ._threads import block_workers, run
    x = np.ascontiguousarray(x)
    f, p = w.shape[0], g.oh * g.ow
    w2 = np.ascontiguousarray(w.reshape(f, g.c), x.dtype)
    if (g.sh, g.sw) == (1, 1):
        xs = x.reshape(g.n, g.c, p)
    else:
        xs = _buffer(ws, "pointwise_xs", (g.n, g.c, g.oh, g.ow), x.dtype)
    y = np.empty((g.n, f, p), x.dtype)
    per, workers = block_workers(g.n, g.n)

    def body(indices, serial):
        for i in indices:
            n0, n1 = i * per, min(g.n, (i + 1) * per)
            if (g.sh, g.sw) != (1, 1):
                _module().subsample(x, n0, n1, g.sh, g.sw, xs)
            np.matmul(w2, xs[n0:n1].reshape(n1 - n0, g.c, p), out=y[n0:n1])
            if b is not None:
                y[n0:n1] += b.astype(x.dtype, copy=False)[:, None]

    run(-(-g.n // per), workers, body)
    return y.reshape(g.n, f, g.oh, g.ow), xs.reshape(g.n, g.c, p)


def pointwise_backward(dy: np.ndarray, xs: np.ndarray, w: np.ndarray, g: ConvGeometry,
                       dw_out: np.ndarray, db_out: np.ndarray | None, need_dx: bool):
    """(dx or None, dw, db or None) of ``pointwise_forward``; dw and db are written into
    the given arrays."""
    from ._threads import block_workers, run
    f, p = w.shape[0], g.oh * g.ow
    dy3 = np.ascontiguousarray(dy).reshape(g.n, f, p)
    w2t = np.ascontiguousarray(w.reshape(f, g.c).T, dy.dtype)
    strided = (g.sh, g.sw) != (1, 1)
    dx = np.empty((g.n, g.c, g.h, g.w), dy.dtype) if need_dx else None
    per, workers = block_workers(g.n, g.n)

    def body(indices, serial):
        dw64 = np.zeros((f, g.c), np.float64)
        db64 = np.zeros(f, np.float64)
        for i in indices:
            n0, n1 = i * per, min(g.n, (i + 1) * per)
            if f * g.c > (f + g.c) * p:
                # per-sample products (N, F, C) would outweigh copying dy and x to
                # (F, N*P) and (C, N*P) for one GEMM (deep layers on small planes)
                dyt = np.ascontiguousarray(dy3[n0:n1].transpose(1, 0, 2)).reshape(f, -1)
                xst = np.ascontiguousarray(xs[n0:n1].transpose(1, 0, 2)).reshape(g.c, -1)
                dw64 += np.matmul(dyt, xst.T)
            else:
                dw64 += np.matmul(dy3[n0:n1], xs[n0:n1].transpose(0, 2, 1)).sum(axis=0)
            if db_out is not None:  # rows summed contiguously, then across samples
                db64 += dy3[n0:n1].sum(axis=2).sum(axis=0, dtype=np.float64)
            if need_dx:
                if strided:
                    dxs = np.matmul(w2t, dy3[n0:n1])
                    _module().upsample(dxs.reshape(n1 - n0, g.c, g.oh, g.ow), 0, n1 - n0,
                                       g.sh, g.sw, dx[n0:n1])
                else:
                    np.matmul(w2t, dy3[n0:n1], out=dx[n0:n1].reshape(n1 - n0, g.c, p))
        return dw64, db64

    _sum_into(run(-(-g.n // per), workers, body), dw_out, db_out)
    return dx, dw_out, db_out
