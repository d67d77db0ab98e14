"""Compiled batch norm over axis 1 of (N, C, S) arrays: the per-channel statistics, the
training forward, the gradient sums and dx, and the inference scale-and-shift (numba,
``parallel=True`` with ``_numba_runtime``'s dispatch, as ``_numba``'s other loops). The
backend reaches them through ``_numba``; ``_numba_bnrelu`` fuses the ReLU after them.
"""
from __future__ import annotations

import numpy as np

from ._numba_runtime import _U, _dispatch, _jit, channels, nb
from ._threads import pieces


# -- batch norm over axis 1 of (N, C, S) ------------------------------------------------
# Reassociation only (no FMA contraction), for the float64 sums. The forwards' loops that
# write xhat and y = gamma * xhat + beta carry no fast-math flag at all (``_jit``), and
# take their statistics from ``channel_stats`` as a call of its own (the flags are per
# instruction, also once LLVM inlines it): with reassociation LLVM computed y as
# (x - mean) * (invstd * gamma) + beta, which rounds otherwise than gamma * xhat + beta
# from the stored xhat, from which _numba_bnrelu's backward recomputes the ReLU mask
# (values at the kink were ~1e-7 above 0 forward and masked off backward).
_jit_bn = nb.njit(parallel=True, cache=True, nogil=True, fastmath={"reassoc"})


@nb.njit(cache=True, nogil=True, fastmath={"reassoc"})
def channel_stats(xf, c, n_, c_, s_, eps):
    """(mean, biased variance, 1/sqrt(var + eps)) of channel c of a flat (N, C, S) array
    from one read: float64 sums of x - x0 and its square, x0 = the channel's first value,
    so that the variance cancels only against the data's own spread."""
    cnt = max(n_ * s_, 1)
    x0 = np.float64(xf[_U(c * s_)]) if n_ * s_ > 0 else 0.0
    acc = 0.0
    acc2 = 0.0
    for n in range(n_):
        b = (n * c_ + c) * s_
        for k in range(s_):
            d = xf[_U(b + k)] - x0
            acc += d
            acc2 += d * d
    dm = acc / cnt
    v = max(acc2 / cnt - dm * dm, 0.0)
    return x0 + dm, v, 1.0 / np.sqrt(v + eps)


@nb.njit(cache=True, nogil=True)
def channel_forward(x, r, y, xhat, c, eps, gamma, beta, mean, var, invstd, add, relu):
    """The training forward of channel c of (N, C, S) arrays: its statistics (one
    ``channel_stats`` call, into mean, var and invstd), then xhat = (x - mean) * invstd
    (written where xhat is not empty) and y = gamma * xhat + beta, + r with ``add``,
    max(., 0) with ``relu`` (NaN stays NaN), in one pass. No fast-math flag: the forward
    kernels of ``_numba_bn`` and ``_numba_bnrelu`` all round this one loop alike."""
    n_, c_, s_ = x.shape
    xf = x.ravel()
    rf = r.ravel()
    yf = y.ravel()
    hf = xhat.ravel()
    m, v, inv = channel_stats(xf, c, n_, c_, s_, eps)
    mean[c] = m
    var[c] = v
    invstd[c] = inv
    mx = xf.dtype.type(m)
    ix = xf.dtype.type(inv)
    g = gamma[c]
    bb = beta[c]
    z = xf.dtype.type(0)
    keep = hf.size > 0
    for n in range(n_):
        b = (n * c_ + c) * s_
        for k in range(s_):
            h = (xf[_U(b + k)] - mx) * ix
            if keep:
                hf[_U(b + k)] = h
            o = h * g + bb
            if add:
                o = o + rf[_U(b + k)]
            if relu:
                o = z if o <= z else o
            yf[_U(b + k)] = o


@_jit
def bn_forward_train(x, gamma, beta, eps, y, xhat, mean, var, invstd, lo, hi):
    """Per-channel mean and biased variance from one read of x (float64 sums of x - x0
    and (x - x0)^2, x0 the channel's first value: 35-40% less time than a pass for the mean
    and one for the centred squares, measured), then xhat = (x - mean) * invstd and
    y = gamma * xhat + beta in one pass (``channel_forward``); channels lo to hi
    (``_dispatch``'s split). An empty xhat is not written (backward then recomputes it from
    x: ``_numba_bnrelu``)."""
    for c in nb.prange(lo, hi):
        channel_forward(x, x, y, xhat, c, eps, gamma, beta, mean, var, invstd, False, False)


@_jit_bn
def bn_grad_sums(dy, xhat, sum_dy, sum_dy_xhat):
    """Per-channel sum(dy) and sum(dy * xhat), float64 accumulators."""
    n_, c_, s_ = dy.shape
    df = dy.ravel()
    hf = xhat.ravel()
    for c in nb.prange(c_):
        a = 0.0
        b2 = 0.0
        for n in range(n_):
            b = (n * c_ + c) * s_
            for k in range(s_):
                d = df[_U(b + k)]
                a += d
                b2 += d * hf[_U(b + k)]
        sum_dy[c] = a
        sum_dy_xhat[c] = b2


@_jit
def bn_backward_dx(dy, xhat, ca, cb, cc, dx):
    """dx = ca[c] * dy + cb[c] * xhat + cc[c] over (N, C, S)."""
    n_, c_, s_ = dy.shape
    df = dy.ravel()
    hf = xhat.ravel()
    xf = dx.ravel()
    for t in nb.prange(n_ * c_):
        c = t % c_
        a = ca[c]
        b2 = cb[c]
        k0 = cc[c]
        b = t * s_
        for k in range(s_):
            xf[_U(b + k)] = a * df[_U(b + k)] + b2 * hf[_U(b + k)] + k0


@nb.njit(cache=True, nogil=True)
def row_scale_shift(x, y, t, scale, shift, relu):
    """y = x * scale[c] + shift[c] over row t = (sample, channel c) of (N, C, S) arrays,
    max(., 0) with ``relu`` (NaN stays NaN): ``scale_shift``'s and
    ``_numba_bnrelu.scale_shift_relu``'s loop."""
    _, c_, s_ = x.shape
    xf = x.ravel()
    yf = y.ravel()
    c = t % c_
    a = scale[c]
    b2 = shift[c]
    b = t * s_
    z = xf.dtype.type(0)
    for k in range(s_):
        o = xf[_U(b + k)] * a + b2
        if relu:
            o = z if o <= z else o
        yf[_U(b + k)] = o


@_jit
def scale_shift(x, scale, shift, y):
    """y = x * scale[c] + shift[c] over (N, C, S)."""
    for t in nb.prange(x.shape[0] * x.shape[1]):
        row_scale_shift(x, y, t, scale, shift, False)


for _name in ("bn_grad_sums", "bn_backward_dx", "scale_shift"):
    globals()[_name] = _dispatch(globals()[_name])
bn_forward_train = _dispatch(bn_forward_train, split=channels, pieces=pieces)
