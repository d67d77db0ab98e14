"""Compiled tile loops of the Winograd F(4x4, 3x3) convolution (numba; see ``winograd``).

The same four transforms as ``_winograd`` (same signatures, same layouts) for 6x6 input
tiles at stride 4 and 4x4 output tiles: input (B^T d B), output (A^T M A, + bias, +
ReLU) and the adjoints of both, between NCHW arrays and (36, rows x tiles) arrays whose
row k starts ``a.shape[1]`` elements after row k-1. The matrices are Lavin & Gray's with
interpolation points 0, 1, -1, 2, -2 and infinity (``winograd.BT4``, ``AT4``, ``G4``); each
1-D transform is a small inlined function applied to the rows of a tile, then to its
columns, all in scalar locals (tuples), so LLVM keeps a tile in registers. Planes of
``_winograd4w.WIDE_TILES`` tiles and more (from ~26x26 outputs) go to ``_winograd4w``
instead, whose loops are vectorized over a plane's tiles (the output adjoint, output and
input transforms then stage the plane by phases). Each kernel has a serial twin.
"""
from __future__ import annotations

import numba as nb
import numpy as np

from ._atomics import fetch_add
from ._numba_runtime import _U, _dispatch
from ._threads import PYTHON, put, pieces
from ._vgemm import matmul_flat, matmul_nt_flat
from ._winograd4w import (NARROW_PART, PLANES, WIDE_TILES, _a, _at, _b, _bt, from_phases,
                         input_adjoint_plane, input_plane, output_adjoint_plane,
                         output_plane, stage_plane, to_phases, write_plane)

_jit = nb.njit(parallel=True, cache=True, nogil=True)
_jit_sums = nb.njit(parallel=True, cache=True, nogil=True, fastmath={"reassoc", "contract"})
_inline = nb.njit(inline="always", cache=True, nogil=True)

# Planes per parallel iteration of the wide (``_winograd4w``) paths, which allocate their
# work arrays once per iteration: one allocation per plane cost 0.6 us of ~4 (16->16 32x32
# input transform, AVX2). numba splits the iterations evenly among the threads.
PART = 8


@_inline
def _load6(a, o, step):
    return (a[_U(o)], a[_U(o + step)], a[_U(o + 2 * step)], a[_U(o + 3 * step)],
            a[_U(o + 4 * step)], a[_U(o + 5 * step)])


@_inline
def _load4(a, o, step):
    return a[_U(o)], a[_U(o + step)], a[_U(o + 2 * step)], a[_U(o + 3 * step)]


@_inline
def _put6(a, o, step, c):
    a[_U(o)] = c[0]
    a[_U(o + step)] = c[1]
    a[_U(o + 2 * step)] = c[2]
    a[_U(o + 3 * step)] = c[3]
    a[_U(o + 4 * step)] = c[4]
    a[_U(o + 5 * step)] = c[5]


@_inline
def _add6(a, o, step, c):
    a[_U(o)] += c[0]
    a[_U(o + step)] += c[1]
    a[_U(o + 2 * step)] += c[2]
    a[_U(o + 3 * step)] += c[3]
    a[_U(o + 4 * step)] += c[4]
    a[_U(o + 5 * step)] += c[5]


@_inline
def _put4(a, o, step, c):
    a[_U(o)] = c[0]
    a[_U(o + step)] = c[1]
    a[_U(o + 2 * step)] = c[2]
    a[_U(o + 3 * step)] = c[3]


@_inline
def _bt_(q):
    return _bt(q[0], q[1], q[2], q[3], q[4], q[5])


@_inline
def _b_(q):
    return _b(q[0], q[1], q[2], q[3], q[4], q[5])


@_inline
def _at_(q):
    return _at(q[0], q[1], q[2], q[3], q[4], q[5])


@_inline
def _a_(q):
    return _a(q[0], q[1], q[2], q[3])


