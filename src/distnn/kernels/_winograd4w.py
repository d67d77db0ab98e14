"""Per-plane F(4x4, 3x3) transforms vectorized over tiles, for planes of many tiles.

``_winograd4``'s tile loops run one tile at a time (36 values in scalar locals): with few
tiles a row, LLVM's vectors (16 floats) never fill, but on a 32x32 output (8 tiles a row)
the scalar loops cost 1.5x F(2x2)'s. Here the tiles of one (sample, channel) plane are
numbered T = ty * (tw + 1) + tx, one spare column per tile row, and the plane is stored by
phases (row r, column q at ((r % 4) * 4 + q % 4) * ph + (r // 4) * (tw + 1) + q // 4), so
that element (i, j) of every tile is one contiguous run over T: each 1-D transform is then a
loop over T that LLVM vectorizes. The spare tiles are computed and dropped when the (36,
tiles) rows are copied to or from the GEMM's arrays. Measured, 16 channels 32x32, blocks of
3 samples as the driver runs them, ms per 64 samples (tile by tile -> here; F(2x2)): input
2.3 -> 1.3 (1.3), output 1.5 -> 1.3 (0.4), output adjoint 1.2 -> 1.3 (1.4), input adjoint
3.5 -> 1.7 (2.0). On small planes the short runs cost more than they save (input transform
at 8x8: 0.15 ms tile by tile, 0.42 here), so ``_winograd4`` calls these from WIDE_TILES
tiles a plane.
"""
from __future__ import annotations

import numba as nb
import numpy as np

from ._numba_runtime import _U

_plane = nb.njit(cache=True, nogil=True)
# the 1-D transforms, inlined by numba into their callers (here and ``_winograd4``'s tile
# loops), so that each is compiled under its caller's fast-math flags
_inline = nb.njit(inline="always", cache=True, nogil=True)

# th * (tw + 1) from which the planes are transformed here (32x32 outputs: 72; 16x16: 20)
WIDE_TILES = 48

# The transforms' integer coefficients as float32 constants: with Python ints numba types
# ``4 * d`` of a float32 d as float64, and every transform ran in float64 with conversions
# on both sides (half the vector width; measured on AVX2, 16->16 32x32 batch 64, 1 thread:
# input transform 5.7 -> 3.9 ms). float32 x float32 stays float32 and float64 x float32 is
# float64, so the float64 kernels are unchanged; 2, 4, 5 and 8 are exact in float32.
_F2, _F4, _F5, _F8 = np.float32(2), np.float32(4), np.float32(5), np.float32(8)


@_inline
def _bt(d0, d1, d2, d3, d4, d5):
    """B^T d: rows (4, 0, -5, 0, 1, 0), (0, -4, -4, 1, 1, 0), (0, 4, -4, -1, 1, 0),
    (0, -2, -1, 2, 1, 0), (0, 2, -1, -2, 1, 0), (0, 4, 0, -5, 0, 1)."""
    p = d4 - _F4 * d2
    q = d3 - _F4 * d1
    r = d4 - d2
    s = _F2 * (d3 - d1)
    return _F4 * d0 - _F5 * d2 + d4, p + q, p - q, r + s, r - s, _F4 * d1 - _F5 * d3 + d5


@_inline
def _at(m0, m1, m2, m3, m4, m5):
    """A^T m: rows (1, 1, 1, 1, 1, 0), (0, 1, -1, 2, -2, 0), (0, 1, 1, 4, 4, 0),
    (0, 1, -1, 8, -8, 1)."""
    a = m1 + m2
    b = m1 - m2
    c = m3 + m4
    d = m3 - m4
    return m0 + a + c, b + _F2 * d, a + _F4 * c, b + _F8 * d + m5


@_inline
def _a(g0, g1, g2, g3):
    """A g (the transpose of ``_at``)."""
    e = g0 + g2
    o = g1 + g3
    e4 = g0 + _F4 * g2
    o8 = _F2 * g1 + _F8 * g3
    return g0, e + o, e - o, e4 + o8, e4 - o8, g3


