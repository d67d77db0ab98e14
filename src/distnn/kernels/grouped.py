"""Grouped and depthwise 2-D convolution over NCHW arrays (``groups`` > 1).

The C input channels and F filters are split into ``groups`` equal groups; filter group k
sees only input group k, so ``w`` is (F, C/groups, KH, KW) as in PyTorch and ONNX.
Depthwise is groups == C (each filter reads one channel; F = m*C for a channel multiplier
m). ``conv.conv2d_forward`` / ``conv2d_backward`` route every groups > 1 here.

Methods:
* "depthwise" (compiled backend, groups == C): ``_numba_depthwise``'s direct loops, no
  padded copy and no columns.
* "shifted" (the NumPy reference, every groups): one pass per kernel tap over a strided
  view of the padded input, (N, G, C/G, P) at a time: a broadcast multiply-add where each
  group has one channel and one filter, a batched GEMM (G, F/G, C/G) x (C/G, P) otherwise.
  Memory: the padded input and one tap's view, no KH*KW-times-larger column matrix
  (MobileNet's 96-channel 32x32 depthwise layer at batch 64 would need 226 MB of them).
"""
from __future__ import annotations

import numpy as np

from .geometry import ConvGeometry, GroupedCache


def check_groups(groups, c: int, f: int, owner: str = "conv2d") -> int:
    """groups as an int after checking it divides the C input channels and the F filters;
    the ValueError names both counts."""
    if not isinstance(groups, (int, np.integer)) or isinstance(groups, bool) or groups < 1:
        raise ValueError(f"{owner}: groups must be a positive integer, got {groups!r}")
    if c % groups or f % groups:
        raise ValueError(f"{owner}: groups={groups} must divide both the input channels "
                         f"({c}) and the filters ({f}); use a divisor of both (groups={c} "
                         f"with a multiple of {c} filters is depthwise)")
    return int(groups)


def is_depthwise(g: ConvGeometry, groups: int) -> bool:
    return groups == g.c


def _taps(g: ConvGeometry):
    """(i, j, rows, cols): the padded input's slices that kernel tap (i, j) reads."""
    for i in range(g.kh):
        rows = slice(i * g.dh, i * g.dh + g.sh * (g.oh - 1) + 1, g.sh)
        for j in range(g.kw):
            yield i, j, rows, slice(j * g.dw, j * g.dw + g.sw * (g.ow - 1) + 1, g.sw)


def _pad(x: np.ndarray, g: ConvGeometry) -> np.ndarray:
    if not (g.pt or g.pb or g.pl or g.pr):
        return np.ascontiguousarray(x)
    xp = np.zeros((g.n, g.c, g.hp, g.wp), x.dtype)
    xp[:, :, g.pt:g.pt + g.h, g.pl:g.pl + g.w] = x
    return xp


def _reference_forward(xp, w, b, g: ConvGeometry, groups: int) -> np.ndarray:
    f, cg = w.shape[:2]
    fg, p = f // groups, g.oh * g.ow
    xv = xp.reshape(g.n, groups, cg, g.hp, g.wp)
    y = np.zeros((g.n, groups, fg, g.oh, g.ow), xp.dtype)
    wg = w.reshape(groups, fg, cg, g.kh, g.kw)
    for i, j, rows, cols in _taps(g):
        view = xv[:, :, :, rows, cols]
        if cg == 1 and fg == 1:
            y += wg[None, :, :, :, i, j, None] * view
        else:
            part = np.matmul(wg[:, :, :, i, j], view.reshape(g.n, groups, cg, p))
            y += part.reshape(y.shape)
    y = y.reshape(g.n, f, g.oh, g.ow)
    if b is not None:
        y += b.astype(y.dtype, copy=False)[None, :, None, None]
    return y


def _reference_backward(dy, xp, w, g: ConvGeometry, groups: int, dw_out, need_dx):
    f, cg = w.shape[:2]
    fg, p = f // groups, g.oh * g.ow
    xv = xp.reshape(g.n, groups, cg, g.hp, g.wp)
    d5 = np.ascontiguousarray(dy).reshape(g.n, groups, fg, g.oh, g.ow)
    d4 = d5.reshape(g.n, groups, fg, p)
    wg = w.reshape(groups, fg, cg, g.kh, g.kw)
    dwg = dw_out.reshape(groups, fg, cg, g.kh, g.kw)
    dxp = np.zeros((g.n, groups, cg, g.hp, g.wp), dy.dtype) if need_dx else None
    for i, j, rows, cols in _taps(g):
        view = xv[:, :, :, rows, cols]
        if cg == 1 and fg == 1:
            dwg[:, 0, 0, i, j] = np.einsum("ngfhw,ngfhw->g", d5, view)
            if need_dx:
                dxp[:, :, :, rows, cols] += wg[None, :, :, :, i, j, None] * d5
        else:
            v4 = view.reshape(g.n, groups, cg, p)
            dwg[:, :, :, i, j] = np.matmul(d4, v4.transpose(0, 1, 3, 2)).sum(axis=0)
            if need_dx:
                part = np.matmul(wg[:, :, :, i, j].transpose(0, 2, 1), d4)
                dxp[:, :, :, rows, cols] += part.reshape(g.n, groups, cg, g.oh, g.ow)
    if not need_dx:
        return None
    dxp = dxp.reshape(g.n, g.c, g.hp, g.wp)
    return np.ascontiguousarray(dxp[:, :, g.pt:g.pt + g.h, g.pl:g.pl + g.w])


