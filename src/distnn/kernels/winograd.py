"""Winograd F(2x2, 3x3) convolution for 3x3, stride-1, undilated kernels (compiled, numba).

Each 4x4 input tile d (stride 2, overlapping by 2) of every channel becomes
V = B^T d B, each filter g becomes U = G g G^T, and a 2x2 output tile is
Y = A^T (sum_c U ⊙ V) A. The sum over channels at each of the 16 transformed positions
is one GEMM, so a block of tiles costs one batched ``np.matmul`` (16, F, C) @ (16, C, T)
in BLAS: 16 multiplies per 4 outputs instead of 36 (2.25x fewer). Tiles are processed in
blocks of samples sized so that V and M = U V stay in cache between the transform and
the GEMM.

Backward is the exact adjoint of that computed map (not a second, flipped convolution):
dM = A dY A^T per tile, dV = U^T dM and dx = scatter-add of B dV B^T (backward-data),
dU = dM V^T and dw = G^T dU G (backward-weights), each again one batched GEMM. So the
layer's gradients are the true gradients of the function it computes, and gradient checks
hold to rounding.

Rounding (u = 2^-24 for float32): all transform coefficients are 0, ±1/2 or ±1, so
U, V, dM, dV are exact up to the rounding of their additions. With E the same pipeline
evaluated with |x|, |w| and the absolute values of every transform matrix, the standard
forward-error argument gives, per output element, |y_winograd - y| <= gamma(C + 10) * E
(gamma(n) = n u / (1 - n u)); for dx, E uses |dy|, |w| and n = F + 10; for dw, |dy|, |x|
and n = N*tiles + 10 (the sum over tiles; blocked summation in BLAS does far better).
E itself is at most 4 x 2.25 x 9 = 81 times conv(|x|, |w|) (row sums of |B^T|, |G|,
|A^T| squared), against 1x for im2col; tests/kernels/test_winograd.py checks the bound
per layer shape against the float64 reference.
"""
from __future__ import annotations

import numba as nb
import numpy as np

from ._numba import _U, _dispatch, get_num_threads, scratch

# G (4x3): U = G g G^T
G = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0.0, 0.0, 1.0]])
BT = np.array([[1.0, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]])
AT = np.array([[1.0, 1, 1, 0], [0, 1, -1, -1]])

_jit = nb.njit(parallel=True, cache=True, nogil=True)
_jit_sums = nb.njit(parallel=True, cache=True, nogil=True, fastmath={"reassoc", "contract"})


def tiles(oh: int, ow: int) -> tuple[int, int]:
    """Tile rows and columns of 2x2 output tiles covering an (oh, ow) output."""
    return (oh + 1) // 2, (ow + 1) // 2


def weights_transform(w: np.ndarray) -> np.ndarray:
    """U (16, F, C) = G w G^T for w (F, C, 3, 3), row (a, b) of the 4x4 transform."""
    u = np.einsum("ai,fcij,bj->abfc", G.astype(w.dtype), w, G.astype(w.dtype), optimize=True)
    return np.ascontiguousarray(u.reshape(16, w.shape[0], w.shape[1]))


def weights_transform_adjoint(du: np.ndarray, out: np.ndarray) -> np.ndarray:
    """dw (F, C, 3, 3) = G^T dU G for dU (16, F, C), written into ``out``."""
    f, c = du.shape[1:]
    g = G.astype(du.dtype)
    out[...] = np.einsum("ai,abfc,bj->fcij", g, du.reshape(4, 4, f, c), g, optimize=True)
    return out


@_jit
def input_transform(x, n0, n1, pt, pl, th, tw, v):
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
    for cn in nb.prange(c_ * k_):
        c = cn // k_
        n = cn % k_
        xb = ((n + n0) * c_ + c) * h_ * w_
        d = np.zeros(hp * wp, x.dtype)
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
def output_transform(m, b, use_b, relu, n0, nk, th, tw, y):
    """y[n0:n0+k] (k, F, OH, OW) = A^T M A of every tile of m (16, >= F*k*th*tw), plus b[f]
    when use_b, then max(., 0) when relu; tiles past OH/OW are cut."""
    _, f_, oh, ow = y.shape
    k_ = nk
    nt = k_ * th * tw
    fs = m.shape[1]
    wp = 2 * tw
    mf = m.ravel()
    yf = y.ravel()
    for fn in nb.prange(f_ * k_):
        f = fn // k_
        n = fn % k_
        yb = ((n + n0) * f_ + f) * oh * ow
        bias = b[f] if use_b else mf[0] * 0
        z = mf[0] * 0
        out = np.empty(2 * th * wp, m.dtype)
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
        for r in range(oh):
            for q in range(ow):
                val = out[_U(r * wp + q)] + bias
                if relu and val < z:
                    val = z
                yf[_U(yb + r * ow + q)] = val