@nb.njit(cache=True, nogil=True, inline="always")
def to_phases(src, s, n, off, dst, d0, ph):
    """dst[d0 + (qq & 3) * ph + (qq >> 2)] = src[s + q] for q < n, qq = q + off >= 0: one
    plane row into its 4 column phases, 4 consecutive values a step where qq % 4 == 0 (the
    strided loop per phase ran scalar; this one LLVM vectorizes as interleaved loads)."""
    q = 0
    while q < n and (q + off) & 3:
        qq = q + off
        dst[_U(d0 + (qq & 3) * ph + (qq >> 2))] = src[_U(s + q)]
        q += 1
    i0 = d0 + ((q + off) >> 2)
    b = s + q
    m = (n - q) >> 2 if n > q else 0
    for i in range(m):
        dst[_U(i0 + i)] = src[_U(b + 4 * i)]
        dst[_U(i0 + ph + i)] = src[_U(b + 4 * i + 1)]
        dst[_U(i0 + 2 * ph + i)] = src[_U(b + 4 * i + 2)]
        dst[_U(i0 + 3 * ph + i)] = src[_U(b + 4 * i + 3)]
    q += 4 * m
    while q < n:
        qq = q + off
        dst[_U(d0 + (qq & 3) * ph + (qq >> 2))] = src[_U(s + q)]
        q += 1


@nb.njit(cache=True, nogil=True, inline="always")
def from_phases(src, d0, ph, off, dst, s, n):
    """dst[s + q] = src[d0 + (qq & 3) * ph + (qq >> 2)] for q < n, qq = q + off >= 0: the
    inverse of ``to_phases``."""
    q = 0
    while q < n and (q + off) & 3:
        qq = q + off
        dst[_U(s + q)] = src[_U(d0 + (qq & 3) * ph + (qq >> 2))]
        q += 1
    i0 = d0 + ((q + off) >> 2)
    b = s + q
    m = (n - q) >> 2 if n > q else 0
    for i in range(m):
        dst[_U(b + 4 * i)] = src[_U(i0 + i)]
        dst[_U(b + 4 * i + 1)] = src[_U(i0 + ph + i)]
        dst[_U(b + 4 * i + 2)] = src[_U(i0 + 2 * ph + i)]
        dst[_U(b + 4 * i + 3)] = src[_U(i0 + 3 * ph + i)]
    q += 4 * m
    while q < n:
        qq = q + off
        dst[_U(s + q)] = src[_U(d0 + (qq & 3) * ph + (qq >> 2))]
        q += 1


@nb.njit(cache=True, nogil=True, inline="always")
def _copy(a, src, b, dst, n):
    """b[dst:dst + n] = a[src:src + n], 4 at a time: one tile row (7-9 values) is too short
    for LLVM's loop vectorizer (all scalar), 4 consecutive statements it packs (SLP)."""
    i = 0
    while i + 4 <= n:
        b[_U(dst + i)] = a[_U(src + i)]
        b[_U(dst + i + 1)] = a[_U(src + i + 1)]
        b[_U(dst + i + 2)] = a[_U(src + i + 2)]
        b[_U(dst + i + 3)] = a[_U(src + i + 3)]
        i += 4
    while i < n:
        b[_U(dst + i)] = a[_U(src + i)]
        i += 1


