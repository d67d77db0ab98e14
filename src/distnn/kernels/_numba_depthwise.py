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

from ._numba import _valid_q
from ._numba_runtime import _U, _dispatch, _jit, _jit_sums, nb


@_jit
def _forward(x, w, b, use_b, sh, sw, pt, pl, dh, dw, y):
    """y (N, F, OH, OW) = depthwise conv of x (N, C, H, W) by w (F, 1, KH, KW) (+ b)."""
    n_, c_, h_, w_ = x.shape
    f_, _, kh, kw = w.shape
    _, _, oh, ow = y.shape
    m = f_ // c_
    xf = x.ravel()
    wf = w.ravel()
    yf = y.ravel()
    for t in nb.prange(n_ * f_):
        n = t // f_
        f = t % f_
        xb = (n * c_ + f // m) * h_ * w_
        yb = t * oh * ow
        b0 = b[f] if use_b else 0.0
        for k in range(oh * ow):
            yf[_U(yb + k)] = b0
        for i in range(kh):
            for j in range(kw):
                off = j * dw - pl
                q0, q1 = _valid_q(ow, sw, off, w_)
                wv = wf[_U((f * kh + i) * kw + j)]
                for p in range(oh):
                    ih = p * sh + i * dh - pt
                    if ih < 0 or ih >= h_:
                        continue
                    d = yb + p * ow
                    s = xb + ih * w_ + off
                    if sw == 1:
                        for q in range(q0, q1):
                            yf[_U(d + q)] += wv * xf[_U(s + q)]
                    else:
                        for q in range(q0, q1):
                            yf[_U(d + q)] += wv * xf[_U(s + q * sw)]


@_jit
def _backward_data(dy, w, sh, sw, pt, pl, dh, dw, dx):
    """dx (N, C, H, W) = the adjoint of ``_forward`` applied to dy (N, F, OH, OW)."""
    n_, c_, h_, w_ = dx.shape
    _, f_, oh, ow = dy.shape
    kh, kw = w.shape[2], w.shape[3]
    m = f_ // c_
    df = dx.ravel()
    gf = dy.ravel()
    wf = w.ravel()
    for t in nb.prange(n_ * c_):
        n = t // c_
        c = t % c_
        xb = t * h_ * w_
        for k in range(h_ * w_):
            df[_U(xb + k)] = 0
        for f in range(c * m, c * m + m):
            yb = (n * f_ + f) * oh * ow
            for i in range(kh):
                for j in range(kw):
                    off = j * dw - pl
                    q0, q1 = _valid_q(ow, sw, off, w_)
                    wv = wf[_U((f * kh + i) * kw + j)]
                    for p in range(oh):
                        ih = p * sh + i * dh - pt
                        if ih < 0 or ih >= h_:
                            continue
                        d = yb + p * ow
                        s = xb + ih * w_ + off
                        if sw == 1:
                            for q in range(q0, q1):
                                df[_U(s + q)] += wv * gf[_U(d + q)]
                        else:
                            for q in range(q0, q1):
                                df[_U(s + q * sw)] += wv * gf[_U(d + q)]


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
                    for p in range(oh):
                        ih = p * sh + i * dh - pt
                        if ih < 0 or ih >= h_:
                            continue
                        d = yb + p * ow
                        s = xb + ih * w_ + off
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