@_jit
def input_transform(x, n0, n1, pt, pl, th, tw, v, lo, hi):
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
    ntp = th * (tw + 1)
    if ntp >= WIDE_TILES:  # vectorized over the plane's tiles (``_winograd4w``)
        for part in nb.prange(-(-(hi - lo) // PART)):
            d = np.empty(16 * (th + 1) * (tw + 1) + 8, x.dtype)
            tmp = np.empty(36 * ntp, x.dtype)
            tmp2 = np.empty(36 * ntp, x.dtype)
            for cn in range(lo + part * PART, min(hi, lo + (part + 1) * PART)):
                c = cn // k_
                n = cn % k_
                input_plane(xf, ((n + n0) * c_ + c) * h_ * w_, h_, w_, pt, pl, th, tw, vf, cs,
                            c * nt + n * th * tw, d, tmp, tmp2)
        return
    for part in nb.prange(-(-(hi - lo) // NARROW_PART)):
        d = np.zeros(hp * wp, x.dtype)
        for cn in range(lo + part * NARROW_PART, min(hi, lo + (part + 1) * NARROW_PART)):
            c = cn // k_
            n = cn % k_
            xb = ((n + n0) * c_ + c) * h_ * w_
            for r in range(max(0, -pt), min(h_, hp - pt)):
                for q in range(max(0, -pl), min(w_, wp - pl)):
                    d[_U((r + pt) * wp + q + pl)] = xf[_U(xb + r * w_ + q)]
            for ty in range(th):
                o = c * nt + (n * th + ty) * tw
                for tx in range(tw):
                    s = 4 * ty * wp + 4 * tx
                    # columns of the tile: c_j = B^T d[:, j]
                    c0 = _bt_(_load6(d, s, wp))
                    c1 = _bt_(_load6(d, s + 1, wp))
                    c2 = _bt_(_load6(d, s + 2, wp))
                    c3 = _bt_(_load6(d, s + 3, wp))
                    c4 = _bt_(_load6(d, s + 4, wp))
                    c5 = _bt_(_load6(d, s + 5, wp))
                    # rows: v[i, :] = (B^T d)[i, :] B, position (i, j) at row 6 i + j
                    t = o + tx
                    _put6(vf, t, cs, _bt(c0[0], c1[0], c2[0], c3[0], c4[0], c5[0]))
                    _put6(vf, t + 6 * cs, cs, _bt(c0[1], c1[1], c2[1], c3[1], c4[1], c5[1]))
                    _put6(vf, t + 12 * cs, cs, _bt(c0[2], c1[2], c2[2], c3[2], c4[2], c5[2]))
                    _put6(vf, t + 18 * cs, cs, _bt(c0[3], c1[3], c2[3], c3[3], c4[3], c5[3]))
                    _put6(vf, t + 24 * cs, cs, _bt(c0[4], c1[4], c2[4], c3[4], c4[4], c5[4]))
                    _put6(vf, t + 30 * cs, cs, _bt(c0[5], c1[5], c2[5], c3[5], c4[5], c5[5]))


@_jit
def output_transform(m, b, use_b, relu, n0, nk, th, tw, y, lo, hi):
    """y[n0:n0+k] (k, F, OH, OW) = A^T M A of every tile of m (36, >= F*k*th*tw), plus b[f]
    when use_b, then max(., 0) when relu; tiles past OH/OW are cut."""
    _, f_, oh, ow = y.shape
    nt = nk * th * tw
    fs = m.shape[1]
    wp = 4 * tw
    mf = m.ravel()
    yf = y.ravel()
    z = m.dtype.type(0)  # float32 for float32 (``mf[0] * 0`` is float64 in numba)
    ntp = th * (tw + 1)
    if ntp >= WIDE_TILES:  # vectorized over the plane's tiles (``_winograd4w``)
        for part in nb.prange(-(-(hi - lo) // PART)):
            out = np.empty(16 * ntp, m.dtype)
            tmp = np.empty(36 * ntp, m.dtype)
            tmp2 = np.empty(24 * ntp, m.dtype)
            for fn in range(lo + part * PART, min(hi, lo + (part + 1) * PART)):
                f = fn // nk
                n = fn % nk
                yb = ((n + n0) * f_ + f) * oh * ow
                bias = b[f] if use_b else z
                output_plane(mf, fs, f * nt + n * th * tw, th, tw, tmp, tmp2, out)
                q4 = ow >> 2
                for r in range(oh):  # out by phases (q >= 0: & and >> for % and //)
                    ob = (r & 3) * 4 * ntp + (r >> 2) * (tw + 1)
                    yr = yb + r * ow
                    for i in range(q4):  # 4 runs interleaved (LLVM vectorizes this)
                        v0 = out[_U(ob + i)] + bias
                        v1 = out[_U(ob + ntp + i)] + bias
                        v2 = out[_U(ob + 2 * ntp + i)] + bias
                        v3 = out[_U(ob + 3 * ntp + i)] + bias
                        if relu:
                            v0 = z if v0 < z else v0
                            v1 = z if v1 < z else v1
                            v2 = z if v2 < z else v2
                            v3 = z if v3 < z else v3
                        yf[_U(yr + 4 * i)] = v0
                        yf[_U(yr + 4 * i + 1)] = v1
                        yf[_U(yr + 4 * i + 2)] = v2
                        yf[_U(yr + 4 * i + 3)] = v3
                    for q in range(4 * q4, ow):
                        val = out[_U(ob + (q & 3) * ntp + (q >> 2))] + bias
                        if relu and val < z:
                            val = z
                        yf[_U(yr + q)] = val
        return
    for part in nb.prange(-(-(hi - lo) // NARROW_PART)):
        out = np.empty(4 * th * wp, m.dtype)
        for fn in range(lo + part * NARROW_PART, min(hi, lo + (part + 1) * NARROW_PART)):
            f = fn // nk
            n = fn % nk
            yb = ((n + n0) * f_ + f) * oh * ow
            bias = b[f] if use_b else z
            for ty in range(th):
                o = f * nt + (n * th + ty) * tw
                for tx in range(tw):
                    t = o + tx
                    # rows: r_i = M[i, :] A
                    r0 = _at_(_load6(mf, t, fs))
                    r1 = _at_(_load6(mf, t + 6 * fs, fs))
                    r2 = _at_(_load6(mf, t + 12 * fs, fs))
                    r3 = _at_(_load6(mf, t + 18 * fs, fs))
                    r4 = _at_(_load6(mf, t + 24 * fs, fs))
                    r5 = _at_(_load6(mf, t + 30 * fs, fs))
                    # columns: A^T r[:, j] is column j of the 4x4 output tile
                    s = 4 * ty * wp + 4 * tx
                    _put4(out, s, wp, _at(r0[0], r1[0], r2[0], r3[0], r4[0], r5[0]))
                    _put4(out, s + 1, wp, _at(r0[1], r1[1], r2[1], r3[1], r4[1], r5[1]))
                    _put4(out, s + 2, wp, _at(r0[2], r1[2], r2[2], r3[2], r4[2], r5[2]))
                    _put4(out, s + 3, wp, _at(r0[3], r1[3], r2[3], r3[3], r4[3], r5[3]))
            write_plane(out, wp, yf, yb, oh, ow, bias, relu)


@_jit_sums
def output_transform_adjoint(dy, n0, n1, th, tw, dm, dbp, lo, hi):
    """dm (36, >= F*(n1-n0)*th*tw) = A dY A^T of every 4x4 tile of dy[n0:n1] (zeros past
    OH/OW); dbp[f * (n1-n0) + n] = the sum of dy[n0 + n, f] (float64)."""
    _, f_, oh, ow = dy.shape
    k_ = n1 - n0
    nt = k_ * th * tw
    fs = dm.shape[1]
    wp = 4 * tw
    df = dy.ravel()
    mf = dm.ravel()
    ntp = th * (tw + 1)
    if ntp >= WIDE_TILES:  # vectorized over the plane's tiles (``_winograd4w``)
        for part in nb.prange(-(-(hi - lo) // PART)):
            # dY by phases, as output_transform's out: every plane writes the same places,
            # the others stay zero
            g = np.zeros(16 * ntp, dy.dtype)
            tmp = np.empty(24 * ntp, dy.dtype)
            tmp2 = np.empty(36 * ntp, dy.dtype)
            for fn in range(lo + part * PART, min(hi, lo + (part + 1) * PART)):
                f = fn // k_
                n = fn % k_
                yb = ((n + n0) * f_ + f) * oh * ow
                for r in range(oh):
                    to_phases(df, yb + r * ow, ow, 0, g,
                              (r & 3) * 4 * ntp + (r >> 2) * (tw + 1), ntp)
                acc = 0.0
                for k in range(oh * ow):
                    acc += df[_U(yb + k)]
                dbp[fn] = acc
                output_adjoint_plane(g, th, tw, mf, fs, f * nt + n * th * tw, tmp, tmp2)
        return
    for part in nb.prange(-(-(hi - lo) // NARROW_PART)):
        g = np.zeros(4 * th * wp, dy.dtype)
        for fn in range(lo + part * NARROW_PART, min(hi, lo + (part + 1) * NARROW_PART)):
            f = fn // k_
            n = fn % k_
            yb = ((n + n0) * f_ + f) * oh * ow
            dbp[fn] = stage_plane(df, yb, oh, ow, g, wp)
            for ty in range(th):
                o = f * nt + (n * th + ty) * tw
                for tx in range(tw):
                    s = 4 * ty * wp + 4 * tx
                    # columns: c_j = A g[:, j]
                    c0 = _a_(_load4(g, s, wp))
                    c1 = _a_(_load4(g, s + 1, wp))
                    c2 = _a_(_load4(g, s + 2, wp))
                    c3 = _a_(_load4(g, s + 3, wp))
                    # rows: dM[i, :] = (A g)[i, :] A^T
                    t = o + tx
                    _put6(mf, t, fs, _a(c0[0], c1[0], c2[0], c3[0]))
                    _put6(mf, t + 6 * fs, fs, _a(c0[1], c1[1], c2[1], c3[1]))
                    _put6(mf, t + 12 * fs, fs, _a(c0[2], c1[2], c2[2], c3[2]))
                    _put6(mf, t + 18 * fs, fs, _a(c0[3], c1[3], c2[3], c3[3]))
                    _put6(mf, t + 24 * fs, fs, _a(c0[4], c1[4], c2[4], c3[4]))
                    _put6(mf, t + 30 * fs, fs, _a(c0[5], c1[5], c2[5], c3[5]))


@_jit
def input_transform_adjoint(dv, n0, n1, pt, pl, th, tw, dx, lo, hi):
    """dx[n0:n1] = the sum over tiles of B dV B^T, at the positions input_transform read
    (positions in the padding are dropped); dx[n0:n1] is overwritten."""
    _, c_, h_, w_ = dx.shape
    k_ = n1 - n0
    nt = k_ * th * tw
    cs = dv.shape[1]
    hp, wp = 4 * th + 2, 4 * tw + 2
    vf = dv.ravel()
    xf = dx.ravel()
    t1 = tw + 1
    ntp = th * t1
    if ntp >= WIDE_TILES:  # vectorized over the plane's tiles (``_winograd4w``)
        ph = (th + 1) * t1
        q1 = max(0, min(w_, wp - pl))  # columns inside the tiles (q + pl < wp)
        for part in nb.prange(-(-(hi - lo) // PART)):
            d = np.empty(16 * ph + 8, dv.dtype)
            tmp = np.empty(36 * ntp, dv.dtype)
            tmp2 = np.empty(36 * ntp, dv.dtype)
            for cn in range(lo + part * PART, min(hi, lo + (part + 1) * PART)):
                c = cn // k_
                n = cn % k_
                xb = ((n + n0) * c_ + c) * h_ * w_
                input_adjoint_plane(vf, cs, c * nt + n * th * tw, th, tw, d, tmp, tmp2)
                for r in range(h_):  # by phases (r + pt, q + pl >= 0: & and >>)
                    rr = r + pt
                    xr = xb + r * w_
                    q0 = 0
                    if rr < hp:
                        from_phases(d, (rr & 3) * 4 * ph + (rr >> 2) * t1, ph, pl, xf, xr, q1)
                        q0 = q1
                    for q in range(q0, w_):
                        xf[_U(xr + q)] = 0
        return
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
                    # rows: r_i = dV[i, :] B^T
                    r0 = _b_(_load6(vf, t, cs))
                    r1 = _b_(_load6(vf, t + 6 * cs, cs))
                    r2 = _b_(_load6(vf, t + 12 * cs, cs))
                    r3 = _b_(_load6(vf, t + 18 * cs, cs))
                    r4 = _b_(_load6(vf, t + 24 * cs, cs))
                    r5 = _b_(_load6(vf, t + 30 * cs, cs))
                    # columns: B r[:, j], added into column j of the tile's place in the plane
                    s = 4 * ty * wp + 4 * tx
                    _add6(d, s, wp, _b(r0[0], r1[0], r2[0], r3[0], r4[0], r5[0]))
                    _add6(d, s + 1, wp, _b(r0[1], r1[1], r2[1], r3[1], r4[1], r5[1]))
                    _add6(d, s + 2, wp, _b(r0[2], r1[2], r2[2], r3[2], r4[2], r5[2]))
                    _add6(d, s + 3, wp, _b(r0[3], r1[3], r2[3], r3[3], r4[3], r5[3]))
                    _add6(d, s + 4, wp, _b(r0[4], r1[4], r2[4], r3[4], r4[4], r5[4]))
                    _add6(d, s + 5, wp, _b(r0[5], r1[5], r2[5], r3[5], r4[5], r5[5]))
            for r in range(h_):
                for q in range(w_):
                    rr, qq = r + pt, q + pl
                    inside = rr < hp and qq < wp
                    xf[_U(xb + r * w_ + q)] = d[_U(rr * wp + qq)] if inside else dv.dtype.type(0)


for _name, _planes in PLANES.items():  # the range of planes as F(2x2)'s
    globals()[_name] = _dispatch(globals()[_name], split=_planes, pieces=pieces)


# -- the compiled drivers of the blocks ------------------------------------------------------
# Compiled drivers of the Winograd convolution's blocks (float32, register-tiled products).
#
# ``winograd.forward`` and ``backward`` loop over blocks of samples: per block the transforms
# (compiled) and a batched GEMM. With the GEMM in BLAS that loop is Python: a few
# dispatches and a BLAS call a block, and with 2 threads each taken under the GIL. Here one
# compiled call runs a thread's whole share: each block's transforms and products back to
# back, the products on the register tiles (``_vgemm``; numba code can call them, not
# BLAS), without the GIL. Threads take block numbers from a shared counter
# (``_atomics.fetch_add``) or every ``step``-th block. The blocks are ``winograd._plan``'s.
#
# Where they run is ``plan.drivers_apply`` / ``plan.winograd_drivers``.
_serial = nb.njit(cache=True, nogil=True)
# the serial twins (``_dispatch``): each call here is one thread's, over all its planes
_IN4, _OUT4, _OADJ4, _IADJ4 = (input_transform.serial, output_transform.serial,
                              output_transform_adjoint.serial, input_transform_adjoint.serial)


@_serial
def _first(counter, first, step):
    """The first block this thread takes: the counter's next number (step 0), else first."""
    return fetch_add(counter, 0) if step == 0 else first


@_serial
def _then(counter, i, step):
    """The block after i: the counter's next number (step 0), else i + step."""
    return fetch_add(counter, 0) if step == 0 else i + step


@_serial
def forward_blocks(x, u, bias, use_b, relu, blocks, counter, first, step, pt, pl, th, tw,
                   v2, m2, y):
    """y of the samples of every block taken (blocks[i] = (n0, n1)): V = B^T d B into v2
    (P, >= C*T), M = U V (u (P, F, C)) into m2 (P, >= F*T), y = A^T M A (+ bias, ReLU)."""
    p, f, c = u.shape
    uf, vf, mf = u.ravel(), v2.ravel(), m2.ravel()
    i = _first(counter, first, step)
    while i < blocks.shape[0]:
        n0, n1 = blocks[i, 0], blocks[i, 1]
        t = (n1 - n0) * th * tw
        _IN4(x, n0, n1, pt, pl, th, tw, v2, 0, c * (n1 - n0))
        matmul_flat(uf, f * c, c, 1, vf, v2.shape[1], t, mf, m2.shape[1], t, p, f, c, t)
        _OUT4(m2, bias, use_b, relu, n0, n1 - n0, th, tw, y, 0, f * (n1 - n0))
        i = _then(counter, i, step)


@_serial
def backward_blocks(dy, x, u, blocks, counter, first, step, pt, pl, th, tw, v2, m2, dbp,
                    du, db, slot, need_dx, dx):
    """Over every block taken: dM = A dY A^T into m2, V into v2, dU (+)= dM V^T into
    du[s] (P, F, C) and the sums of dy into db[s] (float64), s = the block's number when
    ``slot`` < 0, else ``slot`` (its first block sets it, the others add); when
    ``need_dx``, dV = U^T dM into v2 and dx[n0:n1] = the scatter-add of B dV B^T."""
    p, f, c = u.shape
    uf, vf, mf = u.ravel(), v2.ravel(), m2.ravel()
    pfc = p * f * c
    duf = du.ravel()
    started = False
    i = _first(counter, first, step)
    while i < blocks.shape[0]:
        n0, n1 = blocks[i, 0], blocks[i, 1]
        k = n1 - n0
        t = k * th * tw
        _OADJ4(dy, n0, n1, th, tw, m2, dbp, 0, f * (n1 - n0))
        _IN4(x, n0, n1, pt, pl, th, tw, v2, 0, c * (n1 - n0))
        s = i if slot < 0 else slot
        add = slot >= 0 and started
        matmul_nt_flat(mf, m2.shape[1], t, vf, v2.shape[1], t, duf[s * pfc:], f * c, c, p, f,
                       c, t, add)
        for ff in range(f):
            acc = 0.0
            for n in range(k):
                acc += dbp[_U(ff * k + n)]
            db[s, ff] = db[s, ff] + acc if add else acc
        started = True
        if need_dx:
            matmul_flat(uf, f * c, 1, c, mf, m2.shape[1], t, vf, v2.shape[1], t, p, c, f, t)
            _IADJ4(v2, n0, n1, pt, pl, th, tw, dx, 0, c * (n1 - n0))
        i = _then(counter, i, step)


# -- a driver's arguments as a job of the block threads (``_team_jobs`` runs it) -------------
FORWARD, BACKWARD = PYTHON + 1, PYTHON + 2


@_serial
def encode_forward(row, x, u, bias, use_b, relu, blocks, counter, first, step, pt, pl, th,
                   tw, v2, m2, y):
    """``forward_blocks``' arguments (float32 arrays) as a FORWARD job."""
    row[0] = FORWARD
    k = 1
    k = put(row, k, x)
    k = put(row, k, u)
    k = put(row, k, bias)
    k = put(row, k, blocks)
    k = put(row, k, counter)
    k = put(row, k, v2)
    k = put(row, k, m2)
    k = put(row, k, y)
    row[k], row[k + 1], row[k + 2], row[k + 3] = use_b, relu, first, step
    row[k + 4], row[k + 5], row[k + 6], row[k + 7] = pt, pl, th, tw


@_serial
def encode_backward(row, dy, x, u, blocks, counter, first, step, pt, pl, th, tw, v2, m2,
                    dbp, du, db, slot, need_dx, dx):
    """``backward_blocks``' arguments (float32 arrays; dbp and db float64) as a BACKWARD
    job."""
    row[0] = BACKWARD
    k = 1
    k = put(row, k, dy)
    k = put(row, k, x)
    k = put(row, k, u)
    k = put(row, k, blocks)
    k = put(row, k, counter)
    k = put(row, k, v2)
    k = put(row, k, m2)
    k = put(row, k, dbp)
    k = put(row, k, du)
    k = put(row, k, db)
    k = put(row, k, dx)
    row[k], row[k + 1], row[k + 2], row[k + 3] = first, step, pt, pl
    row[k + 4], row[k + 5], row[k + 6], row[k + 7] = th, tw, slot, need_dx