@_jit_sums
def output_transform_adjoint(dy, n0, n1, th, tw, dm, dbp):
    """dm (16, >= F*(n1-n0)*th*tw) = A dY A^T of every 2x2 tile of dy[n0:n1] (zeros past
    OH/OW); dbp[f * (n1-n0) + n] = the sum of dy[n0 + n, f] (float64)."""
    _, f_, oh, ow = dy.shape
    k_ = n1 - n0
    nt = k_ * th * tw
    fs = dm.shape[1]
    wp = 2 * tw
    df = dy.ravel()
    mf = dm.ravel()
    for fn in nb.prange(f_ * k_):
        f = fn // k_
        n = fn % k_
        yb = ((n + n0) * f_ + f) * oh * ow
        g = np.zeros(2 * th * wp, dy.dtype)
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
def input_transform_adjoint(dv, n0, n1, pt, pl, th, tw, dx):
    """dx[n0:n1] = the sum over tiles of B dV B^T, at the positions input_transform read
    (positions in the padding are dropped); dx[n0:n1] is overwritten."""
    _, c_, h_, w_ = dx.shape
    k_ = n1 - n0
    nt = k_ * th * tw
    cs = dv.shape[1]
    hp, wp = 2 * th + 2, 2 * tw + 2
    vf = dv.ravel()
    xf = dx.ravel()
    for cn in nb.prange(c_ * k_):
        c = cn // k_
        n = cn % k_
        xb = ((n + n0) * c_ + c) * h_ * w_
        d = np.zeros(hp * wp, dv.dtype)
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
                xf[_U(xb + r * w_ + q)] = d[_U(rr * wp + qq)] if inside else d[0] * 0


for _name in ("input_transform", "output_transform", "output_transform_adjoint",
              "input_transform_adjoint"):
    globals()[_name] = _dispatch(globals()[_name])

# Samples per block: V and M of a block about this size, so they are still in cache when
# the GEMM reads them.
BLOCK_BYTES = 1 << 20


MIN_TILES = 256

# Elements added to the row stride of the (16, rows * tiles) work arrays: with a stride of
# a power of two the 16 rows that every tile reads or writes land in the same cache sets
# (measured 16->16 32x32: the input transform 22 ms without, ms with).
PAD = 16


