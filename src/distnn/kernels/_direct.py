"""Compiled loops of the direct (no column matrix) stride-1 convolution (``direct``).

Each sample's padded input plane is read as one flat row of Hp*Wp values: the output at
flat position k = p*Wp + q needs input k + i*dh*Wp + j*dw for kernel offset (i, j), so
every term is a long, unit-stride multiply-add over L = (OH-1)*Wp + OW positions that
LLVM vectorizes (the Wp-OW columns between rows are computed and dropped). The loops are
blocked so that one load of the input feeds several multiply-adds: three taps of a kernel
row for four filters at a time (12 FMAs per 3 input loads and 4 accumulator updates) in
the forward pass, and three taps for one filter's dw dot products. The input gradient is
the same forward kernel over dy padded for a full correlation with the flipped weights.

The kernels are serial over a block of samples [n0, n1); ``direct`` splits the batch
among threads. Weight sums go to float64 per sample (each is a float32 dot product of
L terms), so the result does not depend on how the batch is split.
"""
from __future__ import annotations

import numba as nb

from ._numba_runtime import _U, _jit_serial

# reassoc: the dot products of dw vectorize; contract: multiply-adds become FMAs
_jit_dots = nb.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})


@_jit_serial
def pad_planes(x, n0, n1, pt, pl, xp):
    """xp[n0:n1] (N, C, Hp, Wp) = x[n0:n1] moved down pt rows and right pl columns, zero
    elsewhere; negative pt / pl crop instead."""
    _, c_, h_, w_ = x.shape
    hp, wp = xp.shape[2], xp.shape[3]
    xf = x.ravel()
    pf = xp.ravel()
    q0 = min(max(pl, 0), wp)          # first destination column with a source
    q1 = max(q0, min(wp, w_ + pl))    # past the last one
    for t in range(n0 * c_, n1 * c_):
        d0 = t * hp * wp
        s0 = t * h_ * w_
        for r in range(hp):
            d = d0 + r * wp
            sr = r - pt
            if sr < 0 or sr >= h_:
                for k in range(wp):
                    pf[_U(d + k)] = 0
                continue
            for k in range(q0):
                pf[_U(d + k)] = 0
            s = s0 + sr * w_ - pl
            for k in range(q0, q1):
                pf[_U(d + k)] = xf[_U(s + k)]
            for k in range(q1, wp):
                pf[_U(d + k)] = 0


@_jit_dots
def _taps3(xf, wf, af, s, j, c, i, c_, kh, kw, f_, dw, ll):
    """acc (F*L) += taps j, j+1, j+2 of kernel row i of channel c over the flat input from
    s: four filters at a time (12 FMAs per 3 input loads and 4 accumulator updates)."""
    f = 0
    while f + 4 <= f_:
        t = ((f * c_ + c) * kh + i) * kw + j
        st = c_ * kh * kw
        a0, a1, a2 = wf[_U(t)], wf[_U(t + 1)], wf[_U(t + 2)]
        b0, b1, b2 = wf[_U(t + st)], wf[_U(t + st + 1)], wf[_U(t + st + 2)]
        t += 2 * st
        c0, c1, c2 = wf[_U(t)], wf[_U(t + 1)], wf[_U(t + 2)]
        d0, d1, d2 = wf[_U(t + st)], wf[_U(t + st + 1)], wf[_U(t + st + 2)]
        o = f * ll
        sj = s + j * dw
        for k in range(ll):
            x0 = xf[_U(sj + k)]
            x1 = xf[_U(sj + dw + k)]
            x2 = xf[_U(sj + 2 * dw + k)]
            af[_U(o + k)] += a0 * x0 + a1 * x1 + a2 * x2
            af[_U(o + ll + k)] += b0 * x0 + b1 * x1 + b2 * x2
            af[_U(o + 2 * ll + k)] += c0 * x0 + c1 * x1 + c2 * x2
            af[_U(o + 3 * ll + k)] += d0 * x0 + d1 * x1 + d2 * x2
        f += 4
    while f < f_:
        t = ((f * c_ + c) * kh + i) * kw + j
        a0, a1, a2 = wf[_U(t)], wf[_U(t + 1)], wf[_U(t + 2)]
        o = f * ll
        sj = s + j * dw
        for k in range(ll):
            af[_U(o + k)] += (a0 * xf[_U(sj + k)] + a1 * xf[_U(sj + dw + k)]
                              + a2 * xf[_U(sj + 2 * dw + k)])
        f += 1


