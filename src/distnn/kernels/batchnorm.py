"""Batch-normalization math over the channel axis (axis 1) of (N, C) or (N, C, ...) arrays.

Statistics are per channel over every other axis. Training uses the biased batch variance
to normalize; the unbiased one is what a caller puts into its running variance.

For synchronized batch norm across processes the statistics travel as sums: ``bn_sums``
packs [sum(x), sum(x*x), count] into one float64 vector that can be added over ranks,
and ``bn_stats_from_sums`` turns the total back into mean and variance. The backward pass
likewise needs only the two per-channel sums of ``bn_grad_sums`` (add them over ranks for
the synchronized version) and the global count.
"""
from __future__ import annotations

import math

import numpy as np

from .backend import compiled


def _compiled_for(x: np.ndarray):
    """The compiled batch-norm loops (``_numba_bn``) when the compiled backend is selected
    and x is a C-contiguous float array."""
    if compiled() is None or x.ndim < 2 or not x.flags.c_contiguous or x.dtype.kind != "f":
        return None
    from . import _numba_bn
    return _numba_bn


def _by_channel(x: np.ndarray) -> np.ndarray:
    """x as (N, C, rest) so that reductions run over contiguous runs."""
    return x.reshape(x.shape[0], x.shape[1], math.prod(x.shape[2:]))


