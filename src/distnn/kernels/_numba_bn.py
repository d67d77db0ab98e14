"""Compiled batch norm over axis 1 of (N, C, S) arrays: the per-channel statistics, the
training forward, the gradient sums and dx, and the inference scale-and-shift (numba,
``parallel=True`` with ``_numba_runtime``'s dispatch, as ``_numba``'s other loops), and
the same fused with the ReLU after them (below). ``batchnorm`` calls them.

Fused with the ReLU: one pass writes y = max(gamma * xhat + beta, 0) where batch norm and
ReLU apart write and read the normalized array twice. Backward recomputes the ReLU mask
gamma * xhat + beta > 0 from the xhat it reads anyway (no FMA contraction in either kernel,
so it rounds as the forward did) instead of reading the saved output or making a masked copy
of dy: 1.7-2x faster than reading y as a third stream (64x16x32x32 float32, cold cache: 0.37
vs 0.62 ms; ReLU + batch norm apart 0.76 ms). The loops and accumulation orders are the
unfused kernels' with dy replaced by the masked dy, so fused and unfused results agree
(float64: to the last bit in the tests). Dispatch (serial at 1 thread, ``prange`` over
channels or (sample, channel) rows with more) is ``_numba_runtime``'s.
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
# from the stored xhat, from which the fused backward recomputes the ReLU mask
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
    kernels here, fused or not, all round this one loop alike."""
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
    x: the fused ones)."""
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
    ``scale_shift_relu``'s loop."""
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


# -- fused with the ReLU after it -------------------------------------------------------
@_jit
def bn_relu_forward_train(x, gamma, beta, eps, y, xhat, mean, var, invstd, lo, hi):
    """``bn_forward_train`` with y = max(gamma * xhat + beta, 0), channels lo to hi."""
    # an empty xhat: not kept (``bn_backward`` recomputes it from x)
    for c in nb.prange(lo, hi):
        channel_forward(x, x, y, xhat, c, eps, gamma, beta, mean, var, invstd, False, True)


@_jit
def bn_add_relu_forward_train(x, r, gamma, beta, eps, y, xhat, mean, var, invstd, lo, hi):
    """``bn_forward_train`` with y = max(gamma * xhat + beta + r, 0): a residual
    branch's last batch norm, the sum with the other branch's output r and the ReLU after
    it in one pass, rounded as the three apart (no FMA contraction); channels lo to hi."""
    for c in nb.prange(lo, hi):
        channel_forward(x, r, y, xhat, c, eps, gamma, beta, mean, var, invstd, True, True)


@_jit
def scale_shift_relu(x, scale, shift, y):
    """y = max(x * scale[c] + shift[c], 0) over (N, C, S) (batch norm in inference)."""
    for t in nb.prange(x.shape[0] * x.shape[1]):
        row_scale_shift(x, y, t, scale, shift, True)


# -- backward: the per-channel loops of the kernels below (one loop for every mask)
@nb.njit(cache=True, nogil=True, inline="always")
def _xhat(hf, i, mx, ix, centre):
    """xhat at flat index i: hf[i], or with ``centre`` (hf is then x) (x - mean) * invstd
    rounded as the forward rounded it (mx, ix: the mean and invstd in x's dtype)."""
    return (hf[i] - mx) * ix if centre else hf[i]


@nb.njit(cache=True, nogil=True, fastmath={"reassoc"})
def _channel_sums(df, hf, c, n_, c_, s_, g, bb, thr, mx, ix, centre):
    """(sum(dy'), sum(dy' * xhat)) of channel c in float64, dy' = dy where g * xhat + bb >
    thr, else 0: thr = 0 is ``bn_relu_grad_sums``'s mask, -inf none (the same loop for
    both, vectorized alike: a batch norm fused with its ReLU and one followed by a ReLU
    layer give the same sums). d is float64, so d * xhat is exact before it is summed.
    xhat as ``_xhat`` gives it."""
    a = 0.0
    b2 = 0.0
    for n in range(n_):
        b = (n * c_ + c) * s_
        for k in range(s_):
            h = _xhat(hf, _U(b + k), mx, ix, centre)
            d = df[_U(b + k)] if h * g + bb > thr else df[_U(b + k)] * 0
            a += d
            b2 += d * h
    return a, b2


