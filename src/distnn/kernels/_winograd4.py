"""Compiled tile loops of the Winograd F(4x4, 3x3) convolution (numba; see ``winograd``).

The same four transforms as ``_winograd`` (same signatures, same layouts) for 6x6 input
tiles at stride 4 and 4x4 output tiles: input (B^T d B), output (A^T M A, + bias, +
ReLU) and the adjoints of both, between NCHW arrays and (36, rows x tiles) arrays whose
row k starts ``a.shape[1]`` elements after row k-1. The matrices are Lavin & Gray's with
interpolation points 0, 1, -1, 2, -2 and infinity (``winograd.BT4``, ``AT4``, ``G4``); each
1-D transform is a small inlined function applied to the rows of a tile, then to its
columns, through a 36-value stack of locals (``t``). Each kernel has a serial twin.
"""
from __future__ import annotations

import numba as nb
import numpy as np

from ._numba import _U, _dispatch

_jit = nb.njit(parallel=True, cache=True, nogil=True)
_jit_sums = nb.njit(parallel=True, cache=True, nogil=True, fastmath={"reassoc", "contract"})
_inline = nb.njit(inline="always", cache=True, nogil=True)


@_inline
def _bt(d0, d1, d2, d3, d4, d5):
    """B^T d: rows (4, 0, -5, 0, 1, 0), (0, -4, -4, 1, 1, 0), (0, 4, -4, -1, 1, 0),
    (0, -2, -1, 2, 1, 0), (0, 2, -1, -2, 1, 0), (0, 4, 0, -5, 0, 1)."""
    p = d4 - 4 * d2
    q = d3 - 4 * d1
    r = d4 - d2
    s = 2 * (d3 - d1)
    return 4 * d0 - 5 * d2 + d4, p + q, p - q, r + s, r - s, 4 * d1 - 5 * d3 + d5


@_inline
def _b(v0, v1, v2, v3, v4, v5):
    """B v (the transpose of ``_bt``)."""
    return (4 * v0, 4 * (v2 - v1) + 2 * (v4 - v3) + 4 * v5,
            -5 * v0 - 4 * (v1 + v2) - (v3 + v4), (v1 - v2) + 2 * (v3 - v4) - 5 * v5,
            v0 + v1 + v2 + v3 + v4, v5)


@_inline
def _at(m0, m1, m2, m3, m4, m5):
    """A^T m: rows (1, 1, 1, 1, 1, 0), (0, 1, -1, 2, -2, 0), (0, 1, 1, 4, 4, 0),
    (0, 1, -1, 8, -8, 1)."""
    a = m1 + m2
    b = m1 - m2
    c = m3 + m4
    d = m3 - m4
    return m0 + a + c, b + 2 * d, a + 4 * c, b + 8 * d + m5


@_inline
def _a(g0, g1, g2, g3):
    """A g (the transpose of ``_at``)."""
    e = g0 + g2
    o = g1 + g3
    e4 = g0 + 4 * g2
    o8 = 2 * g1 + 8 * g3
    return g0, e + o, e - o, e4 + o8, e4 - o8, g3