@_plane
def input_plane(xf, xb, h_, w_, pt, pl, th, tw, vf, cs, o, d, tmp, tmp2):
    """Rows o, o + cs, ... (36 of them, th*tw values each from o) of v = B^T d B of the tiles
    of the plane at xf[xb:] (h_, w_); d (>= 16 * (th + 1) * (tw + 1) + 1; spare tiles read
    one past their phase), tmp, tmp2 (36 * th * (tw + 1)) are work arrays."""
    t1 = tw + 1
    ph = (th + 1) * t1
    ntp = th * t1
    d[:] = 0
    q0, q1 = max(0, -pl), min(w_, 4 * tw + 2 - pl)
    for r in range(max(0, -pt), min(h_, 4 * th + 2 - pt)):
        rr = r + pt
        to_phases(xf, xb + r * w_ + q0, q1 - q0, q0 + pl, d,
                  (rr % 4) * 4 * ph + (rr // 4) * t1, ph)
    for j in range(6):  # columns: tmp[i, j] = (B^T d)[i, j], row (6 i + j) of tmp
        o0 = (j % 4) * ph + j // 4
        o4 = o0 + t1
        o5 = o0 + 4 * ph + t1
        for t in range(ntp):
            r0, r1, r2, r3, r4, r5 = _bt(d[_U(o0 + t)], d[_U(o0 + 4 * ph + t)],
                                         d[_U(o0 + 8 * ph + t)], d[_U(o0 + 12 * ph + t)],
                                         d[_U(o4 + t)], d[_U(o5 + t)])
            tmp[_U(j * ntp + t)] = r0
            tmp[_U((6 + j) * ntp + t)] = r1
            tmp[_U((12 + j) * ntp + t)] = r2
            tmp[_U((18 + j) * ntp + t)] = r3
            tmp[_U((24 + j) * ntp + t)] = r4
            tmp[_U((30 + j) * ntp + t)] = r5
    for i in range(6):  # rows: tmp2[i, b] = (B^T d B)[i, b], row 6 i + b
        b = 6 * i * ntp
        for t in range(ntp):
            r0, r1, r2, r3, r4, r5 = _bt(tmp[_U(b + t)], tmp[_U(b + ntp + t)],
                                         tmp[_U(b + 2 * ntp + t)], tmp[_U(b + 3 * ntp + t)],
                                         tmp[_U(b + 4 * ntp + t)], tmp[_U(b + 5 * ntp + t)])
            tmp2[_U(b + t)] = r0
            tmp2[_U(b + ntp + t)] = r1
            tmp2[_U(b + 2 * ntp + t)] = r2
            tmp2[_U(b + 3 * ntp + t)] = r3
            tmp2[_U(b + 4 * ntp + t)] = r4
            tmp2[_U(b + 5 * ntp + t)] = r5
    for k in range(36):  # drop the spare column
        for ty in range(th):
            _copy(tmp2, k * ntp + ty * t1, vf, k * cs + o + ty * tw, tw)


@_plane
def output_plane(mf, fs, o, th, tw, tmp, tmp2, out):
    """out (16 * th * (tw + 1)) = A^T M A of the tiles whose 36 rows start at mf[o], mf[o +
    fs], ...: output row r, column q of the plane at ((r % 4) * 4 + q % 4) * th * (tw + 1) +
    (r // 4) * (tw + 1) + q // 4."""
    t1 = tw + 1
    ntp = th * t1
    for k in range(36):  # add the spare column
        for ty in range(th):
            dst = k * ntp + ty * t1
            _copy(mf, k * fs + o + ty * tw, tmp, dst, tw)
            tmp[_U(dst + tw)] = 0
    # columns first (measured 2x faster here than rows first, as the other transforms)
    for b in range(6):  # columns: tmp2[p, b] = (A^T M)[p, b], row 6 p + b
        for t in range(ntp):
            r0, r1, r2, r3 = _at(tmp[_U(b * ntp + t)], tmp[_U((6 + b) * ntp + t)],
                                 tmp[_U((12 + b) * ntp + t)], tmp[_U((18 + b) * ntp + t)],
                                 tmp[_U((24 + b) * ntp + t)], tmp[_U((30 + b) * ntp + t)])
            tmp2[_U(b * ntp + t)] = r0
            tmp2[_U((6 + b) * ntp + t)] = r1
            tmp2[_U((12 + b) * ntp + t)] = r2
            tmp2[_U((18 + b) * ntp + t)] = r3
    for p in range(4):  # rows: out[p, j] = (A^T M A)[p, j], phase plane 4 p + j
        e = 6 * p * ntp
        o4 = 4 * p * ntp
        for t in range(ntp):
            c0, c1, c2, c3 = _at(tmp2[_U(e + t)], tmp2[_U(e + ntp + t)],
                                 tmp2[_U(e + 2 * ntp + t)], tmp2[_U(e + 3 * ntp + t)],
                                 tmp2[_U(e + 4 * ntp + t)], tmp2[_U(e + 5 * ntp + t)])
            out[_U(o4 + t)] = c0
            out[_U(o4 + ntp + t)] = c1
            out[_U(o4 + 2 * ntp + t)] = c2
            out[_U(o4 + 3 * ntp + t)] = c3


@_plane
def output_adjoint_plane(g, th, tw, mf, fs, o, tmp, tmp2):
    """Rows o, o + fs, ... of dM = A dY A^T for g, the plane's dY by phases (as
    ``output_plane``'s out, zeros past OH/OW)."""
    t1 = tw + 1
    ntp = th * t1
    for j in range(4):  # columns: tmp[a, j] = (A g)[a, j], row 4 a + j
        for t in range(ntp):
            a0, a1, a2, a3, a4, a5 = _a(g[_U(j * ntp + t)], g[_U((4 + j) * ntp + t)],
                                        g[_U((8 + j) * ntp + t)], g[_U((12 + j) * ntp + t)])
            tmp[_U(j * ntp + t)] = a0
            tmp[_U((4 + j) * ntp + t)] = a1
            tmp[_U((8 + j) * ntp + t)] = a2
            tmp[_U((12 + j) * ntp + t)] = a3
            tmp[_U((16 + j) * ntp + t)] = a4
            tmp[_U((20 + j) * ntp + t)] = a5
    for i in range(6):  # rows: dM[i, b] = (A g A^T)[i, b], row 6 i + b
        b = 4 * i * ntp
        for t in range(ntp):
            r0, r1, r2, r3, r4, r5 = _a(tmp[_U(b + t)], tmp[_U(b + ntp + t)],
                                        tmp[_U(b + 2 * ntp + t)], tmp[_U(b + 3 * ntp + t)])
            e = 6 * i * ntp
            tmp2[_U(e + t)] = r0
            tmp2[_U(e + ntp + t)] = r1
            tmp2[_U(e + 2 * ntp + t)] = r2
            tmp2[_U(e + 3 * ntp + t)] = r3
            tmp2[_U(e + 4 * ntp + t)] = r4
            tmp2[_U(e + 5 * ntp + t)] = r5
    for k in range(36):  # drop the spare column
        for ty in range(th):
            _copy(tmp2, k * ntp + ty * t1, mf, k * fs + o + ty * tw, tw)


@_inline
def _b(v0, v1, v2, v3, v4, v5):
    """B v (the transpose of ``_bt``)."""
    return (_F4 * v0, _F4 * (v2 - v1) + _F2 * (v4 - v3) + _F4 * v5,
            -_F5 * v0 - _F4 * (v1 + v2) - (v3 + v4), (v1 - v2) + _F2 * (v3 - v4) - _F5 * v5,
            v0 + v1 + v2 + v3 + v4, v5)


@_plane
def input_adjoint_plane(vf, cs, o, th, tw, d, tmp, tmp2):
    """d (16 * (th + 1) * (tw + 1) + 8, by phases as in ``input_plane``) = the sum over the
    tiles of B dV B^T, dV's 36 rows from vf[o], vf[o + cs], ... Spare tiles get zeros, so
    what they add (also where their places wrap into the next tile row) is zero."""
    t1 = tw + 1
    ph = (th + 1) * t1
    ntp = th * t1
    for k in range(36):  # add the spare column (zeros)
        for ty in range(th):
            dst = k * ntp + ty * t1
            _copy(vf, k * cs + o + ty * tw, tmp, dst, tw)
            tmp[_U(dst + tw)] = 0
    for i in range(6):  # rows: tmp2[i, j] = (dV B^T)[i, j], row 6 i + j
        b = 6 * i * ntp
        for t in range(ntp):
            e0, e1, e2, e3, e4, e5 = _b(tmp[_U(b + t)], tmp[_U(b + ntp + t)],
                                        tmp[_U(b + 2 * ntp + t)], tmp[_U(b + 3 * ntp + t)],
                                        tmp[_U(b + 4 * ntp + t)], tmp[_U(b + 5 * ntp + t)])
            tmp2[_U(b + t)] = e0
            tmp2[_U(b + ntp + t)] = e1
            tmp2[_U(b + 2 * ntp + t)] = e2
            tmp2[_U(b + 3 * ntp + t)] = e3
            tmp2[_U(b + 4 * ntp + t)] = e4
            tmp2[_U(b + 5 * ntp + t)] = e5
    for j in range(6):  # columns: tmp[i, j] = (B dV B^T)[i, j]
        for t in range(ntp):
            c0, c1, c2, c3, c4, c5 = _b(tmp2[_U(j * ntp + t)], tmp2[_U((6 + j) * ntp + t)],
                                        tmp2[_U((12 + j) * ntp + t)],
                                        tmp2[_U((18 + j) * ntp + t)],
                                        tmp2[_U((24 + j) * ntp + t)],
                                        tmp2[_U((30 + j) * ntp + t)])
            tmp[_U(j * ntp + t)] = c0
            tmp[_U((6 + j) * ntp + t)] = c1
            tmp[_U((12 + j) * ntp + t)] = c2
            tmp[_U((18 + j) * ntp + t)] = c3
            tmp[_U((24 + j) * ntp + t)] = c4
            tmp[_U((30 + j) * ntp + t)] = c5
    d[:] = 0
    for i in range(6):  # element (i, j) of every tile into its place (distinct over t)
        for j in range(6):
            dst = ((i % 4) * 4 + j % 4) * ph + (i // 4) * t1 + j // 4
            src = (6 * i + j) * ntp
            for t in range(ntp):
                d[_U(dst + t)] += tmp[_U(src + t)]


# -- shared by F(2x2) and F(4x4)'s tile-by-tile loops (``_winograd``, ``_winograd4``) ------
# Planes per parallel iteration of the tile-by-tile loops (here and in ``_winograd4``), which
# make their plane buffer once per iteration: zero-filled ones keep their zero border from
# plane to plane (every plane writes the same places), an accumulator is cleared for each.
# One allocation a plane cost up to 44% of a small plane's transform (F(4x4) output
# transform of 64 x 512 4x4 planes, 1 thread: 4.7 ms against 2.7; 64 x 64 8x8: 0.76 against
# 0.61).
NARROW_PART = 32


@nb.njit(cache=True, nogil=True, inline="always")
def write_plane(out, wp, yf, yb, oh, ow, bias, relu):
    """The (oh, ow) corner of ``out`` (row stride wp) + bias, then max(., 0) when relu, into
    the plane of the flat y that starts at yb."""
    z = out.dtype.type(0)  # float32 for float32 (``out[0] * 0`` is float64 in numba)
    for r in range(oh):
        for q in range(ow):
            val = out[_U(r * wp + q)] + bias
            if relu and val < z:
                val = z
            yf[_U(yb + r * ow + q)] = val


@nb.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"}, inline="always")
def stage_plane(df, yb, oh, ow, g, wp):
    """The (oh, ow) plane of the flat dy at yb into g (row stride wp); returns its sum
    (float64, for the bias gradient)."""
    acc = 0.0
    for r in range(oh):
        for q in range(ow):
            val = df[_U(yb + r * ow + q)]
            g[_U(r * wp + q)] = val
            acc += val
    return acc


# Each transform's planes, from its arguments (its range [lo, hi) left out).
PLANES = {
    "input_transform": lambda a: a[0].shape[1] * (a[2] - a[1]),  # x, n0, n1
    "output_transform": lambda a: a[8].shape[1] * a[5],  # ..., nk, th, tw, y
    "output_transform_adjoint": lambda a: a[0].shape[1] * (a[2] - a[1]),  # dy, n0, n1
    "input_transform_adjoint": lambda a: a[7].shape[1] * (a[2] - a[1]),  # dv, n0, n1 .. dx
}