def _bshape(x: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Per-channel vector v shaped to broadcast against x."""
    return v.reshape((1, -1) + (1,) * (x.ndim - 2)).astype(x.dtype, copy=False)


def channel_count(x: np.ndarray) -> int:
    """Values per channel: N * prod(spatial)."""
    return int(x.size // x.shape[1]) if x.shape[1] else 0


def channel_sum(x: np.ndarray) -> np.ndarray:
    """Per-channel sum over all axes but 1."""
    if x.ndim == 2:
        return x.sum(axis=0)
    return np.einsum("ncp->c", _by_channel(x))


def channel_dot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per-channel sum of a * b over all axes but 1, without a temporary of a's size."""
    if a.ndim == 2:
        return np.einsum("nc,nc->c", a, b)
    return np.einsum("ncp,ncp->c", _by_channel(a), _by_channel(b))


def bn_batch_stats(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel mean and biased variance (two passes, for accuracy), in x's dtype;
    zeros for an empty batch."""
    n = max(channel_count(x), 1)
    mean = channel_sum(x) / x.dtype.type(n)
    xc = x - _bshape(x, mean)
    var = channel_dot(xc, xc) / x.dtype.type(n)
    return mean, var


def bn_sums(x: np.ndarray) -> np.ndarray:
    """[sum(x) (C), sum(x*x) (C), count (1)] per channel, packed in one float64 vector."""
    c = x.shape[1]
    out = np.empty(2 * c + 1, np.float64)
    out[:c] = channel_sum(x)
    out[c:2 * c] = channel_dot(x, x)
    out[2 * c] = channel_count(x)
    return out


def bn_stats_from_sums(sums: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """Mean, biased variance (float64) and count from (possibly rank-summed) ``bn_sums``."""
    c = (sums.size - 1) // 2
    count = int(round(float(sums[2 * c])))
    mean = sums[:c] / max(count, 1)
    var = np.maximum(sums[c:2 * c] / max(count, 1) - mean * mean, 0.0)
    return mean, var, count


def bn_xhat(x: np.ndarray, mean: np.ndarray, var: np.ndarray,
            eps: float) -> tuple[np.ndarray, np.ndarray]:
    """xhat = (x - mean) / sqrt(var + eps) (a new array) and invstd per channel, in x's dtype."""
    dt = x.dtype
    invstd = (1.0 / np.sqrt(np.asarray(var, np.float64) + eps)).astype(dt)
    xhat = np.subtract(x, _bshape(x, np.asarray(mean)))
    xhat *= _bshape(x, invstd)
    return xhat, invstd


def bn_normalize(x: np.ndarray, mean: np.ndarray, var: np.ndarray, gamma: np.ndarray,
                 beta: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """y = gamma * xhat + beta with xhat = (x - mean) / sqrt(var + eps).

    Returns (y, xhat, invstd); invstd is per channel in x's dtype.
    """
    xhat, invstd = bn_xhat(x, mean, var, eps)
    y = np.multiply(xhat, _bshape(x, gamma))
    y += _bshape(x, beta)
    return y, xhat, invstd


def _xhat_out(xhat_out: np.ndarray | None, x: np.ndarray, keep: bool):
    """(the array the compiled forward writes xhat into, what it returns as xhat): an empty
    one and None when xhat is not kept."""
    if not keep:
        return np.empty((0, 0, 0), x.dtype), None
    xhat = _out(xhat_out, x)
    return _by_channel(xhat), xhat


def _compiled_forward_train(kernel, x, gamma, beta, eps, out, xhat_out, keep_xhat):
    """A compiled training forward (``bn_forward_train``'s or its fused ReLU's kernel) into
    y, xhat and float64 statistics; (y, xhat, mean, var, invstd) in x's dtype."""
    c = x.shape[1]
    y = _out(out, x)
    hx, xhat = _xhat_out(xhat_out, x, keep_xhat)
    mean, var, invstd = (np.empty(c, np.float64) for _ in range(3))
    kernel(_by_channel(x), np.ascontiguousarray(gamma, x.dtype),
           np.ascontiguousarray(beta, x.dtype), float(eps), _by_channel(y), hx, mean, var,
           invstd)
    dt = x.dtype
    return y, xhat, mean.astype(dt), var.astype(dt), invstd.astype(dt)


def bn_forward_train(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float,
                     out: np.ndarray | None = None, xhat_out: np.ndarray | None = None,
                     keep_xhat: bool = True
                     ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray, np.ndarray,
                                np.ndarray]:
    """Training-mode batch norm with this batch's statistics, centring x only once.

    Returns (y, xhat, mean, var, invstd); var is the biased batch variance.
    ``out`` / ``xhat_out``: arrays the compiled path writes y / xhat into when they fit.
    ``keep_xhat=False``: the compiled path does not write xhat and returns None for it;
    ``bn_backward`` then recomputes it from x, mean and invstd (one array fewer written).
    """
    fast = _compiled_for(x)
    if fast is not None:
        return _compiled_forward_train(fast.bn_forward_train, x, gamma, beta, eps, out,
                                       xhat_out, keep_xhat)
    n = max(channel_count(x), 1)
    mean = channel_sum(x) / x.dtype.type(n)
    xhat = np.subtract(x, _bshape(x, mean))
    var = channel_dot(xhat, xhat) / x.dtype.type(n)
    invstd = (1.0 / np.sqrt(var.astype(np.float64) + eps)).astype(x.dtype)
    xhat *= _bshape(x, invstd)
    y = np.multiply(xhat, _bshape(x, gamma))
    y += _bshape(x, beta)
    return y, xhat, mean, var, invstd


def bn_inference(x: np.ndarray, mean: np.ndarray, var: np.ndarray, gamma: np.ndarray,
                 beta: np.ndarray, eps: float) -> np.ndarray:
    """y with fixed (running) statistics, as one scale and shift per channel."""
    invstd = 1.0 / np.sqrt(np.asarray(var, np.float64) + eps)
    scale = np.asarray(gamma, np.float64) * invstd
    shift = np.asarray(beta, np.float64) - np.asarray(mean, np.float64) * scale
    fast = _compiled_for(x)
    if fast is not None:
        y = np.empty_like(x)
        fast.scale_shift(_by_channel(x), scale.astype(x.dtype), shift.astype(x.dtype),
                         _by_channel(y))
        return y
    y = np.multiply(x, _bshape(x, scale))
    y += _bshape(x, shift)
    return y


def bn_grad_sums(dy: np.ndarray, xhat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel sum(dy) (= dbeta) and sum(dy * xhat) (= dgamma)."""
    fast = _compiled_for(dy)
    if fast is not None and xhat.flags.c_contiguous and xhat.dtype == dy.dtype:
        c = dy.shape[1]
        sums = np.empty((2, c), np.float64)
        fast.bn_grad_sums(_by_channel(dy), _by_channel(xhat), sums[0], sums[1])
        return sums[0].astype(dy.dtype), sums[1].astype(dy.dtype)
    return channel_sum(dy), channel_dot(dy, xhat)


def bn_backward_dx(dy: np.ndarray, xhat: np.ndarray, gamma: np.ndarray, invstd: np.ndarray,
                   sum_dy: np.ndarray, sum_dy_xhat: np.ndarray, count: int,
                   out: np.ndarray | None = None) -> np.ndarray:
    """dx of training-mode batch norm, given the (global) sums and count:
    dx = gamma * invstd * (dy - sum_dy / count - xhat * sum_dy_xhat / count).
    ``out``: an array the compiled path writes dx into when it fits."""
    dt = dy.dtype
    count = max(count, 1)
    g = np.asarray(gamma, np.float64) * np.asarray(invstd, np.float64)
    a = g                                                   # coefficient of dy
    b = -g * np.asarray(sum_dy_xhat, np.float64) / count    # coefficient of xhat
    c = -g * np.asarray(sum_dy, np.float64) / count         # constant
    fast = _compiled_for(dy)
    if fast is not None and xhat.flags.c_contiguous and xhat.dtype == dt:
        dx = _out(out, dy)
        fast.bn_backward_dx(_by_channel(dy), _by_channel(xhat), a.astype(dt), b.astype(dt),
                            c.astype(dt), _by_channel(dx))
        return dx
    dx = np.multiply(dy, _bshape(dy, a.astype(dt)))
    tmp = np.multiply(xhat, _bshape(dy, b.astype(dt)))
    dx += tmp
    dx += _bshape(dy, c.astype(dt))
    return dx


def bn_backward_dx_inference(dy: np.ndarray, gamma: np.ndarray, var: np.ndarray,
                             eps: float) -> np.ndarray:
    """dx of ``bn_inference`` (statistics are constants there)."""
    scale = np.asarray(gamma, np.float64) / np.sqrt(np.asarray(var, np.float64) + eps)
    return np.multiply(dy, _bshape(dy, scale))


# -- batch norm fused with the ReLU after it ---------------------------------------------
# y = max(bn(x), 0) in one pass; backward recomputes the ReLU mask gamma * xhat + beta > 0
# from the xhat it reads anyway. The compiled kernels run the loops of the unfused ones
# with dy masked; the NumPy path is the unfused reference plus the mask.

def _fused_for(x: np.ndarray, *others: np.ndarray):
    """The compiled fused kernels when selected and every array is C-contiguous of x's
    dtype and shape."""
    if not all(o.flags.c_contiguous and o.dtype == x.dtype and o.shape == x.shape
               for o in others):
        return None
    return _compiled_for(x)


def _out(out: np.ndarray | None, like: np.ndarray) -> np.ndarray:
    """``out`` when it can hold the result (C-contiguous, like's shape and dtype), else a
    new array."""
    if (out is not None and out.shape == like.shape and out.dtype == like.dtype
            and out.flags.c_contiguous and out is not like):
        return out
    return np.empty_like(like)


def relu_mask(dy: np.ndarray, y: np.ndarray) -> np.ndarray:
    """dy where y > 0, else 0 (a new array): the ReLU backward given its output y."""
    return dy * (y > 0)


def bn_relu_forward_train(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float,
                          out: np.ndarray | None = None, xhat_out: np.ndarray | None = None,
                          keep_xhat: bool = True
                          ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray, np.ndarray,
                                     np.ndarray]:
    """``bn_forward_train`` followed by ReLU: returns (max(y, 0), xhat, mean, var, invstd).
    ``out`` / ``xhat_out``: arrays to write y / xhat into when they fit (reused buffers);
    ``keep_xhat`` as ``bn_forward_train``'s."""
    fast = _fused_for(x)
    if fast is None:
        y, xhat, mean, var, invstd = bn_forward_train(x, gamma, beta, eps)
        np.maximum(y, 0, out=y)
        return y, xhat, mean, var, invstd
    return _compiled_forward_train(fast.bn_relu_forward_train, x, gamma, beta, eps, out,
                                   xhat_out, keep_xhat)


def bn_add_relu_forward_train(x: np.ndarray, r: np.ndarray, gamma: np.ndarray,
                              beta: np.ndarray, eps: float):
    """(max(bn(x) + r, 0), mean, var, invstd) in one compiled pass, bn as
    ``bn_forward_train``'s with keep_xhat=False and the same bits as the three steps apart;
    None where the compiled fused kernels do not take x and r (the caller runs them apart)."""
    fast = _fused_for(x, r)
    if fast is None:
        return None
    c = x.shape[1]
    y = np.empty_like(x)
    mean, var, invstd = (np.empty(c, np.float64) for _ in range(3))
    fast.bn_add_relu_forward_train(_by_channel(x), _by_channel(r),
                                   np.ascontiguousarray(gamma, x.dtype),
                                   np.ascontiguousarray(beta, x.dtype), float(eps),
                                   _by_channel(y), np.empty((0, 0, 0), x.dtype), mean, var,
                                   invstd)
    dt = x.dtype
    return y, mean.astype(dt), var.astype(dt), invstd.astype(dt)


def bn_relu_inference(x: np.ndarray, mean: np.ndarray, var: np.ndarray, gamma: np.ndarray,
                      beta: np.ndarray, eps: float) -> np.ndarray:
    """max(``bn_inference``(...), 0) in one pass."""
    fast = _fused_for(x)
    if fast is None:
        y = bn_inference(x, mean, var, gamma, beta, eps)
        np.maximum(y, 0, out=y)
        return y
    invstd = 1.0 / np.sqrt(np.asarray(var, np.float64) + eps)
    scale = np.asarray(gamma, np.float64) * invstd
    shift = np.asarray(beta, np.float64) - np.asarray(mean, np.float64) * scale
    y = np.empty_like(x)
    fast.scale_shift_relu(_by_channel(x), scale.astype(x.dtype), shift.astype(x.dtype),
                          _by_channel(y))
    return y


def _bn_relu_mask(dy, xhat, gamma, beta):
    """dy where gamma * xhat + beta > 0 (the fused forward's y > 0), else 0 (NumPy)."""
    pre = np.multiply(xhat, _bshape(xhat, np.asarray(gamma)))
    pre += _bshape(xhat, np.asarray(beta))
    return dy * (pre > 0)


def bn_relu_grad_sums(dy: np.ndarray, xhat: np.ndarray, gamma: np.ndarray, beta: np.ndarray
                      ) -> tuple[np.ndarray, np.ndarray]:
    """``bn_grad_sums`` of the ReLU-masked dy. The mask is recomputed from xhat as the
    forward computed y (gamma * xhat + beta > 0: the same operations and rounding), so the
    backward reads no saved output."""
    fast = _fused_for(dy, xhat)
    if fast is None:
        return bn_grad_sums(_bn_relu_mask(dy, xhat, gamma, beta), xhat)
    sums = np.empty((2, dy.shape[1]), np.float64)
    fast.bn_relu_grad_sums(_by_channel(dy), _by_channel(xhat),
                           np.ascontiguousarray(gamma, dy.dtype),
                           np.ascontiguousarray(beta, dy.dtype), sums[0], sums[1])
    return sums[0].astype(dy.dtype), sums[1].astype(dy.dtype)


def bn_relu_backward_dx(dy: np.ndarray, xhat: np.ndarray, gamma: np.ndarray,
                        beta: np.ndarray, invstd: np.ndarray, sum_dy: np.ndarray,
                        sum_dy_xhat: np.ndarray, count: int, out: np.ndarray | None = None
                        ) -> np.ndarray:
    """``bn_backward_dx`` of the ReLU-masked dy (mask as in ``bn_relu_grad_sums``); the
    sums are ``bn_relu_grad_sums``'s. ``out``: an array to write dx into when it fits."""
    fast = _fused_for(dy, xhat)
    if fast is None:
        return bn_backward_dx(_bn_relu_mask(dy, xhat, gamma, beta), xhat, gamma, invstd,
                              sum_dy, sum_dy_xhat, count)
    dt = dy.dtype
    count = max(count, 1)
    g = np.asarray(gamma, np.float64) * np.asarray(invstd, np.float64)
    b = -g * np.asarray(sum_dy_xhat, np.float64) / count
    c = -g * np.asarray(sum_dy, np.float64) / count
    dx = _out(out, dy)
    fast.bn_relu_backward_dx(_by_channel(dy), _by_channel(xhat),
                             np.ascontiguousarray(gamma, dt), np.ascontiguousarray(beta, dt),
                             g.astype(dt), b.astype(dt), c.astype(dt), _by_channel(dx))
    return dx


def bn_backward(dy: np.ndarray, xhat: np.ndarray | None, gamma: np.ndarray,
                beta: np.ndarray, invstd: np.ndarray, count: int, relu: bool = False,
                out: np.ndarray | None = None, x: np.ndarray | None = None,
                mean: np.ndarray | None = None
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(sum_dy, sum_dy_xhat, dx) of training-mode batch norm (followed by ReLU when
    ``relu``) whose statistics are this batch's alone (no sums across ranks to wait for):
    ``bn(_relu)_grad_sums`` then ``bn(_relu)_backward_dx``, on the compiled path in one
    kernel that reads each channel's dy and xhat a second time from cache. The sums are in
    dy's dtype (float64 sums rounded); ``out``: an array to write dx into when it fits.
    ``xhat=None`` (a forward with ``keep_xhat=False``): xhat is recomputed from ``x`` and
    the forward's ``mean`` and ``invstd``, to the forward's bits."""
    centre = xhat is None
    if centre:
        if x is None or mean is None:
            raise ValueError("bn_backward: without xhat, pass the forward's x and mean")
        fast = _fused_for(dy, x)
        if fast is None:  # the forward's NumPy rounding: (x - mean) * invstd
            xhat = np.subtract(x, _bshape(x, mean))
            xhat *= _bshape(x, invstd)
            return bn_backward(dy, xhat, gamma, beta, invstd, count, relu, out)
    else:
        fast = _fused_for(dy, xhat)
    if fast is None:
        if relu:
            sums = bn_relu_grad_sums(dy, xhat, gamma, beta)
            dx = bn_relu_backward_dx(dy, xhat, gamma, beta, invstd, *sums, count, out=out)
        else:
            sums = bn_grad_sums(dy, xhat)
            dx = bn_backward_dx(dy, xhat, gamma, invstd, *sums, count, out=out)
        return sums[0], sums[1], dx
    dt = dy.dtype
    sums = np.empty((2, dy.shape[1]), np.float64)
    dx = _out(out, dy)
    invstd = np.ascontiguousarray(invstd, dt)
    fast.bn_backward(_by_channel(dy), _by_channel(x if centre else xhat),
                     np.ascontiguousarray(mean, dt) if centre else invstd,
                     np.ascontiguousarray(gamma, dt), np.ascontiguousarray(beta, dt), invstd,
                     float(max(count, 1)), bool(relu), centre, sums[0], sums[1],
                     _by_channel(dx))
    return sums[0].astype(dt), sums[1].astype(dt), dx
