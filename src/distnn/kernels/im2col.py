"""im2col / col2im over NCHW arrays (compiled on the numba backend, else ``conv_numpy``'s
NumPy code), and the geometry of a 2-D convolution (``geometry``: output size, "same"
padding, ``ConvGeometry``, re-exported here). Two column layouts, both with rows ordered
(c, kh, kw) so that ``w.reshape(F, -1) @ col`` is the convolution (``distnn.kernels.conv``):

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
from .conv_numpy import _col2im_compact, _im2col_compact
from .geometry import (ConvGeometry, Pads, Pair, _buffer, conv_geometry,  # noqa: F401
                       conv_output_size, im2col_args, same_padding)


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
        fast.im2col(np.ascontiguousarray(x), 0, g.n, *im2col_args(g), out)
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
        fast.col2im(np.ascontiguousarray(col), 0, g.n, *im2col_args(g), out)
        return out
    return _col2im_compact(col, g, out)

