"""im2col + GEMM on the compiled backend: columns built for a block of samples at a time
(multi-threaded, ``_numba``), the GEMMs on the register tiles or BLAS (``_vgemm``), each
thread taking whole blocks (``_threads``). The registry's "im2col" method.
"""
from __future__ import annotations

import numpy as np

from . import planner
from .geometry import ConvCache, ConvGeometry, buffer, im2col_args


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


def forward(x, w, b, g: ConvGeometry, ws):
    """(y, cache) of a convolution by im2col + GEMM, compiled."""
    from . import _numba as fast
    from . import _vgemm
    from ._threads import kernel, run
    f = w.shape[0]
    ckk, p = g.c * g.kh * g.kw, g.oh * g.ow
    x = np.ascontiguousarray(x)
    w2 = w.reshape(f, ckk)
    keep = ckk * g.n * p * x.itemsize <= planner.LIMITS.keep_columns_bytes
    k, chunks, workers = _chunks(g.n, ckk * p * x.itemsize, keep)
    # kept columns: block (n0, n1) is colbuf[ckk*n0*p : ckk*n1*p] as (ckk, (n1-n0)*p)
    colbuf = buffer(ws, "col", (ckk * g.n * p,), x.dtype) if keep else None
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
            kernel(fast.im2col, serial)(x, n0, n1, *im2col_args(g), col)
            _vgemm.product(w2[None], col[None], yw[None])
            kernel(fast.cols_to_nchw, serial)(yw, bias, b is not None, y3, n0)

    run(len(chunks), workers, body, dynamic=True)  # each block writes its own samples
    return y, ConvCache(g, "im2col", x, colbuf if keep else None, chunks=tuple(chunks))


def backward(dy, cache: ConvCache, w, dw_out, db_out, need_dx, need_db):
    """(dx or None, dw, db or None) of ``forward``."""
    from . import _numba as fast
    from . import _vgemm
    from ._threads import kernel, run, sum_shares
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
                kernel(fast.im2col, serial)(x, n0, n1, *im2col_args(g), col)
            _vgemm.product_nt(dyw[None], col[None], dw2[None], j > 0,
                              None if part is None else part[None])
            if need_dx:
                _vgemm.product(w2t[None], dyw[None], col[None])
                kernel(fast.col2im, serial)(col, n0, n1, *im2col_args(g), dx)
        return (dw2 if len(indices) else None), db64

    dw2, db64 = sum_shares(run(len(chunks), workers, body))
    if dw2 is None:  # an empty batch
        dw_out.fill(0)
    else:
        dw_out[...] = dw2.reshape(w.shape)
    db = None
    if need_db:
        db = db_out if db_out is not None else np.empty(f, dy.dtype)
        db[...] = db64
    return dx, dw_out, db