@_jit
def input_transform(x, n0, n1, pt, pl, th, tw, v):
    """v (36, >= C*(n1-n0)*th*tw), row k = (C, tiles): B^T d B of every 6x6 tile d of
    samples n0..n1-1 of x (N, C, H, W), tile (ty, tx) at input row 4*ty - pt, column
    4*tx - pl, zeros outside (each plane is staged in a zero-padded buffer first)."""
    _, c_, h_, w_ = x.shape
    k_ = n1 - n0
    nt = k_ * th * tw
    cs = v.shape[1]
    hp, wp = 4 * th + 2, 4 * tw + 2
    xf = x.ravel()
    vf = v.ravel()
    for cn in nb.prange(c_ * k_):
        c = cn // k_
        n = cn % k_
        xb = ((n + n0) * c_ + c) * h_ * w_
        d = np.zeros(hp * wp, x.dtype)
        t = np.empty(36, x.dtype)
        for r in range(max(0, -pt), min(h_, hp - pt)):
            for q in range(max(0, -pl), min(w_, wp - pl)):
                d[_U((r + pt) * wp + q + pl)] = xf[_U(xb + r * w_ + q)]
        for ty in range(th):
            o = c * nt + (n * th + ty) * tw
            for tx in range(tw):
                s = 4 * ty * wp + 4 * tx
                for j in range(6):  # columns of the tile: t[:, j] = B^T d[:, j]
                    e = s + j
                    t0, t1, t2, t3, t4, t5 = _bt(d[_U(e)], d[_U(e + wp)], d[_U(e + 2 * wp)],
                                                 d[_U(e + 3 * wp)], d[_U(e + 4 * wp)],
                                                 d[_U(e + 5 * wp)])
                    t[j], t[6 + j], t[12 + j] = t0, t1, t2
                    t[18 + j], t[24 + j], t[30 + j] = t3, t4, t5
                tt = o + tx
                for i in range(6):  # rows: v[i, :] = t[i, :] B
                    r0, r1, r2, r3, r4, r5 = _bt(t[6 * i], t[6 * i + 1], t[6 * i + 2],
                                                 t[6 * i + 3], t[6 * i + 4], t[6 * i + 5])
                    b = 6 * i * cs + tt
                    vf[_U(b)] = r0
                    vf[_U(b + cs)] = r1
                    vf[_U(b + 2 * cs)] = r2
                    vf[_U(b + 3 * cs)] = r3
                    vf[_U(b + 4 * cs)] = r4
                    vf[_U(b + 5 * cs)] = r5


@_jit
def output_transform(m, b, use_b, relu, n0, nk, th, tw, y):
    """y[n0:n0+k] (k, F, OH, OW) = A^T M A of every tile of m (36, >= F*k*th*tw), plus b[f]
    when use_b, then max(., 0) when relu; tiles past OH/OW are cut."""
    _, f_, oh, ow = y.shape
    nt = nk * th * tw
    fs = m.shape[1]
    wp = 4 * tw
    mf = m.ravel()
    yf = y.ravel()
    for fn in nb.prange(f_ * nk):
        f = fn // nk
        n = fn % nk
        yb = ((n + n0) * f_ + f) * oh * ow
        bias = b[f] if use_b else mf[0] * 0
        z = mf[0] * 0
        out = np.empty(4 * th * wp, m.dtype)
        t = np.empty(24, m.dtype)
        for ty in range(th):
            o = f * nt + (n * th + ty) * tw
            for tx in range(tw):
                tt = o + tx
                for i in range(6):  # rows: t[i, :] = M[i, :] A
                    b0 = 6 * i * fs + tt
                    p0, p1, p2, p3 = _at(mf[_U(b0)], mf[_U(b0 + fs)], mf[_U(b0 + 2 * fs)],
                                         mf[_U(b0 + 3 * fs)], mf[_U(b0 + 4 * fs)],
                                         mf[_U(b0 + 5 * fs)])
                    t[4 * i], t[4 * i + 1], t[4 * i + 2], t[4 * i + 3] = p0, p1, p2, p3
                s = 4 * ty * wp + 4 * tx
                for j in range(4):  # columns: A^T t[:, j]
                    q0, q1, q2, q3 = _at(t[j], t[4 + j], t[8 + j], t[12 + j], t[16 + j],
                                         t[20 + j])
                    out[_U(s + j)] = q0
                    out[_U(s + wp + j)] = q1
                    out[_U(s + 2 * wp + j)] = q2
                    out[_U(s + 3 * wp + j)] = q3
        for r in range(oh):
            for q in range(ow):
                val = out[_U(r * wp + q)] + bias
                if relu and val < z:
                    val = z
                yf[_U(yb + r * ow + q)] = val


