"""Compiled tile loops of the Winograd F(2x2, 3x3) convolution (numba; see ``winograd``).

The four transforms between NCHW arrays and the (16, rows x tiles) arrays that the
batched GEMMs read and write: input (B^T d B), output (A^T M A, + bias, + ReLU) and the
adjoints of both. Each (sample, channel) plane is staged in a small zero-padded buffer so
that the tile loops have no branches; a row k of a 16-row array starts ``a.shape[1]``
elements after row k-1 (the caller pads that stride). Each kernel's last two arguments
are the range [lo, hi) of its planes (channel-major: plane c * (n1 - n0) + n, or f * nk +
n) that it transforms; ``_dispatch`` fills them in (``PLANES``), and with 2+ threads the
block threads take pieces of that range (``_threads.pieces``), as batch norm's channels,
rather than OpenMP's pool: vgg11bn's layers that split every kernel among the threads
alternate these transforms with GEMMs on the block threads, which looked for their next
share (sched_yield) while an OpenMP thread waited for the core (F(4x4) 256->512 4x4, fwd +
bwd at 2 threads: the four transforms 16.4 ms against 14.9 at 1 thread). The serial twin
(``.serial``, range explicit; ``.whole``, all planes) is for callers that split the work
among threads themselves.
"""
from __future__ import annotations

import numba as nb
import numpy as np

from ._numba_runtime import _U, _dispatch
from ._threads import pieces
from ._winograd4w import NARROW_PART, PLANES, stage_plane, write_plane

_jit = nb.njit(parallel=True, cache=True, nogil=True)
_jit_sums = nb.njit(parallel=True, cache=True, nogil=True, fastmath={"reassoc", "contract"})

