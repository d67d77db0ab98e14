"""Compiled loops of the direct (no column matrix) stride-1 convolution (``direct``).

Each sample's padded input plane is read as one flat row of Hp*Wp values: the output at
flat position k = p*Wp + q needs input k + i*dh*Wp + j*dw for kernel offset (i, j), so
every (filter, channel, offset) term is one long, unit-stride multiply-add over
L = (OH-1)*Wp + OW positions that LLVM vectorizes (the W-OW columns between rows are
computed and dropped). With few channels this does C*KH*KW passes over an L1-resident
accumulator instead of writing and reading a (C*KH*KW, N*OH*OW) column matrix.

The kernels are serial over a block of samples [n0, n1); ``direct`` splits the batch
among threads. Weight sums go to float64 per sample (each is a float32 dot product of
L terms), so the result does not depend on how the batch is split.
"""
from __future__ import annotations

import numba as nb
import numpy as np

from ._numba_runtime import _U, _jit_serial

# reassoc: the dot products of dw vectorize; contract: multiply-adds become FMAs
_jit_dots = nb.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})


@_jit_serial
def pad_planes(x, n0, n1, pt, pl, xp):
    """xp[n0:n1] (N, C, Hp, Wp) = x[n0:n1] with zero borders (pt top, pl left)."""
    _, c_, h_, w_ = x.shape
    hp, wp = xp.shape[2], xp.shape[3]
    xf = x.ravel()
    pf = xp.ravel()
    for t in range(n0 * c_, n1 * c_):
        d0 = t * hp * wp
        s0 = t * h_ * w_
        for k in range(pt * wp):
            pf[_U(d0 + k)] = 0
        for r in range(h_):
            d = d0 + (r + pt) * wp
            for k in range(pl):
                pf[_U(d + k)] = 0
            s = s0 + r * w_
            for k in range(w_):
                pf[_U(d + pl + k)] = xf[_U(s + k)]
            for k in range(pl + w_, wp):
                pf[_U(d + k)] = 0
        for k in range((pt + h_) * wp, hp * wp):
            pf[_U(d0 + k)] = 0


@_jit_dots
def forward(xp, w, b, use_b, n0, n1, dh, dw, oh, ow, acc, y):
    """y[n0:n1] (N, F, OH, OW) = conv of the padded planes xp (N, C, Hp, Wp) with w
    (F, C, KH, KW), plus b[f] when use_b; acc is a work array of F*L values."""
    f_, c_, kh, kw = w.shape
    hp, wp = xp.shape[2], xp.shape[3]
    ll = (oh - 1) * wp + ow
    xf = xp.ravel()
    wf = w.ravel()
    yf = y.ravel()
    af = acc.ravel()
    for n in range(n0, n1):
        for f in range(f_):
            v = b[f] if use_b else wf[0] * 0
            for k in range(ll):
                af[_U(f * ll + k)] = v
        for c in range(c_):
            xb = (n * c_ + c) * hp * wp
            for i in range(kh):
                for j in range(kw):
                    s = xb + i * dh * wp + j * dw
                    for f in range(f_):
                        wv = wf[_U(((f * c_ + c) * kh + i) * kw + j)]
                        a = f * ll
                        for k in range(ll):
                            af[_U(a + k)] += wv * xf[_U(s + k)]
        for f in range(f_):
            d = (n * f_ + f) * oh * ow
            for p in range(oh):
                a = f * ll + p * wp
                for q in range(ow):
                    yf[_U(d + p * ow + q)] = af[_U(a + q)]


@_jit_dots
def backward(xp, w, dy, n0, n1, dh, dw, pt, pl, need_dx, dyw, dxp, dw64, db64, dx):
    """For samples n0..n1-1: dw64 (F, C, KH, KW) and db64 (F,) += their sums (float64);
    dx[n0:n1] (N, C, H, W) = the input gradient when need_dx. dyw (F*L) and dxp (C*Hp*Wp)
    are work arrays."""
    f_, c_, kh, kw = w.shape
    hp, wp = xp.shape[2], xp.shape[3]
    oh, ow = dy.shape[2], dy.shape[3]
    h_, w_ = dx.shape[2], dx.shape[3]
    ll = (oh - 1) * wp + ow
    xf = xp.ravel()
    wf = w.ravel()
    df = dy.ravel()
    gf = dyw.ravel()
    pf = dxp.ravel()
    xdf = dx.ravel()
    gw = dw64.ravel()
    for n in range(n0, n1):
        # dy as rows of width Wp (the columns between rows zero: they add nothing)
        for f in range(f_):
            s = (n * f_ + f) * oh * ow
            part = df[0] * 0
            for p in range(oh):
                a = f * ll + p * wp
                for q in range(ow):
                    v = df[_U(s + p * ow + q)]
                    gf[_U(a + q)] = v
                    part += v
                if p < oh - 1:
                    for q in range(ow, wp):
                        gf[_U(a + q)] = 0
            db64[f] += part
        for c in range(c_):
            xb = (n * c_ + c) * hp * wp
            for i in range(kh):
                for j in range(kw):
                    s = xb + i * dh * wp + j * dw
                    for f in range(f_):
                        a = f * ll
                        dot = xf[0] * 0
                        for k in range(ll):
                            dot += gf[_U(a + k)] * xf[_U(s + k)]
                        gw[_U(((f * c_ + c) * kh + i) * kw + j)] += dot
        if not need_dx:
            continue
        for c in range(c_):
            cb = c * hp * wp
            for k in range(hp * wp):
                pf[_U(cb + k)] = 0
            for i in range(kh):
                for j in range(kw):
                    s = cb + i * dh * wp + j * dw
                    for f in range(f_):
                        wv = wf[_U(((f * c_ + c) * kh + i) * kw + j)]
                        a = f * ll
                        for k in range(ll):
                            pf[_U(s + k)] += wv * gf[_U(a + k)]
            d = (n * c_ + c) * h_ * w_
            for r in range(h_):
                s = cb + (r + pt) * wp + pl
                for q in range(w_):
                    xdf[_U(d + r * w_ + q)] = pf[_U(s + q)]