@_jit_sums
def output_transform_adjoint(dy, n0, n1, th, tw, dm, dbp):
    """dm (36, >= F*(n1-n0)*th*tw) = A dY A^T of every 4x4 tile of dy[n0:n1] (zeros past
    OH/OW); dbp[f * (n1-n0) + n] = the sum of dy[n0 + n, f] (float64)."""
    _, f_, oh, ow = dy.shape
    k_ = n1 - n0
    nt = k_ * th * tw
    fs = dm.shape[1]
    wp = 4 * tw
    df = dy.ravel()
    mf = dm.ravel()
    for fn in nb.prange(f_ * k_):
        f = fn // k_
        n = fn % k_
        yb = ((n + n0) * f_ + f) * oh * ow
        g = np.zeros(4 * th * wp, dy.dtype)
        t = np.empty(24, dy.dtype)
        acc = 0.0
        for r in range(oh):
            for q in range(ow):
                val = df[_U(yb + r * ow + q)]
                g[_U(r * wp + q)] = val
                acc += val
        dbp[fn] = acc
        for ty in range(th):
            o = f * nt + (n * th + ty) * tw
            for tx in range(tw):
                s = 4 * ty * wp + 4 * tx
                for j in range(4):  # columns: t[:, j] = A g[:, j]
                    e = s + j
                    a0, a1, a2, a3, a4, a5 = _a(g[_U(e)], g[_U(e + wp)], g[_U(e + 2 * wp)],
                                                g[_U(e + 3 * wp)])
                    t[j], t[4 + j], t[8 + j] = a0, a1, a2
                    t[12 + j], t[16 + j], t[20 + j] = a3, a4, a5
                tt = o + tx
                for i in range(6):  # rows: dM[i, :] = t[i, :] A^T
                    r0, r1, r2, r3, r4, r5 = _a(t[4 * i], t[4 * i + 1], t[4 * i + 2],
                                                t[4 * i + 3])
                    b0 = 6 * i * fs + tt
                    mf[_U(b0)] = r0
                    mf[_U(b0 + fs)] = r1
                    mf[_U(b0 + 2 * fs)] = r2
                    mf[_U(b0 + 3 * fs)] = r3
                    mf[_U(b0 + 4 * fs)] = r4
                    mf[_U(b0 + 5 * fs)] = r5


@_jit
def input_transform_adjoint(dv, n0, n1, pt, pl, th, tw, dx):
    """dx[n0:n1] = the sum over tiles of B dV B^T, at the positions input_transform read
    (positions in the padding are dropped); dx[n0:n1] is overwritten."""
    _, c_, h_, w_ = dx.shape
    k_ = n1 - n0
    nt = k_ * th * tw
    cs = dv.shape[1]
    hp, wp = 4 * th + 2, 4 * tw + 2
    vf = dv.ravel()
    xf = dx.ravel()
    for cn in nb.prange(c_ * k_):
        c = cn // k_
        n = cn % k_
        xb = ((n + n0) * c_ + c) * h_ * w_
        d = np.zeros(hp * wp, dv.dtype)
        t = np.empty(36, dv.dtype)
        for ty in range(th):
            o = c * nt + (n * th + ty) * tw
            for tx in range(tw):
                tt = o + tx
                for i in range(6):  # rows: t[i, :] = dV[i, :] B^T
                    b0 = 6 * i * cs + tt
                    e0, e1, e2, e3, e4, e5 = _b(vf[_U(b0)], vf[_U(b0 + cs)],
                                                vf[_U(b0 + 2 * cs)], vf[_U(b0 + 3 * cs)],
                                                vf[_U(b0 + 4 * cs)], vf[_U(b0 + 5 * cs)])
                    t[6 * i], t[6 * i + 1], t[6 * i + 2] = e0, e1, e2
                    t[6 * i + 3], t[6 * i + 4], t[6 * i + 5] = e3, e4, e5
                s = 4 * ty * wp + 4 * tx
                for j in range(6):  # columns: B t[:, j], added into the plane
                    e = s + j
                    c0, c1, c2, c3, c4, c5 = _b(t[j], t[6 + j], t[12 + j], t[18 + j],
                                                t[24 + j], t[30 + j])
                    d[_U(e)] += c0
                    d[_U(e + wp)] += c1
                    d[_U(e + 2 * wp)] += c2
                    d[_U(e + 3 * wp)] += c3
                    d[_U(e + 4 * wp)] += c4
                    d[_U(e + 5 * wp)] += c5
        for r in range(h_):
            for q in range(w_):
                rr, qq = r + pt, q + pl
                inside = rr < hp and qq < wp
                xf[_U(xb + r * w_ + q)] = d[_U(rr * wp + qq)] if inside else d[0] * 0


for _name in ("input_transform", "output_transform", "output_transform_adjoint",
              "input_transform_adjoint"):
    globals()[_name] = _dispatch(globals()[_name])