@nb.njit(cache=True, nogil=True)
def _channel_dx(df, hf, xf, c, n_, c_, s_, g, bb, ca, cb, cc, thr, mx, ix, centre):
    """dx = ca * dy' + cb * xhat + cc over channel c, dy' as in ``_channel_sums`` (thr in
    dy's dtype; no fast-math: it rounds as ``bn_relu_backward_dx`` and
    ``bn_backward_dx`` do)."""
    z = df.dtype.type(0)
    for n in range(n_):
        b = (n * c_ + c) * s_
        for k in range(s_):
            h = _xhat(hf, _U(b + k), mx, ix, centre)
            d = df[_U(b + k)] if h * g + bb > thr else df[_U(b + k)] * z
            xf[_U(b + k)] = ca * d + cb * h + cc


@_jit_bn
def bn_relu_grad_sums(dy, xhat, gamma, beta, sum_dy, sum_dy_xhat):
    """Per-channel sum(dy') and sum(dy' * xhat) with dy' = dy where the forward's
    gamma * xhat + beta > 0, else 0 (the mask recomputed from xhat: no read of y)."""
    n_, c_, s_ = dy.shape
    df = dy.ravel()
    hf = xhat.ravel()
    one = dy.dtype.type(1)
    for c in nb.prange(c_):
        a, b2 = _channel_sums(df, hf, c, n_, c_, s_, gamma[c], beta[c], 0.0, one, one,
                              False)
        sum_dy[c] = a
        sum_dy_xhat[c] = b2


@_jit
def bn_relu_backward_dx(dy, xhat, gamma, beta, ca, cb, cc, dx):
    """dx = ca[c] * dy' + cb[c] * xhat + cc[c] with dy' as in ``bn_relu_grad_sums``."""
    n_, c_, s_ = dy.shape
    df = dy.ravel()
    hf = xhat.ravel()
    xf = dx.ravel()
    z = dy.dtype.type(0)
    one = dy.dtype.type(1)
    for c in nb.prange(c_):
        _channel_dx(df, hf, xf, c, n_, c_, s_, gamma[c], beta[c], ca[c], cb[c], cc[c], z,
                    one, one, False)


@_jit
def bn_backward(dy, xhat, mean, gamma, beta, invstd, count, relu, centre, sum_dy,
                sum_dy_xhat, dx, lo, hi):
    """The batch-norm backward of one process's batch (no sums across ranks) in one kernel:
    per channel the sums (float64, into sum_dy and sum_dy_xhat), then dx from them with the
    coefficients ``batchnorm.bn_backward_dx`` computes (float64 from the sums rounded to
    dy's dtype, then rounded), while the channel's dy and xhat are still in cache: the
    second read comes from L2/L3 instead of memory (64x16x32x32 float32, 1 thread, AVX2
    host: 1.9 ms against 2.5 for the sums and dx apart). ``relu``: of the ReLU-masked dy
    (mask as ``bn_relu_grad_sums``). ``centre``: xhat is x, and xhat is recomputed from it
    with mean and invstd (as ``_xhat``: the forward's bits), so that forward need not write
    xhat (``bn_relu_forward_train`` with an empty xhat: 64x16x32x32 float32, 1 thread,
    0.56 against 0.93 ms; backward the same time). Channels lo to hi (``_dispatch``'s
    split)."""
    n_, c_, s_ = dy.shape
    df = dy.ravel()
    hf = xhat.ravel()
    xf = dx.ravel()
    dt = dy.dtype.type
    thr = 0.0 if relu else -np.inf
    for c in nb.prange(lo, hi):
        g = gamma[c]
        bb = beta[c]
        mx = mean[c] if centre else dt(0)
        ix = invstd[c]
        a, b2 = _channel_sums(df, hf, c, n_, c_, s_, g, bb, thr, mx, ix, centre)
        sum_dy[c] = a
        sum_dy_xhat[c] = b2
        gi = np.float64(g) * np.float64(ix)
        _channel_dx(df, hf, xf, c, n_, c_, s_, g, bb, dt(gi),
                    dt(-gi * np.float64(dt(b2)) / count), dt(-gi * np.float64(dt(a)) / count),
                    dt(thr), mx, ix, centre)


for _name in ("scale_shift_relu", "bn_relu_grad_sums", "bn_relu_backward_dx"):
    globals()[_name] = _dispatch(globals()[_name])
for _name in ("bn_relu_forward_train", "bn_add_relu_forward_train", "bn_backward"):
    globals()[_name] = _dispatch(globals()[_name], split=channels, pieces=pieces)
