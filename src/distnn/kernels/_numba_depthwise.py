"""Compiled depthwise convolution (numba): forward, backward-data and backward-weights by
direct loops over NCHW planes, for ``grouped.py``'s depthwise layers (groups == C, F = m*C
filters of one input channel each, w (F, 1, KH, KW)).

No padded copy and no columns: for every kernel tap the range of output columns whose input
column lies inside the image is computed once per row (``_valid_q``), so the inner loop is
a bound-free, unit-stride (for stride 1) multiply-add that LLVM vectorizes. Each parallel
iteration owns one output plane (forward: a sample and filter; backward-data: a sample and
input channel; backward-weights: a filter, summed over the batch in a fixed order), so
every thread count gives the same bits. With one thread ``_dispatch`` runs the serial twin
in the caller's thread.
"""
from __future__ import annotations

import numpy as np

from ._numba_runtime import _U, _dispatch, _jit, _jit_sums, _valid_q, nb


@nb.njit(cache=True, nogil=True)
def _plane_taps(y, yb, x, xb, w, f, sh, sw, pt, pl, dh, dw, adjoint):
    """Every kernel tap of filter f of w (F, 1, KH, KW) between the output plane at flat
    index yb of y (N, F, OH, OW) and the input plane at flat index xb of x (N, C, H, W):
    y += w * x (``_forward``), or with ``adjoint`` x += w * y (``_backward_data``), tap by
    tap and row by row, over the output rows and columns whose input row and column are
    inside the image (``_valid_q``)."""
    h_, w_ = x.shape[2], x.shape[3]
    kh, kw = w.shape[2], w.shape[3]
    oh, ow = y.shape[2], y.shape[3]
    xf = x.ravel()
    yf = y.ravel()
    wf = w.ravel()
    for i in range(kh):
        for j in range(kw):
            off = j * dw - pl
            q0, q1 = _valid_q(ow, sw, off, w_)
            wv = wf[_U((f * kh + i) * kw + j)]
            p0, p1 = _valid_q(oh, sh, i * dh - pt, h_)  # rows inside the image
            for p in range(p0, p1):
                d = yb + p * ow
                s = xb + (p * sh + i * dh - pt) * w_ + off
                if adjoint and sw == 1:
                    for q in range(q0, q1):
                        xf[_U(s + q)] += wv * yf[_U(d + q)]
                elif adjoint:
                    for q in range(q0, q1):
                        xf[_U(s + q * sw)] += wv * yf[_U(d + q)]
                elif sw == 1:
                    for q in range(q0, q1):
                        yf[_U(d + q)] += wv * xf[_U(s + q)]
                else:
                    for q in range(q0, q1):
                        yf[_U(d + q)] += wv * xf[_U(s + q * sw)]


@_jit
def _forward(x, w, b, use_b, sh, sw, pt, pl, dh, dw, y):
    """y (N, F, OH, OW) = depthwise conv of x (N, C, H, W) by w (F, 1, KH, KW) (+ b)."""
    n_, c_, h_, w_ = x.shape
    f_ = w.shape[0]
    plane = y.shape[2] * y.shape[3]
    yf = y.ravel()
    for t in nb.prange(n_ * f_):
        n = t // f_
        f = t % f_
        b0 = b[f] if use_b else 0.0
        for k in range(plane):
            yf[_U(t * plane + k)] = b0
        _plane_taps(y, t * plane, x, (n * c_ + f // (f_ // c_)) * h_ * w_, w, f, sh, sw, pt,
                    pl, dh, dw, False)


@_jit
def _backward_data(dy, w, sh, sw, pt, pl, dh, dw, dx):
    """dx (N, C, H, W) = the adjoint of ``_forward`` applied to dy (N, F, OH, OW)."""
    c_ = dx.shape[1]
    plane = dx.shape[2] * dx.shape[3]
    f_ = dy.shape[1]
    m = f_ // c_
    df = dx.ravel()
    for t in nb.prange(dx.shape[0] * c_):
        for k in range(plane):
            df[_U(t * plane + k)] = 0
        for f in range(t % c_ * m, t % c_ * m + m):
            _plane_taps(dy, (t // c_ * f_ + f) * dy.shape[2] * dy.shape[3], dx, t * plane, w,
                        f, sh, sw, pt, pl, dh, dw, True)


@_jit_sums
def _backward_weights(dy, x, sh, sw, pt, pl, dh, dw, use_db, dwt, db):
    """dwt (F, 1, KH, KW) and db (F,) (when use_db) from dy (N, F, OH, OW) and x, summed
    in float64 over the batch, sample by sample (the same order at every thread count)."""
    n_, c_, h_, w_ = x.shape
    _, f_, oh, ow = dy.shape
    kh, kw = dwt.shape[2], dwt.shape[3]
    m = f_ // c_
    xf = x.ravel()
    gf = dy.ravel()
    wf = dwt.ravel()
    for f in nb.prange(f_):
        acc = np.zeros(kh * kw, np.float64)
        bacc = 0.0
        for n in range(n_):
            xb = (n * c_ + f // m) * h_ * w_
            yb = (n * f_ + f) * oh * ow
            if use_db:
                for k in range(oh * ow):
                    bacc += gf[_U(yb + k)]
            for i in range(kh):
                for j in range(kw):
                    off = j * dw - pl
                    q0, q1 = _valid_q(ow, sw, off, w_)
                    part = 0.0
                    p0, p1 = _valid_q(oh, sh, i * dh - pt, h_)
                    for p in range(p0, p1):
                        d = yb + p * ow
                        s = xb + (p * sh + i * dh - pt) * w_ + off
                        if sw == 1:
                            for q in range(q0, q1):
                                part += gf[_U(d + q)] * xf[_U(s + q)]
                        else:
                            for q in range(q0, q1):
                                part += gf[_U(d + q)] * xf[_U(s + q * sw)]
                    acc[i * kw + j] += part
        for k in range(kh * kw):
            wf[_U(f * kh * kw + k)] = acc[k]
        if use_db:
            db[f] = bacc


forward = _dispatch(_forward)
backward_data = _dispatch(_backward_data)
backward_weights = _dispatch(_backward_weights)
