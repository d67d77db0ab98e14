"""2-D convolution over NCHW arrays: the op's entry points, which run the method the planner
chooses among the registry's (``registry``: Winograd, the direct and register-tiled
kernels, 1x1 kernels, compiled im2col + GEMM, and the NumPy reference of ``conv_numpy``;
``measure``: fixed, measured or from a plan file).

The public im2col / col2im are in ``im2col``, the NumPy column layouts in ``conv_numpy``
and the geometry in ``geometry`` (re-exported here). Both layouts have rows ordered
(c, kh, kw) so that ``w.reshape(F, -1) @ col`` is the convolution:

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

import time

import numpy as np

from . import grouped, measure, planner, registry
from .backend import compiled, get_num_threads
from .geometry import (ConvCache, ConvGeometry, GroupedCache, Pads, Pair, conv_geometry,
                       conv_output_size, same_padding)

__all__ = ["ConvCache", "ConvGeometry", "conv2d_backward", "conv2d_forward", "conv_geometry",
           "conv_output_size", "same_padding"]


def query(g: ConvGeometry, f: int, dtype, groups: int = 1) -> registry.Query:
    """The registry's question for this layer on this process's backend and threads."""
    return registry.Query(g, f, np.dtype(dtype), planner.target(), get_num_threads(),
                          compiled() is not None, groups)


def conv_flops(g: ConvGeometry, f: int, groups: int = 1) -> float:
    """Multiply-adds x 2 of a forward, dx and dw together (3 GEMM-sized passes)."""
    return 3 * 2.0 * g.n * f * (g.c // groups) * g.kh * g.kw * g.oh * g.ow


def _planned_backward(cache: ConvCache, q: registry.Query) -> ConvCache:
    """The cache of a planned forward, flagged where the planner sends its backward to
    another method: Winograd's narrow layers to the register-tiled kernels
    (``planner.vector_backward``), and the layers ``registry.onednn_backward`` names to
    oneDNN's primitives."""
    g = cache.geometry
    if cache.method == "winograd" and planner.vector_backward(g, q.filters, q.dtype):
        cache = cache._replace(vector_backward=True)
    if cache.method in ("vector", "winograd") and registry.onednn_backward(q):
        cache = cache._replace(onednn_backward=True)
    return cache


def _choose(family: str, q: registry.Query, trial, flops: float) -> str:
    """``measure.choose`` among the registry's methods for ``q``."""
    return measure.choose(family, q, registry.fixed(family, q),
                          lambda: registry.eligible(family, q), trial, flops)


def _trial(family: str, x, w, b, g: ConvGeometry, groups: int):
    """``measure.choose``'s trial for a layer: a method's forward and backward on the
    layer's arrays (once to compile and warm, then timed), None where its y is off the
    float64 reference by more than ``measure.TOLERANCE`` (relative to max |y|)."""
    ref = []

    def once(name):
        m = registry.method(family, name)
        ws = m.prepare(query(g, w.shape[0], x.dtype, groups))
        args = (groups,) if family == "conv2d_grouped" else ()
        y, cache = m.run(x, w, b, g, ws, *args)
        if family == "conv2d":
            cache = _planned_backward(cache, query(g, w.shape[0], x.dtype))
        dw, db = np.empty_like(w), np.empty(w.shape[0], x.dtype)
        conv2d_backward(y, cache, w, dw_out=dw, db_out=db, need_db=b is not None, ws=ws)
        return y

    def trial(name):
        if not ref:
            w64 = w.astype(np.float64)
            b64 = None if b is None else b.astype(np.float64)
            if groups == 1:
                from . import conv_numpy
                y64 = conv_numpy.forward(x.astype(np.float64), w64, b64, g, None, False)[0]
            else:
                y64 = grouped.forward(x.astype(np.float64), w64, b64, g, groups, "shifted")[0]
            ref.append((y64, max(float(np.abs(y64).max(initial=0.0)), 1e-30)))
        y = once(name)
        y64, scale = ref[0]
        if not np.all(np.abs(y - y64) <= measure.TOLERANCE.get(x.dtype, 1e-3) * scale):
            return None
        t0 = time.perf_counter()
        once(name)
        return time.perf_counter() - t0

    return trial


def conv2d_forward(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None,
                   stride: Pair = (1, 1), padding: Pads = (0, 0, 0, 0),
                   dilation: Pair = (1, 1), *, ws: dict | None = None,
                   method: str | None = None, keep_columns: bool | None = None,
                   groups: int = 1) -> tuple[np.ndarray, ConvCache | GroupedCache]:
    """y = conv2d(x, w) + b for NCHW x (N, C, H, W), w (F, C, KH, KW), b (F,).

    ``padding`` is (top, bottom, left, right). ``method`` names a registered method of
    ``registry`` ("flat" (stride 1 only) or "compact": the NumPy reference's layouts;
    "direct" (stride 1, compiled: no columns; the register-tiled kernels where they
    apply), "pointwise" (1x1, no padding), "winograd" / "winograd4" (F(2x2, 3x3) or
    F(4x4, 3x3)), "vector", "im2col"); None: the planner's choice (``measure.choose``).
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
        if method is None:
            grouped.check_groups(groups, g.c, f)
            method = _choose("conv2d_grouped", query(g, f, x.dtype, groups),
                             _trial("conv2d_grouped", x, w, b, g, groups),
                             conv_flops(g, f, groups))
        return grouped.forward(x, w, b, g, groups, method)
    if w.shape[1] != g.c:
        raise ValueError(f"weights have {w.shape[1]} input channels but x has {g.c}")
    if method is None:
        q = query(g, f, x.dtype)
        name = _choose("conv2d", q, _trial("conv2d", x, w, b, g, 1), conv_flops(g, f))
        y, cache = registry.method("conv2d", name).run(x, w, b, g, ws, keep_columns)
        cache = _planned_backward(cache, q)
        if cache.onednn_backward:
            measure.note_backward("conv2d", q, "onednn")
        return y, cache
    name = registry.ALIASES.get(method, method)
    if name == "direct" and compiled() is not None and planner.use_vector(g, f, x.dtype):
        name = "vector"  # the register-tiled kernels where they apply
    return registry.method("conv2d", name).run(x, w, b, g, ws, keep_columns)


def conv2d_backward(dy: np.ndarray, cache: ConvCache | GroupedCache,
                    w: np.ndarray, *,
                    dw_out: np.ndarray | None = None, db_out: np.ndarray | None = None,
                    need_dx: bool = True, need_db: bool = True, ws: dict | None = None
                    ) -> tuple[np.ndarray | None, np.ndarray, np.ndarray | None]:
    """Gradients of ``conv2d_forward``: returns (dx or None, dw, db or None).

    dw (and db) are written into ``dw_out``/``db_out`` when given (overwritten, not
    accumulated). The cached columns are overwritten when dx is computed, so call this
    once per forward.
    """
    if isinstance(cache, GroupedCache):
        return grouped.backward(dy, cache, w, dw_out=dw_out, db_out=db_out, need_dx=need_dx,
                                need_db=need_db)
    name = registry.backward_name(cache)
    if name not in ("im2col", "reference"):
        if dw_out is None:
            dw_out = np.empty(w.shape, dy.dtype)
        if need_db and db_out is None:
            db_out = np.empty(w.shape[0], dy.dtype)
    return registry.method("conv2d_backward", name).run(dy, cache, w, dw_out, db_out,
                                                        need_dx, need_db, ws)