def _depthwise_module():
    from . import _numba_depthwise
    return _numba_depthwise


def forward(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, g: ConvGeometry,
            groups: int, method: str | None = None) -> tuple[np.ndarray, GroupedCache]:
    """y (N, F, OH, OW) of the grouped convolution of x by w (F, C/groups, KH, KW) (+ b).

    ``method``: "depthwise" (compiled, groups == C) or "shifted" (NumPy; None too).
    Returns y and the cache for ``backward``."""
    f = w.shape[0]
    groups = check_groups(groups, g.c, f)
    if w.shape[1] * groups != g.c:
        raise ValueError(f"conv2d: weights of shape {w.shape} hold {w.shape[1]} input "
                         f"channels per group, but x has {g.c} channels in {groups} groups")
    if method is None:  # the NumPy reference; the planner's choice is conv2d_forward's
        method = "shifted"
    if method == "depthwise":
        if not is_depthwise(g, groups):
            raise ValueError(f"method='depthwise' needs groups == channels ({g.c}), got "
                             f"groups={groups}; use method='shifted'")
        x = np.ascontiguousarray(x)
        w = np.ascontiguousarray(w, x.dtype)
        y = np.empty((g.n, f, g.oh, g.ow), x.dtype)
        bias = np.zeros(1, x.dtype) if b is None else np.ascontiguousarray(b, x.dtype)
        _depthwise_module().forward(x, w, bias, b is not None, g.sh, g.sw, g.pt, g.pl,
                                    g.dh, g.dw, y)
        return y, GroupedCache(g, groups, method, x)
    if method != "shifted":
        raise ValueError(f"grouped conv: method must be 'depthwise', 'shifted' or None, "
                         f"got {method!r}")
    xp = _pad(x, g)
    return _reference_forward(xp, w, b, g, groups), GroupedCache(g, groups, method, xp)


def backward(dy: np.ndarray, cache: GroupedCache, w: np.ndarray, *,
             dw_out: np.ndarray | None = None, db_out: np.ndarray | None = None,
             need_dx: bool = True, need_db: bool = True
             ) -> tuple[np.ndarray | None, np.ndarray, np.ndarray | None]:
    """Gradients of ``forward``: (dx or None, dw, db or None); dw and db are written into
    ``dw_out`` / ``db_out`` when given (overwritten, not accumulated)."""
    g, groups = cache.geometry, cache.groups
    if dw_out is None:
        dw_out = np.empty(w.shape, dy.dtype)
    # the kernels write through flat views: a non-contiguous dw_out gets a copy
    dwt = dw_out if dw_out.flags.c_contiguous else np.empty(w.shape, dy.dtype)
    db = None
    if need_db:
        db = db_out if db_out is not None else np.empty(w.shape[0], dy.dtype)
    if cache.method == "depthwise":
        fast = _depthwise_module()
        dy = np.ascontiguousarray(dy, cache.x.dtype)
        w = np.ascontiguousarray(w, dy.dtype)
        dbt = (db if db is not None and db.flags.c_contiguous
               else np.empty(w.shape[0], dy.dtype))
        fast.backward_weights(dy, cache.x, g.sh, g.sw, g.pt, g.pl, g.dh, g.dw, need_db,
                              dwt, dbt)
        if db is not None and dbt is not db:
            db[...] = dbt
        dx = None
        if need_dx:
            dx = np.empty((g.n, g.c, g.h, g.w), dy.dtype)
            fast.backward_data(dy, w, g.sh, g.sw, g.pt, g.pl, g.dh, g.dw, dx)
    else:
        if need_db:
            np.sum(dy, axis=(0, 2, 3), out=db)
        dx = _reference_backward(dy, cache.x, w, g, groups, dwt, need_dx)
    if dwt is not dw_out:
        dw_out[...] = dwt
    return dx, dw_out, db
