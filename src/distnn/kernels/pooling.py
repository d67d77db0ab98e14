"""2-D pooling kernels over NCHW arrays: max, average and global average.

Windows are (KH, KW) with stride (SH, SW) and symmetric padding (PH, PW) on each side;
outputs use floor mode, like PyTorch's default. Max pooling pads with -inf and gives the
gradient of a window to its first maximum in row-major order (PyTorch's choice on ties);
average pooling counts the padded zeros (PyTorch ``count_include_pad=True``).

The 2x2 stride-2 max pool on even H, W (the common case) has a fast path that works on
pairs of neighbours along the flat array instead of strided 2-D windows.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .backend import compiled
from .geometry import conv_output_size

Pair = tuple[int, int]


class PoolCache(NamedTuple):
    """What the pooling backward functions need from the forward pass."""
    x_shape: tuple
    pool: Pair
    stride: Pair
    padding: Pair
    arrays: tuple


def pool_output_shape(x_shape, pool: Pair, stride: Pair, padding: Pair = (0, 0)) -> tuple:
    n, c, h, w = x_shape
    oh = conv_output_size(h, pool[0], stride[0], padding[0], padding[0])
    ow = conv_output_size(w, pool[1], stride[1], padding[1], padding[1])
    if oh < 1 or ow < 1:
        raise ValueError(f"input {h}x{w} with padding {padding} is smaller than the "
                         f"{pool[0]}x{pool[1]} pooling window")
    return n, c, oh, ow


def _padded(x: np.ndarray, padding: Pair, value: float) -> np.ndarray:
    ph, pw = padding
    if not (ph or pw):
        return x
    n, c, h, w = x.shape
    xp = np.full((n, c, h + 2 * ph, w + 2 * pw), value, x.dtype)
    xp[:, :, ph:ph + h, pw:pw + w] = x
    return xp


def _windows(xp: np.ndarray, pool: Pair, stride: Pair, oh: int, ow: int):
    """(k, strided view of xp) for each kernel offset k = i*KW + j."""
    for i in range(pool[0]):
        for j in range(pool[1]):
            yield i * pool[1] + j, xp[:, :, i:i + stride[0] * (oh - 1) + 1:stride[0],
                                      j:j + stride[1] * (ow - 1) + 1:stride[1]]


def _unpad(dxp: np.ndarray, padding: Pair) -> np.ndarray:
    ph, pw = padding
    if not (ph or pw):
        return dxp
    return np.ascontiguousarray(dxp[:, :, ph:dxp.shape[2] - ph, pw:dxp.shape[3] - pw])


def _is_fast_2x2(x_shape, pool, stride, padding) -> bool:
    return (tuple(pool) == (2, 2) and tuple(stride) == (2, 2) and tuple(padding) == (0, 0)
            and x_shape[2] % 2 == 0 and x_shape[3] % 2 == 0)


# -- max ----------------------------------------------------------------------------------
def maxpool2d_forward(x: np.ndarray, pool: Pair = (2, 2), stride: Pair | None = None,
                      padding: Pair = (0, 0)) -> tuple[np.ndarray, PoolCache]:
    """Max over (KH, KW) windows of NCHW x; returns y and the cache for backward."""
    stride = tuple(pool) if stride is None else tuple(stride)
    n, c, oh, ow = pool_output_shape(x.shape, pool, stride, padding)
    fast = compiled()
    if fast is not None and x.dtype.kind == "f" and pool[0] * pool[1] <= 256:
        y = np.empty((n, c, oh, ow), x.dtype)
        idx = np.empty((n, c, oh, ow), np.uint8)
        if tuple(pool) == (2, 2) and stride == (2, 2) and tuple(padding) == (0, 0):
            fast.maxpool2x2_forward(np.ascontiguousarray(x), y, idx)
        else:
            fast.maxpool_forward(np.ascontiguousarray(x), pool[0], pool[1], stride[0],
                                 stride[1], padding[0], padding[1], y, idx)
        return y, PoolCache(x.shape, tuple(pool), stride, tuple(padding), (idx,))
    if _is_fast_2x2(x.shape, pool, stride, padding):
        pairs = np.ascontiguousarray(x).reshape(-1, 2)           # neighbours along W
        left = np.greater_equal(pairs[:, 0], pairs[:, 1])         # ties go to the first
        rows = np.maximum(pairs[:, 0], pairs[:, 1]).reshape(n * c * oh, 2, ow)
        top = np.greater_equal(rows[:, 0], rows[:, 1])
        y = np.maximum(rows[:, 0], rows[:, 1]).reshape(n, c, oh, ow)
        return y, PoolCache(x.shape, tuple(pool), stride, tuple(padding), (left, top))
    xp = _padded(x, padding, -np.inf)
    y = idx = None
    for k, view in _windows(xp, pool, stride, oh, ow):
        if y is None:
            y = view.copy()
            idx = np.zeros(y.shape, np.uint8 if pool[0] * pool[1] <= 256 else np.int32)
            continue
        better = np.greater(view, y)                              # strict: first max wins
        np.copyto(idx, k, where=better, casting="unsafe")
        np.maximum(y, view, out=y)
    return y, PoolCache(x.shape, tuple(pool), stride, tuple(padding), (idx,))


def maxpool2d_backward(dy: np.ndarray, cache: PoolCache) -> np.ndarray:
    """dx of ``maxpool2d_forward``: each window's dy goes to its (first) maximum."""
    x_shape, pool, stride, padding, arrays = cache
    n, c, h, w = x_shape
    if len(arrays) == 2:
        left, top = arrays
        oh, ow = h // 2, w // 2
        dyr = dy.reshape(n * c * oh, ow)
        drow = np.empty((n * c * oh, 2, ow), dy.dtype)
        np.multiply(dyr, top, out=drow[:, 0])
        np.subtract(dyr, drow[:, 0], out=drow[:, 1])
        drow = drow.reshape(-1)
        dx = np.empty((drow.size, 2), dy.dtype)
        np.multiply(drow, left, out=dx[:, 0])
        np.subtract(drow, dx[:, 0], out=dx[:, 1])
        return dx.reshape(x_shape)
    (idx,) = arrays
    oh, ow = dy.shape[2:]
    fast = compiled()
    if fast is not None and dy.dtype.kind == "f" and idx.dtype == np.uint8:
        dx = np.empty(x_shape, dy.dtype)
        if pool == (2, 2) and stride == (2, 2) and tuple(padding) == (0, 0):
            fast.maxpool2x2_backward(np.ascontiguousarray(dy), idx, dx, np.zeros(1, dy.dtype))
            return dx
        fast.maxpool_backward(np.ascontiguousarray(dy), idx, pool[0], pool[1], stride[0],
                              stride[1], padding[0], padding[1], dx)
        return dx
    dxp = np.zeros((n, c, h + 2 * padding[0], w + 2 * padding[1]), dy.dtype)
    overlap = stride[0] < pool[0] or stride[1] < pool[1]
    for k, view in _windows(dxp, pool, stride, oh, ow):
        part = np.where(idx == k, dy, dy.dtype.type(0))
        if overlap:
            np.add(view, part, out=view)
        else:
            view[...] = part
    return _unpad(dxp, padding)


