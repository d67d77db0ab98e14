"""The NumPy reference of 2-D convolution (groups 1): im2col + one GEMM over one of the two
column layouts of ``im2col`` ("flat": stride 1, the padded input channel-major, every
kernel offset one shift; "compact": any stride). The registry's "flat" and "compact"
methods; ``layout`` is the reference's own choice between them.
"""
from __future__ import annotations

import numpy as np

from .geometry import ConvCache, ConvGeometry, buffer as _buffer
from .im2col import (_col2im_compact, _col2im_flat, _flat_input, _im2col_compact,
                     _im2col_flat, _shifts, _zero_outside)


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