def _blocks(n: int, per_sample: int, tiles_per_sample: int, weight_bytes: int):
    # each thread transforms its share of a block in its own core's cache; bigger blocks
    # also mean fewer parallel launches and GEMMs big enough for BLAS to split
    k = BLOCK_BYTES * get_num_threads() // max(per_sample, 1)
    if weight_bytes > BLOCK_BYTES // 4:
        # big U: at least MIN_TILES tiles a GEMM, or re-reading U for every block costs
        # more than V and M leaving the cache (256->256 at 8x8: 32 tiles a block otherwise)
        k = max(k, -(-MIN_TILES // tiles_per_sample))
    k = max(1, min(n, k))
    return k, [(n0, min(n, n0 + k)) for n0 in range(0, n, k)]


# forward keeps V for backward (in the layer's work arrays) up to this size; above it,
# backward transforms the input again (16->16 at 32x32, batch 64: 16 MB a layer)
KEEP_BYTES = 16 << 20


def _kept(kept: np.ndarray, i: int, rows: int, t: int):
    """Block i of a kept V: the (16, S) array the kernels take and its GEMM view."""
    return kept[i], kept[i][:, :rows * t].reshape(16, rows, t)


def _work(name: str, rows: int, t: int, dtype):
    """A (16, rows * t + PAD) work array and its (16, rows, t) view for the GEMMs."""
    a2 = scratch(name, (16, rows * t + PAD), dtype)
    return a2, a2[:, :rows * t].reshape(16, rows, t)


def forward(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, pt: int, pb: int, pl: int,
            pr: int, relu: bool = False, ws: dict | None = None
            ) -> tuple[np.ndarray, np.ndarray | None]:
    """y (N, F, OH, OW) = conv2d(x, w) + b (then ReLU when ``relu``) for w (F, C, 3, 3),
    stride 1, zero padding (top, bottom, left, right), and the transformed input V kept
    for ``backward`` (None when it is over KEEP_BYTES or no ``ws`` dict holds it)."""
    n, c, h, wd = x.shape
    f = w.shape[0]
    oh, ow = h + pt + pb - 2, wd + pl + pr - 2
    th, tw = tiles(oh, ow)
    x = np.ascontiguousarray(x)
    u = weights_transform(w)
    k, blocks = _blocks(n, 16 * (c + f) * th * tw * x.itemsize, th * tw,
                        16 * f * c * x.itemsize)
    y = np.empty((n, f, oh, ow), x.dtype)
    bias = np.zeros(1, x.dtype) if b is None else np.ascontiguousarray(b, x.dtype)
    kept = None
    if ws is not None and 16 * c * n * th * tw * x.itemsize <= KEEP_BYTES:
        shape = (len(blocks), 16, c * k * th * tw + PAD)
        kept = ws.get("wino_v")
        if kept is None or kept.shape != shape or kept.dtype != x.dtype:
            kept = ws["wino_v"] = np.empty(shape, x.dtype)
    for i, (n0, n1) in enumerate(blocks):
        t = (n1 - n0) * th * tw
        v2, v = _work("wino_v", c, t, x.dtype) if kept is None else _kept(kept, i, c, t)
        m2, m = _work("wino_m", f, t, x.dtype)
        input_transform(x, n0, n1, pt, pl, th, tw, v2)
        np.matmul(u, v, out=m)
        output_transform(m2, bias, b is not None, relu, n0, n1 - n0, th, tw, y)
    return y, kept


def backward(dy: np.ndarray, x: np.ndarray, w: np.ndarray, pt: int, pl: int,
             dw_out: np.ndarray, db_out: np.ndarray | None, need_dx: bool,
             kept: np.ndarray | None = None
             ) -> tuple[np.ndarray | None, np.ndarray, np.ndarray | None]:
    """(dx or None, dw, db or None) of ``forward`` (without ReLU) for dy (N, F, OH, OW):
    the exact adjoint of the Winograd map. dw and db are overwritten into the outputs.
    ``kept``: the V that forward kept (it is overwritten: one backward per forward)."""
    n, c, h, wd = x.shape
    f, oh, ow = dy.shape[1:]
    th, tw = tiles(oh, ow)
    dy = np.ascontiguousarray(dy)
    u = weights_transform(w)
    ut = u.transpose(0, 2, 1)
    k, blocks = _blocks(n, 16 * (c + f) * th * tw * x.itemsize, th * tw,
                        16 * f * c * x.itemsize)
    if kept is not None and kept.shape != (len(blocks), 16, c * k * th * tw + PAD):
        kept = None  # blocked differently (the thread count changed): transform again
    du = np.zeros((16, f, c), x.dtype)
    part = np.empty((16, f, c), x.dtype)
    db64 = np.zeros(f, np.float64)
    dbpbuf = np.empty(f * k, np.float64)
    dx = np.empty((n, c, h, wd), x.dtype) if need_dx else None
    for i, (n0, n1) in enumerate(blocks):
        t = (n1 - n0) * th * tw
        v2, v = _work("wino_v", c, t, x.dtype) if kept is None else _kept(kept, i, c, t)
        m2, dm = _work("wino_m", f, t, x.dtype)
        dbp = dbpbuf[:f * (n1 - n0)]
        output_transform_adjoint(dy, n0, n1, th, tw, m2, dbp)
        db64 += dbp.reshape(f, n1 - n0).sum(axis=1)
        if kept is None:
            input_transform(x, n0, n1, pt, pl, th, tw, v2)
        np.matmul(dm, v.transpose(0, 2, 1), out=part)
        du += part
        if need_dx:
            np.matmul(ut, dm, out=v)
            input_transform_adjoint(v2, n0, n1, pt, pl, th, tw, dx)
    weights_transform_adjoint(du, dw_out)
    if db_out is not None:
        db_out[...] = db64
    return dx, dw_out, db_out