@_jit_dots
def _taps2(xf, wf, af, s, j, c, i, c_, kh, kw, f_, dw, ll):
    """acc += taps j, j+1 of kernel row i of channel c (5x5 kernels: 3 + 2)."""
    sj = s + j * dw
    f = 0
    while f + 4 <= f_:
        t = ((f * c_ + c) * kh + i) * kw + j
        st = c_ * kh * kw
        a0, a1 = wf[_U(t)], wf[_U(t + 1)]
        b0, b1 = wf[_U(t + st)], wf[_U(t + st + 1)]
        c0, c1 = wf[_U(t + 2 * st)], wf[_U(t + 2 * st + 1)]
        d0, d1 = wf[_U(t + 3 * st)], wf[_U(t + 3 * st + 1)]
        o = f * ll
        for k in range(ll):
            x0 = xf[_U(sj + k)]
            x1 = xf[_U(sj + dw + k)]
            af[_U(o + k)] += a0 * x0 + a1 * x1
            af[_U(o + ll + k)] += b0 * x0 + b1 * x1
            af[_U(o + 2 * ll + k)] += c0 * x0 + c1 * x1
            af[_U(o + 3 * ll + k)] += d0 * x0 + d1 * x1
        f += 4
    while f < f_:
        t = ((f * c_ + c) * kh + i) * kw + j
        a0, a1 = wf[_U(t)], wf[_U(t + 1)]
        o = f * ll
        for k in range(ll):
            af[_U(o + k)] += a0 * xf[_U(sj + k)] + a1 * xf[_U(sj + dw + k)]
        f += 1


@_jit_dots
def forward(xp, w, b, n0, n1, dh, dw, oh, ow, acc, y):
    """y[n0:n1] (N, F, OH, OW) = conv of the padded planes xp (N, C, Hp, Wp) with w
    (F, C, KH, KW), plus b (F,); acc is a work array of F*L values."""
    f_, c_, kh, kw = w.shape
    hp, wp = xp.shape[2], xp.shape[3]
    ll = (oh - 1) * wp + ow
    xf = xp.ravel()
    wf = w.ravel()
    yf = y.ravel()
    af = acc.ravel()
    for n in range(n0, n1):
        for f in range(f_):
            v = b[f]
            for k in range(ll):
                af[_U(f * ll + k)] = v
        for c in range(c_):
            for i in range(kh):
                s = (n * c_ + c) * hp * wp + i * dh * wp
                j = 0
                while j + 3 <= kw:
                    _taps3(xf, wf, af, s, j, c, i, c_, kh, kw, f_, dw, ll)
                    j += 3
                if j + 2 <= kw:
                    _taps2(xf, wf, af, s, j, c, i, c_, kh, kw, f_, dw, ll)
                    j += 2
                while j < kw:
                    sj = s + j * dw
                    for f in range(f_):
                        a0 = wf[_U(((f * c_ + c) * kh + i) * kw + j)]
                        o = f * ll
                        for k in range(ll):
                            af[_U(o + k)] += a0 * xf[_U(sj + k)]
                    j += 1
        for f in range(f_):
            d = (n * f_ + f) * oh * ow
            for p in range(oh):
                a = f * ll + p * wp
                for q in range(ow):
                    yf[_U(d + p * ow + q)] = af[_U(a + q)]


@_jit_dots
def _dw_four(xf, gf, gw, zero, s, f, c, i, c_, kh, kw, dw, ll):
    """dw of filters f..f+3, kernel row i of channel c: per three (two) taps 12 (8) dot
    products per 7 (6) loads of the input and dy rows, added into the float64 dw."""
    a = f * ll
    st = c_ * kh * kw
    t = ((f * c_ + c) * kh + i) * kw
    j = 0
    while j + 3 <= kw:
        sj = s + j * dw
        z = zero[0]
        s00, s01, s02, s10, s11, s12 = z, z, z, z, z, z
        s20, s21, s22, s30, s31, s32 = z, z, z, z, z, z
        for k in range(ll):
            x0 = xf[_U(sj + k)]
            x1 = xf[_U(sj + dw + k)]
            x2 = xf[_U(sj + 2 * dw + k)]
            g0 = gf[_U(a + k)]
            g1 = gf[_U(a + ll + k)]
            g2 = gf[_U(a + 2 * ll + k)]
            g3 = gf[_U(a + 3 * ll + k)]
            s00 += g0 * x0
            s01 += g0 * x1
            s02 += g0 * x2
            s10 += g1 * x0
            s11 += g1 * x1
            s12 += g1 * x2
            s20 += g2 * x0
            s21 += g2 * x1
            s22 += g2 * x2
            s30 += g3 * x0
            s31 += g3 * x1
            s32 += g3 * x2
        u = t + j
        gw[_U(u)] += s00
        gw[_U(u + 1)] += s01
        gw[_U(u + 2)] += s02
        u += st
        gw[_U(u)] += s10
        gw[_U(u + 1)] += s11
        gw[_U(u + 2)] += s12
        u += st
        gw[_U(u)] += s20
        gw[_U(u + 1)] += s21
        gw[_U(u + 2)] += s22
        u += st
        gw[_U(u)] += s30
        gw[_U(u + 1)] += s31
        gw[_U(u + 2)] += s32
        j += 3
    if j + 2 <= kw:
        sj = s + j * dw
        z = zero[0]
        s00, s01, s10, s11, s20, s21, s30, s31 = z, z, z, z, z, z, z, z
        for k in range(ll):
            x0 = xf[_U(sj + k)]
            x1 = xf[_U(sj + dw + k)]
            g0 = gf[_U(a + k)]
            g1 = gf[_U(a + ll + k)]
            g2 = gf[_U(a + 2 * ll + k)]
            g3 = gf[_U(a + 3 * ll + k)]
            s00 += g0 * x0
            s01 += g0 * x1
            s10 += g1 * x0
            s11 += g1 * x1
            s20 += g2 * x0
            s21 += g2 * x1
            s30 += g3 * x0
            s31 += g3 * x1
        u = t + j
        gw[_U(u)] += s00
        gw[_U(u + 1)] += s01
        gw[_U(u + st)] += s10
        gw[_U(u + st + 1)] += s11
        gw[_U(u + 2 * st)] += s20
        gw[_U(u + 2 * st + 1)] += s21
        gw[_U(u + 3 * st)] += s30
        gw[_U(u + 3 * st + 1)] += s31
        j += 2
    while j < kw:
        sj = s + j * dw
        for e in range(4):
            s0 = zero[0]
            for k in range(ll):
                s0 += gf[_U(a + e * ll + k)] * xf[_U(sj + k)]
            gw[_U(t + e * st + j)] += s0
        j += 1


