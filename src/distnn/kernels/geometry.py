"""The ground floor of the kernels: the types every op family and method shares (imported
by all, importing nothing of the package): a convolution's geometry (``ConvGeometry``,
output sizes, "same" padding), the caches a convolution's backward reads (``ConvCache``,
``GroupedCache``) and the per-layer work arrays (``buffer``).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

Pair = tuple[int, int]
Pads = tuple[int, int, int, int]  # top, bottom, left, right


def conv_output_size(size: int, kernel: int, stride: int = 1, pad_lo: int = 0,
                     pad_hi: int = 0, dilation: int = 1) -> int:
    """Output length of a convolution/pooling window along one axis (floor mode)."""
    return (size + pad_lo + pad_hi - dilation * (kernel - 1) - 1) // stride + 1


def same_padding(size: int, kernel: int, stride: int = 1, dilation: int = 1) -> Pair:
    """(lo, hi) padding giving ceil(size / stride) outputs; the odd extra goes to hi (TF)."""
    out = -(-size // stride)
    total = max((out - 1) * stride + dilation * (kernel - 1) + 1 - size, 0)
    return total // 2, total - total // 2


class ConvGeometry(NamedTuple):
    """Sizes of one convolution: input (n, c, h, w), kernel, strides, paddings (top,
    bottom, left, right), dilations and output (oh, ow)."""
    n: int
    c: int
    h: int
    w: int
    kh: int
    kw: int
    sh: int
    sw: int
    pt: int
    pb: int
    pl: int
    pr: int
    dh: int
    dw: int
    oh: int
    ow: int

    @property
    def hp(self) -> int:
        return self.h + self.pt + self.pb

    @property
    def wp(self) -> int:
        return self.w + self.pl + self.pr


def conv_geometry(x_shape, kernel_size: Pair, stride: Pair = (1, 1),
                  padding: Pads = (0, 0, 0, 0), dilation: Pair = (1, 1)) -> ConvGeometry:
    """The ``ConvGeometry`` of NCHW ``x_shape``; ValueError when the window does not fit."""
    n, c, h, w = (int(s) for s in x_shape)
    kh, kw = kernel_size
    pt, pb, pl, pr = padding
    oh = conv_output_size(h, kh, stride[0], pt, pb, dilation[0])
    ow = conv_output_size(w, kw, stride[1], pl, pr, dilation[1])
    if oh < 1 or ow < 1:
        raise ValueError(f"input {h}x{w} with padding {padding} is smaller than the "
                         f"{kh}x{kw} window (dilation {dilation})")
    return ConvGeometry(n, c, h, w, kh, kw, stride[0], stride[1], pt, pb, pl, pr,
                        dilation[0], dilation[1], oh, ow)


def buffer(ws: dict | None, name: str, shape: tuple, dtype) -> np.ndarray:
    """A work array of ``shape`` and ``dtype`` kept in ``ws`` under ``name`` (replaced when
    the shape or dtype changes); a new array when ``ws`` is None."""
    if ws is None:
        return np.empty(shape, dtype)
    buf = ws.get(name)
    if buf is None or buf.shape != shape or buf.dtype != dtype:
        buf = ws[name] = np.empty(shape, dtype)
    return buf


_buffer = buffer


def im2col_args(g: ConvGeometry) -> tuple:
    """The geometry as the compiled im2col / col2im kernels take it."""
    return g.kh, g.kw, g.sh, g.sw, g.pt, g.pl, g.dh, g.dw, g.oh, g.ow


class ConvCache(NamedTuple):
    """What ``conv2d_backward`` needs from the forward pass, tagged by the method that ran.

    method: "winograd" (``tile`` 2 or 4; ``x`` is the input), "vector" (the register-tiled
    direct kernels; ``x`` is the input), "direct" (``x`` is the padded input), "pointwise"
    (``x`` is the strided input), "im2col" (compiled; ``x`` is the input, ``col`` the kept
    columns or None, ``chunks`` the blocks of samples they were built in), or the NumPy
    reference's "flat" (``x`` the padded channel-major input, ``col`` the kept columns or
    None) and "compact" (``col`` the column matrix). ``vector_backward``: a Winograd layer
    the planner chose whose backward runs on the register-tiled kernels
    (``planner.vector_backward``). ``onednn_backward``: a register-tiled or Winograd layer
    the planner chose whose backward runs on oneDNN's primitives (``planner.onednn_backward``;
    they read ``x``, the input).
    """
    geometry: ConvGeometry
    method: str
    x: np.ndarray | None = None
    col: np.ndarray | None = None
    tile: int = 0
    chunks: tuple | None = None
    vector_backward: bool = False
    onednn_backward: bool = False

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


class GroupedCache(NamedTuple):
    """What ``backward`` needs from ``forward``: the geometry, the group count, the method
    that ran and its input (the padded input for "shifted", x itself for "depthwise")."""
    geometry: ConvGeometry
    groups: int
    method: str
    x: np.ndarray
