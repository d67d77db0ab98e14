"""The NumPy reference of 2-D convolution (groups 1): im2col + one GEMM over one of the two
column layouts below ("flat": stride 1, the padded input channel-major, every kernel
offset one shift; "compact": any stride; see ``im2col``). The registry's "flat" and
"compact" methods; ``layout`` is the reference's own choice between them.
"""
from __future__ import annotations

import numpy as np

from .geometry import ConvCache, ConvGeometry, buffer as _buffer


# -- the column layouts (``im2col``'s NumPy side) -------------------------------------------
def _valid(out: int, size: int, offset: int, stride: int) -> tuple[int, int, int]:
    """Outputs o in [lo, hi) whose input index o*stride + offset lies in [0, size), and the
    input index of the first one."""
    lo = min(out, max(0, -(offset // stride)))
    hi = max(lo, min(out, -((offset - size) // stride)))
    return lo, hi, lo * stride + offset


def _offset_views(g: ConvGeometry, i: int, j: int):
    """For kernel offset (i, j): the (oh, ow) slices of the output grid that see real input,
    the matching strided (h, w) slices of the unpadded input, and how many outputs that is."""
    oh0, oh1, ih0 = _valid(g.oh, g.h, i * g.dh - g.pt, g.sh)
    ow0, ow1, iw0 = _valid(g.ow, g.w, j * g.dw - g.pl, g.sw)
    out_sl = (slice(oh0, oh1), slice(ow0, ow1))
    in_sl = (slice(ih0, ih0 + g.sh * (oh1 - oh0 - 1) + 1, g.sh),
             slice(iw0, iw0 + g.sw * (ow1 - ow0 - 1) + 1, g.sw))
    return out_sl, in_sl, (oh1 - oh0) * (ow1 - ow0)


def _zero_outside(a: np.ndarray, rows: slice, cols: slice) -> None:
    """Zero a[..., h, w] outside the window [rows, cols] (the padding border only)."""
    h, w = a.shape[-2:]
    r0, r1 = rows.start, rows.stop
    c0, c1 = cols.start, cols.stop
    a[..., :r0, :].fill(0)
    a[..., r1:, :].fill(0)
    a[..., r0:r1, :c0].fill(0)
    a[..., r0:r1, c1:].fill(0)


# -- compact layout -----------------------------------------------------------------------
def _im2col_compact(x: np.ndarray, g: ConvGeometry, out: np.ndarray) -> np.ndarray:
    col = out.reshape(g.c, g.kh, g.kw, g.n, g.oh, g.ow)
    xt = x.transpose(1, 0, 2, 3)
    for i in range(g.kh):
        for j in range(g.kw):
            dst = col[:, i, j]
            (osh, osw), (ish, isw), count = _offset_views(g, i, j)
            if count < g.oh * g.ow:
                _zero_outside(dst, osh, osw)
            if count:
                dst[:, :, osh, osw] = xt[:, :, ish, isw]
    return out


def _col2im_compact(col: np.ndarray, g: ConvGeometry, dx: np.ndarray) -> np.ndarray:
    c6 = col.reshape(g.c, g.kh, g.kw, g.n, g.oh, g.ow)
    dxt = dx.transpose(1, 0, 2, 3)
    dx.fill(0)
    for i in range(g.kh):
        for j in range(g.kw):
            (osh, osw), (ish, isw), count = _offset_views(g, i, j)
            if count:
                view = dxt[:, :, ish, isw]
                np.add(view, c6[:, i, j][:, :, osh, osw], out=view)
    return dx



# -- flat layout (stride 1) ---------------------------------------------------------------
def _flat_input(x: np.ndarray, g: ConvGeometry, ws) -> np.ndarray:
    """x padded and channel-major as (C, N*Hp*Wp)."""
    if g.c == 1 and not any((g.pt, g.pb, g.pl, g.pr)) and x.flags.c_contiguous:
        return x.reshape(1, -1)
    xp = _buffer(ws, "xp", (g.c, g.n, g.hp, g.wp), x.dtype)
    if g.pt:
        xp[:, :, :g.pt].fill(0)
    if g.pb:
        xp[:, :, g.hp - g.pb:].fill(0)
    if g.pl:
        xp[:, :, g.pt:g.pt + g.h, :g.pl].fill(0)
    if g.pr:
        xp[:, :, g.pt:g.pt + g.h, g.wp - g.pr:].fill(0)
    xp[:, :, g.pt:g.pt + g.h, g.pl:g.pl + g.w] = x.transpose(1, 0, 2, 3)
    return xp.reshape(g.c, -1)


def _shifts(g: ConvGeometry):
    for i in range(g.kh):
        for j in range(g.kw):
            yield i, j, i * g.dh * g.wp + j * g.dw


def _im2col_flat(xf: np.ndarray, g: ConvGeometry, out: np.ndarray) -> np.ndarray:
    m = xf.shape[1]
    col = out.reshape(g.c, g.kh, g.kw, m)
    for i, j, o in _shifts(g):
        col[:, i, j, :m - o] = xf[:, o:]
        if o:
            col[:, i, j, m - o:].fill(0)  # read only against zeroed dy columns; keep finite
    return out


def _col2im_flat(col: np.ndarray, g: ConvGeometry, dxf: np.ndarray) -> np.ndarray:
    m = dxf.shape[1]
    c4 = col.reshape(g.c, g.kh, g.kw, m)
    for i, j, o in _shifts(g):
        if o == 0:
            dxf[...] = c4[:, i, j]
        else:
            view = dxf[:, o:]
            np.add(view, c4[:, i, j, :m - o], out=view)
    return dxf



def layout(g: ConvGeometry, f: int) -> str:
    """"flat" or "compact": the reference's layout for ``f`` filters.

    The flat layout saves im2col work that grows with C but computes every padded
    position, a GEMM cost that grows with F; measured fwd+bwd, batch 64, 1 thread (flat vs
    compact, ms): 4->8 26x26 2.8 vs 3.9, 16->16 32x32 30 vs 36, 6->16 14x14 4.0 vs 4.2;
    but 1->4 28x28 0.83 vs 0.63, 3->64 32x32 18 vs 14, 512->512 4x4 380 vs 198 (32->32 8x8
    is 6.2 vs 6.6 but the padded columns cost memory)."""
    ckk = g.c * g.kh * g.kw
    flat = ((g.sh, g.sw) == (1, 1) and ckk <= 256 and f <= 4 * g.c
            and g.hp * g.wp <= 2 * g.oh * g.ow)
    return "flat" if flat else "compact"


def _conv_shifted(xf: np.ndarray, w: np.ndarray, g: ConvGeometry, yw: np.ndarray) -> None:
    """yw = conv of the flat padded input as one GEMM per kernel offset over shifted views
    (no column matrix). Columns past m - offset only feed padded, discarded positions.
    Measured 16->16 32x32 batch 64: 11.8 ms vs 20 ms for im2col + one GEMM."""
    m = xf.shape[1]
    wk = np.ascontiguousarray(w.transpose(2, 3, 0, 1))  # (kh, kw, F, C)
    part = np.empty_like(yw)
    for i, j, o in _shifts(g):
        if o == 0:
            np.matmul(wk[i, j], xf, out=yw)
        else:
            np.matmul(wk[i, j], xf[:, o:], out=part[:, :m - o])
            np.add(yw[:, :m - o], part[:, :m - o], out=yw[:, :m - o])


def forward(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, g: ConvGeometry,
            ws: dict | None, flat: bool, keep_columns: bool | None = None
            ) -> tuple[np.ndarray, ConvCache]:
    """(y, cache) over the flat (stride 1 only) or the compact layout. ``keep_columns``
    (flat only) keeps the column matrix for backward; otherwise backward computes dw from
    shifted views of the padded input (the default for C == 1 or C >= 16)."""
    if flat and (g.sh, g.sw) != (1, 1):
        raise ValueError("method='flat' needs stride 1")
    f = w.shape[0]
    ckk = g.c * g.kh * g.kw
    w2 = w.reshape(f, ckk)
    y = np.empty((g.n, f, g.oh, g.ow), x.dtype)
    if flat:
        if keep_columns is None:
            # measured dw (ms): 16->16 32x32 8.4 (columns) vs 8.1 (shifted views),
            # 1->4 28x28 0.34 vs 0.20, but 4->8 26x26 0.65 vs 2.1
            keep_columns = 1 < g.c < 16
        xf = _flat_input(x, g, ws)
        m = xf.shape[1]
        yw = _buffer(ws, "yw", (f, m), x.dtype)
        if not keep_columns and g.c >= 16:
            _conv_shifted(xf, w, g, yw)
        else:
            col = _im2col_flat(xf, g, _buffer(ws if keep_columns else None, "col", (ckk, m),
                                              x.dtype))
            np.matmul(w2, col, out=yw)
        if b is not None:
            yw += b[:, None]
        y[...] = yw.reshape(f, g.n, g.hp, g.wp)[:, :, :g.oh, :g.ow].transpose(1, 0, 2, 3)
        if not keep_columns:
            return y, ConvCache(g, "flat", xf)
    else:
        col = _im2col_compact(x, g, _buffer(ws, "col", (ckk, g.n * g.oh * g.ow), x.dtype))
        yw = _buffer(ws, "yw", (f, g.n * g.oh * g.ow), x.dtype)
        np.matmul(w2, col, out=yw)
        if b is not None:
            yw += b[:, None]
        y[...] = yw.reshape(f, g.n, g.oh, g.ow).transpose(1, 0, 2, 3)
    return y, ConvCache(g, "flat" if flat else "compact", None, col)


def backward(dy: np.ndarray, cache: ConvCache, w: np.ndarray, dw_out, db_out,
             need_dx: bool, need_db: bool, ws: dict | None = None):
    """(dx or None, dw, db or None) of ``forward``; the kept columns are overwritten."""
    g, col, xf = cache.geometry, cache.col, cache.x
    flat = cache.method == "flat"
    f = w.shape[0]
    ckk = g.c * g.kh * g.kw
    if flat:
        dyw = _buffer(ws, "yw", (f, g.n * g.hp * g.wp), dy.dtype).reshape(f, g.n, g.hp, g.wp)
        _zero_outside(dyw, slice(0, g.oh), slice(0, g.ow))
        dyw[:, :, :g.oh, :g.ow] = dy.transpose(1, 0, 2, 3)
    else:
        dyw = _buffer(ws, "yw", (f, g.n * g.oh * g.ow), dy.dtype).reshape(f, g.n, g.oh, g.ow)
        dyw[...] = dy.transpose(1, 0, 2, 3)
    dy2 = dyw.reshape(f, -1)
    db = np.sum(dy2, axis=1, out=db_out) if need_db else None
    if dw_out is None:
        dw_out = np.empty(w.shape, dy.dtype)
    if col is None:
        # dw[:, :, i, j] = dy . (input shifted by offset (i, j)); padded dy columns are 0
        m = dy2.shape[1]
        part = np.empty((f, g.c), dy.dtype)
        for i, j, o in _shifts(g):
            np.matmul(dy2[:, :m - o], xf[:, o:].T, out=part)
            dw_out[:, :, i, j] = part
    else:
        dwt = _buffer(ws, "dwt", (ckk, f), dy.dtype)
        np.matmul(col, dy2.T, out=dwt)  # measured faster than dy2 @ col.T for skinny F
        dw_out[...] = dwt.T.reshape(w.shape)
    if not need_dx:
        return None, dw_out, db
    dcol = np.matmul(w.reshape(f, ckk).T, dy2, out=col)
    if flat:
        dxf = _col2im_flat(dcol, g, _buffer(ws, "xp", (g.c, g.n, g.hp, g.wp), dy.dtype)
                           .reshape(g.c, -1))
        dx = np.empty((g.n, g.c, g.h, g.w), dy.dtype)
        dx[...] = dxf.reshape(g.c, g.n, g.hp, g.wp)[
            :, :, g.pt:g.pt + g.h, g.pl:g.pl + g.w].transpose(1, 0, 2, 3)
    else:
        dx = _col2im_compact(dcol, g, np.empty((g.n, g.c, g.h, g.w), dy.dtype))
    return dx, dw_out, db