@_jit
def input_transform(x, n0, n1, pt, pl, th, tw, v, lo, hi):
    """v (16, >= C*(n1-n0)*th*tw), row k = (C, tiles): B^T d B of every 4x4 tile d of
    samples n0..n1-1 of x (N, C, H, W), tile (ty, tx) at input row 2*ty - pt, column
    2*tx - pl, zeros outside.
    Each (sample, channel) plane is first copied into a zero-padded buffer so that the tile
    loop has no branches (LLVM vectorizes it over tiles)."""
    _, c_, h_, w_ = x.shape
    k_ = n1 - n0
    nt = k_ * th * tw
    cs = v.shape[1]
    hp, wp = 2 * th + 2, 2 * tw + 2
    xf = x.ravel()
    vf = v.ravel()
    for part in nb.prange(-(-(hi - lo) // NARROW_PART)):
        d = np.zeros(hp * wp, x.dtype)
        for cn in range(lo + part * NARROW_PART, min(hi, lo + (part + 1) * NARROW_PART)):
            c = cn // k_
            n = cn % k_
            xb = ((n + n0) * c_ + c) * h_ * w_
            for r in range(max(0, -pt), min(h_, hp - pt)):
                q0, q1 = max(0, -pl), min(w_, wp - pl)
                for q in range(q0, q1):
                    d[_U((r + pt) * wp + q + pl)] = xf[_U(xb + r * w_ + q)]
            for ty in range(th):
                o = c * nt + (n * th + ty) * tw
                for tx in range(tw):
                    s = 2 * ty * wp + 2 * tx
                    # rows: B^T d (row0 - row2, row1 + row2, row2 - row1, row1 - row3)
                    a0 = d[_U(s)] - d[_U(s + 2 * wp)]
                    a1 = d[_U(s + 1)] - d[_U(s + 2 * wp + 1)]
                    a2 = d[_U(s + 2)] - d[_U(s + 2 * wp + 2)]
                    a3 = d[_U(s + 3)] - d[_U(s + 2 * wp + 3)]
                    b0 = d[_U(s + wp)] + d[_U(s + 2 * wp)]
                    b1 = d[_U(s + wp + 1)] + d[_U(s + 2 * wp + 1)]
                    b2 = d[_U(s + wp + 2)] + d[_U(s + 2 * wp + 2)]
                    b3 = d[_U(s + wp + 3)] + d[_U(s + 2 * wp + 3)]
                    c0 = d[_U(s + 2 * wp)] - d[_U(s + wp)]
                    c1 = d[_U(s + 2 * wp + 1)] - d[_U(s + wp + 1)]
                    c2 = d[_U(s + 2 * wp + 2)] - d[_U(s + wp + 2)]
                    c3 = d[_U(s + 2 * wp + 3)] - d[_U(s + wp + 3)]
                    e0 = d[_U(s + wp)] - d[_U(s + 3 * wp)]
                    e1 = d[_U(s + wp + 1)] - d[_U(s + 3 * wp + 1)]
                    e2 = d[_U(s + wp + 2)] - d[_U(s + 3 * wp + 2)]
                    e3 = d[_U(s + wp + 3)] - d[_U(s + 3 * wp + 3)]
                    t = o + tx
                    # columns: the same combination of each row's four values
                    vf[_U(0 * cs + t)] = a0 - a2
                    vf[_U(cs + t)] = a1 + a2
                    vf[_U(2 * cs + t)] = a2 - a1
                    vf[_U(3 * cs + t)] = a1 - a3
                    vf[_U(4 * cs + t)] = b0 - b2
                    vf[_U(5 * cs + t)] = b1 + b2
                    vf[_U(6 * cs + t)] = b2 - b1
                    vf[_U(7 * cs + t)] = b1 - b3
                    vf[_U(8 * cs + t)] = c0 - c2
                    vf[_U(9 * cs + t)] = c1 + c2
                    vf[_U(10 * cs + t)] = c2 - c1
                    vf[_U(11 * cs + t)] = c1 - c3
                    vf[_U(12 * cs + t)] = e0 - e2
                    vf[_U(13 * cs + t)] = e1 + e2
                    vf[_U(14 * cs + t)] = e2 - e1
                    vf[_U(15 * cs + t)] = e1 - e3


@_jit
def output_transform(m, b, use_b, relu, n0, nk, th, tw, y, lo, hi):
    """y[n0:n0+k] (k, F, OH, OW) = A^T M A of every tile of m (16, >= F*k*th*tw), plus b[f]
    when use_b, then max(., 0) when relu; tiles past OH/OW are cut."""
    _, f_, oh, ow = y.shape
    k_ = nk
    nt = k_ * th * tw
    fs = m.shape[1]
    wp = 2 * tw
    mf = m.ravel()
    yf = y.ravel()
    for part in nb.prange(-(-(hi - lo) // NARROW_PART)):
        out = np.empty(2 * th * wp, m.dtype)
        for fn in range(lo + part * NARROW_PART, min(hi, lo + (part + 1) * NARROW_PART)):
            f = fn // k_
            n = fn % k_
            yb = ((n + n0) * f_ + f) * oh * ow
            bias = b[f] if use_b else m.dtype.type(0)
            for ty in range(th):
                o = f * nt + (n * th + ty) * tw
                for tx in range(tw):
                    t = o + tx
                    # columns first: (M A) row r = (m_r0 + m_r1 + m_r2, m_r1 - m_r2 - m_r3)
                    p00 = mf[_U(t)] + mf[_U(fs + t)] + mf[_U(2 * fs + t)]
                    p01 = mf[_U(fs + t)] - mf[_U(2 * fs + t)] - mf[_U(3 * fs + t)]
                    p10 = mf[_U(4 * fs + t)] + mf[_U(5 * fs + t)] + mf[_U(6 * fs + t)]
                    p11 = mf[_U(5 * fs + t)] - mf[_U(6 * fs + t)] - mf[_U(7 * fs + t)]
                    p20 = mf[_U(8 * fs + t)] + mf[_U(9 * fs + t)] + mf[_U(10 * fs + t)]
                    p21 = mf[_U(9 * fs + t)] - mf[_U(10 * fs + t)] - mf[_U(11 * fs + t)]
                    p30 = mf[_U(12 * fs + t)] + mf[_U(13 * fs + t)] + mf[_U(14 * fs + t)]
                    p31 = mf[_U(13 * fs + t)] - mf[_U(14 * fs + t)] - mf[_U(15 * fs + t)]
                    s = 2 * ty * wp + 2 * tx
                    out[_U(s)] = p00 + p10 + p20
                    out[_U(s + 1)] = p01 + p11 + p21
                    out[_U(s + wp)] = p10 - p20 - p30
                    out[_U(s + wp + 1)] = p11 - p21 - p31
            write_plane(out, wp, yf, yb, oh, ow, bias, relu)


@_jit_sums
def output_transform_adjoint(dy, n0, n1, th, tw, dm, dbp, lo, hi):
    """dm (16, >= F*(n1-n0)*th*tw) = A dY A^T of every 2x2 tile of dy[n0:n1] (zeros past
    OH/OW); dbp[f * (n1-n0) + n] = the sum of dy[n0 + n, f] (float64)."""
    _, f_, oh, ow = dy.shape
    k_ = n1 - n0
    nt = k_ * th * tw
    fs = dm.shape[1]
    wp = 2 * tw
    df = dy.ravel()
    mf = dm.ravel()
    for part in nb.prange(-(-(hi - lo) // NARROW_PART)):
        g = np.zeros(2 * th * wp, dy.dtype)
        for fn in range(lo + part * NARROW_PART, min(hi, lo + (part + 1) * NARROW_PART)):
            f = fn // k_
            n = fn % k_
            yb = ((n + n0) * f_ + f) * oh * ow
            dbp[fn] = stage_plane(df, yb, oh, ow, g, wp)
            for ty in range(th):
                o = f * nt + (n * th + ty) * tw
                for tx in range(tw):
                    s = 2 * ty * wp + 2 * tx
                    g00 = g[_U(s)]
                    g01 = g[_U(s + 1)]
                    g10 = g[_U(s + wp)]
                    g11 = g[_U(s + wp + 1)]
                    # rows: A dY = (g0, g0 + g1, g0 - g1, -g1) of each column
                    h10, h11 = g00 + g10, g01 + g11
                    h20, h21 = g00 - g10, g01 - g11
                    t = o + tx
                    mf[_U(t)] = g00
                    mf[_U(fs + t)] = g00 + g01
                    mf[_U(2 * fs + t)] = g00 - g01
                    mf[_U(3 * fs + t)] = -g01
                    mf[_U(4 * fs + t)] = h10
                    mf[_U(5 * fs + t)] = h10 + h11
                    mf[_U(6 * fs + t)] = h10 - h11
                    mf[_U(7 * fs + t)] = -h11
                    mf[_U(8 * fs + t)] = h20
                    mf[_U(9 * fs + t)] = h20 + h21
                    mf[_U(10 * fs + t)] = h20 - h21
                    mf[_U(11 * fs + t)] = -h21
                    mf[_U(12 * fs + t)] = -g10
                    mf[_U(13 * fs + t)] = -g10 - g11
                    mf[_U(14 * fs + t)] = g11 - g10
                    mf[_U(15 * fs + t)] = g11


@_jit
def input_transform_adjoint(dv, n0, n1, pt, pl, th, tw, dx, lo, hi):
    """dx[n0:n1] = the sum over tiles of B dV B^T, at the positions input_transform read
    (positions in the padding are dropped); dx[n0:n1] is overwritten."""
    _, c_, h_, w_ = dx.shape
    k_ = n1 - n0
    nt = k_ * th * tw
    cs = dv.shape[1]
    hp, wp = 2 * th + 2, 2 * tw + 2
    vf = dv.ravel()
    xf = dx.ravel()
    for part in nb.prange(-(-(hi - lo) // NARROW_PART)):
        d = np.zeros(hp * wp, dv.dtype)
        for cn in range(lo + part * NARROW_PART, min(hi, lo + (part + 1) * NARROW_PART)):
            c = cn // k_
            n = cn % k_
            xb = ((n + n0) * c_ + c) * h_ * w_
            d[:] = 0
            for ty in range(th):
                o = c * nt + (n * th + ty) * tw
                for tx in range(tw):
                    t = o + tx
                    s = 2 * ty * wp + 2 * tx
                    # columns: row r of E = dV B^T is (v0, v1 - v2 + v3, v1 + v2 - v0, -v3)
                    v0 = vf[_U(t)]
                    v1 = vf[_U(cs + t)]
                    v2 = vf[_U(2 * cs + t)]
                    v3 = vf[_U(3 * cs + t)]
                    e00, e01, e02, e03 = v0, v1 - v2 + v3, v1 + v2 - v0, -v3
                    v0 = vf[_U(4 * cs + t)]
                    v1 = vf[_U(5 * cs + t)]
                    v2 = vf[_U(6 * cs + t)]
                    v3 = vf[_U(7 * cs + t)]
                    e10, e11, e12, e13 = v0, v1 - v2 + v3, v1 + v2 - v0, -v3
                    v0 = vf[_U(8 * cs + t)]
                    v1 = vf[_U(9 * cs + t)]
                    v2 = vf[_U(10 * cs + t)]
                    v3 = vf[_U(11 * cs + t)]
                    e20, e21, e22, e23 = v0, v1 - v2 + v3, v1 + v2 - v0, -v3
                    v0 = vf[_U(12 * cs + t)]
                    v1 = vf[_U(13 * cs + t)]
                    v2 = vf[_U(14 * cs + t)]
                    v3 = vf[_U(15 * cs + t)]
                    e30, e31, e32, e33 = v0, v1 - v2 + v3, v1 + v2 - v0, -v3
                    # rows: B E = (E0, E1 - E2 + E3, E1 + E2 - E0, -E3), added into the plane
                    d[_U(s)] += e00
                    d[_U(s + wp)] += e10 - e20 + e30
                    d[_U(s + 2 * wp)] += e10 + e20 - e00
                    d[_U(s + 3 * wp)] -= e30
                    d[_U(s + 1)] += e01
                    d[_U(s + wp + 1)] += e11 - e21 + e31
                    d[_U(s + 2 * wp + 1)] += e11 + e21 - e01
                    d[_U(s + 3 * wp + 1)] -= e31
                    d[_U(s + 2)] += e02
                    d[_U(s + wp + 2)] += e12 - e22 + e32
                    d[_U(s + 2 * wp + 2)] += e12 + e22 - e02
                    d[_U(s + 3 * wp + 2)] -= e32
                    d[_U(s + 3)] += e03
                    d[_U(s + wp + 3)] += e13 - e23 + e33
                    d[_U(s + 2 * wp + 3)] += e13 + e23 - e03
                    d[_U(s + 3 * wp + 3)] -= e33
            for r in range(h_):
                for q in range(w_):
                    rr, qq = r + pt, q + pl
                    inside = rr < hp and qq < wp
                    xf[_U(xb + r * w_ + q)] = d[_U(rr * wp + qq)] if inside else dv.dtype.type(0)


for _name, _planes in PLANES.items():
    globals()[_name] = _dispatch(globals()[_name], split=_planes, pieces=pieces)