# -- average ------------------------------------------------------------------------------
def avgpool2d_forward(x: np.ndarray, pool: Pair = (2, 2), stride: Pair | None = None,
                      padding: Pair = (0, 0)) -> tuple[np.ndarray, PoolCache]:
    """Mean over (KH, KW) windows of NCHW x (padded zeros count); returns y and the cache."""
    stride = tuple(pool) if stride is None else tuple(stride)
    n, c, oh, ow = pool_output_shape(x.shape, pool, stride, padding)
    xp = _padded(x, padding, 0.0)
    y = None
    for _, view in _windows(xp, pool, stride, oh, ow):
        if y is None:
            y = view.copy()
        else:
            np.add(y, view, out=y)
    y *= y.dtype.type(1.0 / (pool[0] * pool[1]))
    return y, PoolCache(x.shape, tuple(pool), stride, tuple(padding), ())


def avgpool2d_backward(dy: np.ndarray, cache: PoolCache) -> np.ndarray:
    """dx of ``avgpool2d_forward``."""
    x_shape, pool, stride, padding, _ = cache
    n, c, h, w = x_shape
    oh, ow = dy.shape[2:]
    g = dy * dy.dtype.type(1.0 / (pool[0] * pool[1]))
    kh, kw = pool
    if tuple(stride) == tuple(pool) and padding == (0, 0) and h == oh * kh and w == ow * kw:
        dx = np.empty((n, c, oh, kh, ow, kw), dy.dtype)
        dx[...] = g[:, :, :, None, :, None]
        return dx.reshape(x_shape)
    dxp = np.zeros((n, c, h + 2 * padding[0], w + 2 * padding[1]), dy.dtype)
    for _, view in _windows(dxp, pool, stride, oh, ow):
        np.add(view, g, out=view)
    return _unpad(dxp, padding)


# -- global average -----------------------------------------------------------------------
def global_avgpool2d_forward(x: np.ndarray) -> np.ndarray:
    """Mean over H, W of NCHW x: (N, C, H, W) -> (N, C)."""
    n, c, h, w = x.shape
    y = np.add.reduce(x.reshape(n, c, h * w), axis=2)
    y *= y.dtype.type(1.0 / (x.shape[2] * x.shape[3]))
    return y


def global_avgpool2d_backward(dy: np.ndarray, x_shape) -> np.ndarray:
    """dx of ``global_avgpool2d_forward``: dy spread evenly over each H x W plane."""
    dx = np.empty(tuple(x_shape), dy.dtype)
    dx[...] = (dy * dy.dtype.type(1.0 / (x_shape[2] * x_shape[3])))[:, :, None, None]
    return dx
