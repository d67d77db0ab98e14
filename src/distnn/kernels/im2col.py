"""im2col / col2im over NCHW arrays, and the geometry of a 2-D convolution (output size,
"same" padding, ``ConvGeometry``). Two column layouts, both with rows ordered (c, kh, kw) so
that ``w.reshape(F, -1) @ col`` is the convolution (``distnn.kernels.conv``):

* compact: ``col`` is (C*KH*KW, N*OH*OW), columns ordered (n, oh, ow). The public
  ``im2col``/``col2im`` and strided convolutions use it.
* flat (stride 1 only): the padded input is stored channel-major, (C, N*Hp*Wp). A kernel
  offset (i, j) is then one shift of ``i*dh*Wp + j*dw`` along the flat axis, so every
  im2col row is one long contiguous copy and col2im adds long contiguous runs (NumPy's
  elementwise ops are 3-4x slower on short strided rows).

Work arrays can be reused between calls: pass a dict as ``ws`` and keep it; arrays are
kept per name and replaced when the shape or dtype changes.
"""
from __future__ import annotations

import numpy as np

from .backend import compiled
from .geometry import (ConvGeometry, Pads, Pair, _buffer, conv_geometry,  # noqa: F401
                       conv_output_size, same_padding)

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


def im2col(x: np.ndarray, kernel_size: Pair, stride: Pair = (1, 1),
           padding: Pads = (0, 0, 0, 0), dilation: Pair = (1, 1), *,
           out: np.ndarray | None = None) -> np.ndarray:
    """Patches of NCHW ``x`` as a (C*KH*KW, N*OH*OW) matrix (rows (c, kh, kw), columns
    (n, oh, ow)); ``padding`` is (top, bottom, left, right) of zeros."""
    g = conv_geometry(x.shape, kernel_size, stride, padding, dilation)
    shape = (g.c * g.kh * g.kw, g.n * g.oh * g.ow)
    out = np.empty(shape, x.dtype) if out is None else out
    fast = compiled()
    if fast is not None and out.flags.c_contiguous:
        fast.im2col(np.ascontiguousarray(x), 0, g.n, *_im2col_args(g), out)
        return out
    return _im2col_compact(x, g, out)


def col2im(col: np.ndarray, x_shape, kernel_size: Pair, stride: Pair = (1, 1),
           padding: Pads = (0, 0, 0, 0), dilation: Pair = (1, 1), *,
           out: np.ndarray | None = None) -> np.ndarray:
    """Adjoint of ``im2col``: sum each column entry back into its (N, C, H, W) position."""
    g = conv_geometry(x_shape, kernel_size, stride, padding, dilation)
    out = np.empty(tuple(x_shape), col.dtype) if out is None else out
    fast = compiled()
    if fast is not None and out.flags.c_contiguous:
        fast.col2im(np.ascontiguousarray(col), 0, g.n, *_im2col_args(g), out)
        return out
    return _col2im_compact(col, g, out)


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


def _im2col_args(g: ConvGeometry):
    return g.kh, g.kw, g.sh, g.sw, g.pt, g.pl, g.dh, g.dw, g.oh, g.ow