@_jit_dots
def _dw_one(xf, gf, gw, zero, s, f, c, i, c_, kh, kw, dw, ll):
    """dw of filter f, kernel row i of channel c: three taps a pass over the rows."""
    a = f * ll
    t = ((f * c_ + c) * kh + i) * kw
    j = 0
    while j + 3 <= kw:
        sj = s + j * dw
        s0 = zero[0]
        s1 = zero[0]
        s2 = zero[0]
        for k in range(ll):
            g = gf[_U(a + k)]
            s0 += g * xf[_U(sj + k)]
            s1 += g * xf[_U(sj + dw + k)]
            s2 += g * xf[_U(sj + 2 * dw + k)]
        gw[_U(t + j)] += s0
        gw[_U(t + j + 1)] += s1
        gw[_U(t + j + 2)] += s2
        j += 3
    while j < kw:
        sj = s + j * dw
        s0 = zero[0]
        for k in range(ll):
            s0 += gf[_U(a + k)] * xf[_U(sj + k)]
        gw[_U(t + j)] += s0
        j += 1


@_jit_dots
def weight_grad(xp, dy, n0, n1, dh, dw, dyw, dw64, db64, zero):
    """For samples n0..n1-1: dw64 (F, C, KH, KW) and db64 (F,) += their sums (float64).
    dyw is a work array of F*L values; zero[0] is 0 in the dtype of x (the dot products
    accumulate in it: ``x[0] * 0`` would be float64 and not vectorize)."""
    f_, c_, kh, kw = dw64.shape
    hp, wp = xp.shape[2], xp.shape[3]
    oh, ow = dy.shape[2], dy.shape[3]
    ll = (oh - 1) * wp + ow
    xf = xp.ravel()
    df = dy.ravel()
    gf = dyw.ravel()
    gw = dw64.ravel()
    for n in range(n0, n1):
        # dy as rows of width Wp (the columns between rows zero: they add nothing)
        for f in range(f_):
            s = (n * f_ + f) * oh * ow
            part = 0.0
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
            for i in range(kh):
                s = (n * c_ + c) * hp * wp + i * dh * wp
                f = 0
                while f + 4 <= f_ and kw >= 2:
                    _dw_four(xf, gf, gw, zero, s, f, c, i, c_, kh, kw, dw, ll)
                    f += 4
                while f < f_:
                    _dw_one(xf, gf, gw, zero, s, f, c, i, c_, kh, kw, dw, ll)
                    f += 1


# -- 1x1 convolutions: a strided slice of the input, then GEMMs ---------------------------
@_jit_serial
def subsample(x, n0, n1, sh, sw, xs):
    """xs[n0:n1] (N, C, OH, OW) = x[n0:n1, :, ::sh, ::sw] (its first OH x OW)."""
    _, c_, h_, w_ = x.shape
    oh, ow = xs.shape[2], xs.shape[3]
    xf = x.ravel()
    sf = xs.ravel()
    for t in range(n0 * c_, n1 * c_):
        for p in range(oh):
            s = t * h_ * w_ + p * sh * w_
            d = (t * oh + p) * ow
            for q in range(ow):
                sf[_U(d + q)] = xf[_U(s + q * sw)]


@_jit_serial
def upsample(dxs, n0, n1, sh, sw, dx):
    """dx[n0:n1] (N, C, H, W) = dxs at every (sh, sw)-th position, 0 elsewhere (the adjoint
    of ``subsample``)."""
    _, c_, h_, w_ = dx.shape
    oh, ow = dxs.shape[2], dxs.shape[3]
    sf = dxs.ravel()
    xf = dx.ravel()
    for t in range(n0 * c_, n1 * c_):
        for r in range(h_):
            d = (t * h_ + r) * w_
            p = r // sh
            if r - p * sh != 0 or p >= oh:
                for q in range(w_):
                    xf[_U(d + q)] = 0
                continue
            s = (t * oh + p) * ow
            for q in range(w_):
                xf[_U(d + q)] = 0
            for q in range(ow):
                xf[_U(d + q * sw)] = sf[_U(s + q)]
