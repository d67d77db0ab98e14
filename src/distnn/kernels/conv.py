"""2-D convolution kernels over NCHW arrays: conv2d as im2col + GEMM (or Winograd).

The column layouts, im2col / col2im and the geometry are in ``distnn.kernels.im2col``
(re-exported here). Both layouts have rows ordered (c, kh, kw) so that
``w.reshape(F, -1) @ col`` is the convolution:

* compact: ``col`` is (C*KH*KW, N*OH*OW), columns ordered (n, oh, ow). Strided
  convolutions use it.
* flat (stride 1 only): the padded input is stored channel-major, (C, N*Hp*Wp), so every
  kernel offset is one shift along the flat axis (see ``im2col``). The GEMM computes an
  output at every padded position (N*Hp*Wp columns instead of N*OH*OW, ~15% more for 3x3
  kernels); the extra columns are dropped from y, and zeroed in the widened dy so they add
  nothing to dw or dx.

Work arrays can be reused between calls: pass a dict as ``ws`` and keep it (one per
layer); arrays are kept per name and replaced when the shape or dtype changes, and the
forward and backward passes share the ones of equal size. Returned y and dx are always
new arrays.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from . import direct, grouped
from . import planner
from .backend import compiled, get_num_threads
from .im2col import (ConvGeometry, Pads, Pair, _buffer, _col2im_compact, _col2im_flat,
                     _flat_input, _im2col_args, _im2col_compact, _im2col_flat, _shifts,
                     _zero_outside, col2im, conv_geometry, conv_output_size, im2col,
                     same_padding)

__all__ = ["ConvCache", "ConvGeometry", "col2im", "conv2d_backward", "conv2d_forward",
           "conv_geometry", "conv_output_size", "im2col", "same_padding"]


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


def _numba_module():
    from . import _numba
    return _numba


# -- convolution --------------------------------------------------------------------------


class ConvCache(NamedTuple):
    """What ``conv2d_backward`` needs from the forward pass, tagged by the method that ran.

    method: "winograd" (``tile`` 2 or 4; ``x`` is the input), "vector" (the register-tiled
    direct kernels; ``x`` is the input), "direct" (``x`` is the padded input), "pointwise"
    (``x`` is the strided input), "im2col" (compiled; ``x`` is the input, ``col`` the kept
    columns or None, ``chunks`` the blocks of samples they were built in), or the NumPy
    reference's "flat" (``x`` the padded channel-major input, ``col`` the kept columns or
    None) and "compact" (``col`` the column matrix). ``vector_backward``: a Winograd layer
    the planner chose whose backward runs on the register-tiled kernels
    (``planner.vector_backward``).
    """
    geometry: ConvGeometry
    method: str
    x: np.ndarray | None = None
    col: np.ndarray | None = None
    tile: int = 0
    chunks: tuple | None = None
    vector_backward: bool = False

    @property
    def winograd(self) -> bool:
        return self.method == "winograd"

    @property
    def direct(self) -> bool:  # the direct kernels, register-tiled or not
        return self.method in ("direct", "vector")

    @property
    def vector(self) -> bool:
        return self.method == "vector"

    @property
    def pointwise(self) -> bool:
        return self.method == "pointwise"




def _chunks(n: int, per_sample: int, keep: bool):
    """(samples per block, blocks (n0, n1), workers) of the compiled path: columns are
    built for a block of samples at a time (about the planner's chunk_bytes of them) so
    that the GEMM uses them while still in cache, or for the whole batch when they are
    kept for backward (up to keep_columns_bytes: resnet20 would otherwise keep ~270 MB of
    columns alive); with 2+ threads each thread takes whole blocks (``_threads``)."""
    from ._threads import block_workers, split_blocks
    k, workers = block_workers(n, n if keep else planner.LIMITS.chunk_bytes // max(per_sample, 1))
    blocks = split_blocks(n, k, workers)  # the first block is the largest
    return (blocks[0][1] - blocks[0][0] if blocks else k), blocks, workers


def _forward_compiled(fast, x, w, b, g: ConvGeometry, ws):
    from . import _vgemm
    from ._threads import kernel, run
    f = w.shape[0]
    ckk, p = g.c * g.kh * g.kw, g.oh * g.ow
    x = np.ascontiguousarray(x)
    w2 = w.reshape(f, ckk)
    keep = ckk * g.n * p * x.itemsize <= planner.LIMITS.keep_columns_bytes
    k, chunks, workers = _chunks(g.n, ckk * p * x.itemsize, keep)
    # kept columns: block (n0, n1) is colbuf[ckk*n0*p : ckk*n1*p] as (ckk, (n1-n0)*p)
    colbuf = _buffer(ws, "col", (ckk * g.n * p,), x.dtype) if keep else None
    y = np.empty((g.n, f, g.oh, g.ow), x.dtype)
    y3 = y.reshape(g.n, f, p)
    bias = np.zeros(1, x.dtype) if b is None else np.ascontiguousarray(b, x.dtype)

    def body(indices, serial):
        for i in indices:
            n0, n1 = chunks[i]
            m = (n1 - n0) * p
            col = colbuf[ckk * n0 * p:ckk * n1 * p].reshape(ckk, m) if keep else \
                fast.scratch("col", (ckk, m), x.dtype)
            yw = fast.scratch("yw", (f, m), x.dtype)
            kernel(fast.im2col, serial)(x, n0, n1, *_im2col_args(g), col)
            _vgemm.product(w2[None], col[None], yw[None])
            kernel(fast.cols_to_nchw, serial)(yw, bias, b is not None, y3, n0)

    run(len(chunks), workers, body, dynamic=True)  # each block writes its own samples
    return y, ConvCache(g, "im2col", x, colbuf if keep else None, chunks=tuple(chunks))


def _backward_compiled(fast, dy, cache: ConvCache, w, dw_out, db_out, need_dx, need_db):
    from . import _vgemm
    from ._threads import kernel, run
    g, kept, x = cache.geometry, cache.col, cache.x
    f = w.shape[0]
    ckk, p = g.c * g.kh * g.kw, g.oh * g.ow
    dy = np.ascontiguousarray(dy)
    dy3 = dy.reshape(g.n, f, p)
    w2t = w.reshape(f, ckk).T
    k, chunks, workers = _chunks(g.n, ckk * p * dy.itemsize, kept is not None)
    if kept is not None and tuple(chunks) != cache.chunks:
        kept = None  # the thread count changed since forward: build the columns again
        k, chunks, workers = _chunks(g.n, ckk * p * dy.itemsize, False)
    if dw_out is None:
        dw_out = np.empty(w.shape, dy.dtype)
    dx = np.empty((g.n, g.c, g.h, g.w), dy.dtype) if need_dx else None

    def body(indices, serial):
        # this thread's dw (scratch: it is summed below before any other call) and db
        dw2 = fast.scratch("conv_dw", (f, ckk), dy.dtype)
        part = fast.scratch("conv_dw_part", (f, ckk), dy.dtype) if len(indices) > 1 else None
        db64 = np.zeros(f, np.float64)
        for j, i in enumerate(indices):
            n0, n1 = chunks[i]
            m = (n1 - n0) * p
            dyw = fast.scratch("yw", (f, m), dy.dtype)
            kernel(fast.nchw_to_cols, serial)(dy3, n0, dyw, db64, need_db)
            if kept is not None:
                col = kept[ckk * n0 * p:ckk * n1 * p].reshape(ckk, m)
            else:
                col = fast.scratch("col", (ckk, m), dy.dtype)
                kernel(fast.im2col, serial)(x, n0, n1, *_im2col_args(g), col)
            _vgemm.product_nt(dyw[None], col[None], dw2[None], j > 0,
                              None if part is None else part[None])
            if need_dx:
                _vgemm.product(w2t[None], dyw[None], col[None])
                kernel(fast.col2im, serial)(col, n0, n1, *_im2col_args(g), dx)
        return (dw2 if len(indices) else None), db64

    parts = run(len(chunks), workers, body)
    dw2, db64 = parts[0]
    for dw_i, db_i in parts[1:]:  # fixed order: the same sums for the same thread count
        if dw_i is not None:
            dw2 += dw_i
        db64 += db_i
    if dw2 is None:  # an empty batch
        dw_out.fill(0)
    else:
        dw_out[...] = dw2.reshape(w.shape)
    db = None
    if need_db:
        db = db_out if db_out is not None else np.empty(f, dy.dtype)
        db[...] = db64
    return dx, dw_out, db


# The methods a caller may name (``method=``); None: the planner's choice (``planner.plan_conv``)
# on the compiled backend, the NumPy reference's layout choice otherwise.
METHODS = {"winograd": planner.ConvPlan("winograd", 2),
           "winograd4": planner.ConvPlan("winograd", 4),
           "direct": planner.ConvPlan("direct"), "pointwise": planner.ConvPlan("pointwise")}


def conv2d_forward(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None,
                   stride: Pair = (1, 1), padding: Pads = (0, 0, 0, 0),
                   dilation: Pair = (1, 1), *, ws: dict | None = None,
                   method: str | None = None, keep_columns: bool | None = None,
                   groups: int = 1) -> tuple[np.ndarray, ConvCache | grouped.GroupedCache]:
    """y = conv2d(x, w) + b for NCHW x (N, C, H, W), w (F, C, KH, KW), b (F,).

    ``padding`` is (top, bottom, left, right). ``method`` picks the column layout:
    "flat" (stride 1 only) or "compact"; or "direct" (stride 1, compiled: no columns,
    ``distnn.kernels.direct``), "pointwise" (1x1, no padding: strided slice + GEMMs),
    "winograd" or "winograd4" (Winograd F(2x2, 3x3) or F(4x4, 3x3); ``planner.plan_conv``
    is the default choice); by default it is chosen from measured costs.
    ``keep_columns`` (flat layout only) keeps the column matrix (C*KH*KW times the input)
    for backward; otherwise backward computes dw from shifted views of the padded input,
    which is as fast for C == 1 or C >= 16 and keeps only the input alive between the
    passes (the default there). ``groups`` > 1: a grouped convolution, w (F, C/groups, KH,
    KW), run by ``grouped`` (``method`` "depthwise", "shifted" or None there). Returns y
    (N, F, OH, OW) and the cache for ``conv2d_backward``.
    """
    f = w.shape[0]
    g = conv_geometry(x.shape, w.shape[2:], stride, padding, dilation)
    if groups != 1:
        return grouped.forward(x, w, b, g, groups, method)
    if w.shape[1] != g.c:
        raise ValueError(f"weights have {w.shape[1]} input channels but x has {g.c}")
    ckk = g.c * g.kh * g.kw
    fast = compiled() if method in (None, "winograd", "winograd4", "direct") else None
    chosen = METHODS.get(method or "")
    if chosen is None and fast is not None:
        chosen = planner.plan_conv(g, f, x.dtype, threads=get_num_threads())
    if chosen is not None and chosen.method == "winograd":
        if not planner.winograd_applies(g):
            raise ValueError(f"method={method!r} needs a 3x3 kernel, stride 1 and dilation 1, "
                             f"got {g.kh}x{g.kw}, stride {(g.sh, g.sw)}, dilation "
                             f"{(g.dh, g.dw)}; use method='compact' or leave method unset")
        from . import winograd
        x = np.ascontiguousarray(x)
        y = winograd.forward(x, w, b, g.pt, g.pb, g.pl, g.pr, tile=chosen.tile)
        return y, ConvCache(g, "winograd", x, tile=chosen.tile, vector_backward=method is None
                            and planner.vector_backward(g, f, x.dtype))
    if method == "direct" and fast is not None and planner.use_vector(g, f, x.dtype):
        chosen = planner.ConvPlan("vector")  # the register-tiled kernels where they apply
    if chosen is not None and chosen.method in ("direct", "vector"):
        vector = chosen.method == "vector"
        if not (vector or planner.direct_applies(g)):
            raise ValueError(f"method='direct' needs stride 1, got stride {(g.sh, g.sw)}")
        y, xp = direct.forward(x, w, b, g, ws, vector)
        return y, ConvCache(g, chosen.method, xp)
    if chosen is not None and chosen.method == "pointwise":
        if not planner.pointwise_applies(g):
            raise ValueError(f"method='pointwise' needs a 1x1 kernel and no padding, got "
                             f"{g.kh}x{g.kw}, padding {(g.pt, g.pb, g.pl, g.pr)}")
        y, xs = direct.pointwise_forward(x, w, b, g, ws)
        return y, ConvCache(g, "pointwise", xs)
    if chosen is not None:  # im2col + GEMM, compiled
        return _forward_compiled(fast, x, w, b, g, ws)
    if method is None:
        # The flat layout saves im2col work that grows with C but computes every padded
        # position, a GEMM cost that grows with F; measured fwd+bwd, batch 64, 1 thread
        # (flat vs compact, ms): 4->8 26x26 2.8 vs 3.9, 16->16 32x32 30 vs 36, 6->16 14x14
        # 4.0 vs 4.2; but 1->4 28x28 0.83 vs 0.63, 3->64 32x32
        # 18 vs 14, 512->512 4x4 380 vs 198 (32->32 8x8 is 6.2 vs 6.6 but the padded columns
        # cost memory).
        flat = ((g.sh, g.sw) == (1, 1) and ckk <= 256 and f <= 4 * g.c
                and g.hp * g.wp <= 2 * g.oh * g.ow)
    else:
        flat = method == "flat"
    if flat and (g.sh, g.sw) != (1, 1):
        raise ValueError("method='flat' needs stride 1")
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


def conv2d_backward(dy: np.ndarray, cache: ConvCache | grouped.GroupedCache,
                    w: np.ndarray, *,
                    dw_out: np.ndarray | None = None, db_out: np.ndarray | None = None,
                    need_dx: bool = True, need_db: bool = True, ws: dict | None = None
                    ) -> tuple[np.ndarray | None, np.ndarray, np.ndarray | None]:
    """Gradients of ``conv2d_forward``: returns (dx or None, dw, db or None).

    dw (and db) are written into ``dw_out``/``db_out`` when given (overwritten, not
    accumulated). The cached columns are overwritten when dx is computed, so call this
    once per forward.
    """
    if isinstance(cache, grouped.GroupedCache):
        return grouped.backward(dy, cache, w, dw_out=dw_out, db_out=db_out, need_dx=need_dx,
                                need_db=need_db)
    if cache.winograd and not cache.vector_backward:
        from . import winograd
        if dw_out is None:
            dw_out = np.empty(w.shape, dy.dtype)
        if need_db and db_out is None:
            db_out = np.empty(w.shape[0], dy.dtype)
        return winograd.backward(dy, cache.x, w, cache.geometry.pt, cache.geometry.pl,
                                 dw_out, db_out if need_db else None, need_dx,
                                 tile=cache.tile)
    if cache.direct or cache.vector_backward:  # the latter from x, as Winograd's
        if dw_out is None:
            dw_out = np.empty(w.shape, dy.dtype)
        if need_db and db_out is None:
            db_out = np.empty(w.shape[0], dy.dtype)
        return direct.backward(dy, cache.x, w, cache.geometry, dw_out,
                               db_out if need_db else None, need_dx, ws,
                               cache.vector or cache.vector_backward)
    if cache.pointwise:
        if dw_out is None:
            dw_out = np.empty(w.shape, dy.dtype)
        if need_db and db_out is None:
            db_out = np.empty(w.shape[0], dy.dtype)
        return direct.pointwise_backward(dy, cache.x, w, cache.geometry, dw_out,
                                         db_out if need_db else None, need_dx)
    if cache.method == "im2col":
        return _backward_compiled(compiled() or _numba_module(), dy, cache, w, dw_out, db_out,
                                  need_dx, need_db)
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
