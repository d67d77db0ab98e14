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

from ._numba import _dispatch, _U, scratch

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
    """v (16, C, (n1-n0)*th*tw) = B^T d B of every 4x4 tile d of samples n0..n1-1 of x
    (N, C, H, W), tile (ty, tx) at input row 2*ty - pt, column 2*tx - pl, zeros outside."""
    _, c_, h_, w_ = x.shape
    nt = (n1 - n0) * th * tw
    cs = c_ * nt
    xf = x.ravel()
    vf = v.ravel()
    for cn in nb.prange(c_ * (n1 - n0)):
        c = cn // (n1 - n0)
        n = cn % (n1 - n0)
        xb = ((n + n0) * c_ + c) * h_ * w_
        d = np.empty(16, x.dtype)
        for ty in range(th):
            r0 = 2 * ty - pt
            for tx in range(tw):
                c0 = 2 * tx - pl
                if r0 >= 0 and r0 + 4 <= h_ and c0 >= 0 and c0 + 4 <= w_:
                    for a in range(4):
                        s = xb + (r0 + a) * w_ + c0
                        for b in range(4):
                            d[a * 4 + b] = xf[_U(s + b)]
                else:
                    for a in range(4):
                        for b in range(4):
                            r = r0 + a
                            q = c0 + b
                            if 0 <= r < h_ and 0 <= q < w_:
                                d[a * 4 + b] = xf[_U(xb + r * w_ + q)]
                            else:
                                d[a * 4 + b] = 0
                for b in range(4):  # rows: B^T d
                    t0 = d[b] - d[8 + b]
                    t1 = d[4 + b] + d[8 + b]
                    t2 = d[8 + b] - d[4 + b]
                    t3 = d[4 + b] - d[12 + b]
                    d[b], d[4 + b], d[8 + b], d[12 + b] = t0, t1, t2, t3
                o = c * nt + (n * th + ty) * tw + tx
                for a in range(4):  # columns: (B^T d) B
                    e0, e1, e2, e3 = d[4 * a], d[4 * a + 1], d[4 * a + 2], d[4 * a + 3]
                    vf[_U((4 * a) * cs + o)] = e0 - e2
                    vf[_U((4 * a + 1) * cs + o)] = e1 + e2
                    vf[_U((4 * a + 2) * cs + o)] = e2 - e1
                    vf[_U((4 * a + 3) * cs + o)] = e1 - e3


@_jit
def output_transform(m, b, use_b, relu, n0, th, tw, y):
    """y[n0:n0+k] (k, F, OH, OW) = A^T M A of every tile of m (16, F, k*th*tw), plus b[f]
    when use_b, then max(., 0) when relu; tiles past OH/OW are cut."""
    _, f_, oh, ow = y.shape
    nt = m.shape[2]
    k_ = nt // (th * tw)
    fs = f_ * nt
    mf = m.ravel()
    yf = y.ravel()
    for fn in nb.prange(f_ * k_):
        f = fn // k_
        n = fn % k_
        yb = ((n + n0) * f_ + f) * oh * ow
        bias = b[f] if use_b else mf[0] * 0
        t = np.empty(8, m.dtype)
        for ty in range(th):
            for tx in range(tw):
                o = f * nt + (n * th + ty) * tw + tx
                for a in range(4):  # rows of A^T M
                    m0 = mf[_U((4 * a) * fs + o)]
                    m1 = mf[_U((4 * a + 1) * fs + o)]
                    m2 = mf[_U((4 * a + 2) * fs + o)]
                    m3 = mf[_U((4 * a + 3) * fs + o)]
                    t[a] = m0 + m1 + m2
                    t[4 + a] = m1 - m2 - m3
                for q in range(2):  # t[4q:4q+4] is column q of M A; A^T of it
                    col = 2 * tx + q
                    if col >= ow:
                        continue
                    s0, s1, s2, s3 = t[4 * q], t[4 * q + 1], t[4 * q + 2], t[4 * q + 3]
                    y0 = s0 + s1 + s2 + bias
                    y1 = s1 - s2 - s3 + bias
                    if relu:
                        y0 = y0 if y0 > 0 else y0 * 0
                        y1 = y1 if y1 > 0 else y1 * 0
                    yf[_U(yb + 2 * ty * ow + col)] = y0
                    if 2 * ty + 1 < oh:
                        yf[_U(yb + (2 * ty + 1) * ow + col)] = y1


@_jit_sums
def output_transform_adjoint(dy, n0, n1, th, tw, dm, db, use_db):
    """dm (16, F, (n1-n0)*th*tw) = A dY A^T of every 2x2 tile of dy[n0:n1] (zeros past
    OH/OW); db[f] += the sum of dy[n0:n1, f] when use_db."""
    _, f_, oh, ow = dy.shape
    k_ = n1 - n0
    nt = k_ * th * tw
    fs = f_ * nt
    df = dy.ravel()
    mf = dm.ravel()
    for f in nb.prange(f_):
        acc = 0.0
        for n in range(k_):
            yb = ((n + n0) * f_ + f) * oh * ow
            part = df[0] * 0
            for ty in range(th):
                for tx in range(tw):
                    g00 = df[_U(yb + 2 * ty * ow + 2 * tx)]
                    g01 = df[_U(yb + 2 * ty * ow + 2 * tx + 1)] if 2 * tx + 1 < ow else g00 * 0
                    if 2 * ty + 1 < oh:
                        g10 = df[_U(yb + (2 * ty + 1) * ow + 2 * tx)]
                        g11 = df[_U(yb + (2 * ty + 1) * ow + 2 * tx + 1)] \
                            if 2 * tx + 1 < ow else g00 * 0
                    else:
                        g10 = g00 * 0
                        g11 = g00 * 0
                    part += g00 + g01 + g10 + g11
                    # rows: A dY -> 4x2 (a0 = g0, a1 = g0 + g1, a2 = g0 - g1, a3 = -g1)
                    o = f * nt + (n * th + ty) * tw + tx
                    for a in range(4):
                        if a == 0:
                            h0, h1 = g00, g01
                        elif a == 1:
                            h0, h1 = g00 + g10, g01 + g11
                        elif a == 2:
                            h0, h1 = g00 - g10, g01 - g11
                        else:
                            h0, h1 = -g10, -g11
                        mf[_U((4 * a) * fs + o)] = h0
                        mf[_U((4 * a + 1) * fs + o)] = h0 + h1
                        mf[_U((4 * a + 2) * fs + o)] = h0 - h1
                        mf[_U((4 * a + 3) * fs + o)] = -h1
            acc += part
        if use_db:
            db[f] += acc


@_jit
def input_transform_adjoint(dv, n0, n1, pt, pl, th, tw, dx):
    """dx[n0:n1] = the sum over tiles of B dV B^T, at the positions input_transform read
    (positions in the padding are dropped); dx[n0:n1] is overwritten."""
    _, c_, h_, w_ = dx.shape
    nt = (n1 - n0) * th * tw
    cs = c_ * nt
    vf = dv.ravel()
    xf = dx.ravel()
    for cn in nb.prange(c_ * (n1 - n0)):
        c = cn // (n1 - n0)
        n = cn % (n1 - n0)
        xb = ((n + n0) * c_ + c) * h_ * w_
        for k in range(h_ * w_):
            xf[_U(xb + k)] = 0
        e = np.empty(16, dv.dtype)
        for ty in range(th):
            r0 = 2 * ty - pt
            for tx in range(tw):
                c0 = 2 * tx - pl
                o = c * nt + (n * th + ty) * tw + tx
                for a in range(4):  # columns: dV B^T
                    v0 = vf[_U((4 * a) * cs + o)]
                    v1 = vf[_U((4 * a + 1) * cs + o)]
                    v2 = vf[_U((4 * a + 2) * cs + o)]
                    v3 = vf[_U((4 * a + 3) * cs + o)]
                    e[4 * a] = v0
                    e[4 * a + 1] = v1 - v2 + v3
                    e[4 * a + 2] = v1 + v2 - v0
                    e[4 * a + 3] = -v3
                for b in range(4):  # rows: B (dV B^T)
                    u0, u1, u2, u3 = e[b], e[4 + b], e[8 + b], e[12 + b]
                    e[b] = u0
                    e[4 + b] = u1 - u2 + u3
                    e[8 + b] = u1 + u2 - u0
                    e[12 + b] = -u3
                if r0 >= 0 and r0 + 4 <= h_ and c0 >= 0 and c0 + 4 <= w_:
                    for a in range(4):
                        s = xb + (r0 + a) * w_ + c0
                        for b in range(4):
                            xf[_U(s + b)] += e[a * 4 + b]
                else:
                    for a in range(4):
                        for b in range(4):
                            r = r0 + a
                            q = c0 + b
                            if 0 <= r < h_ and 0 <= q < w_:
                                xf[_U(xb + r * w_ + q)] += e[a * 4 + b]


for _name in ("input_transform", "output_transform", "output_transform_adjoint",
              "input_transform_adjoint"):
    globals()[_name] = _dispatch(globals()[_name])

# Samples per block: V and M of a block about this size, so they are still in cache when
# the GEMM reads them.
BLOCK_BYTES = 1 << 20


def _blocks(n: int, per_sample: int):
    k = max(1, min(n, BLOCK_BYTES // max(per_sample, 1)))
    return k, [(n0, min(n, n0 + k)) for n0 in range(0, n, k)]


def forward(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, pt: int, pb: int, pl: int,
            pr: int, relu: bool = False) -> np.ndarray:
    """y (N, F, OH, OW) = conv2d(x, w) + b (then ReLU when ``relu``) for w (F, C, 3, 3),
    stride 1, zero padding (top, bottom, left, right)."""
    n, c, h, wd = x.shape
    f = w.shape[0]
    oh, ow = h + pt + pb - 2, wd + pl + pr - 2
    th, tw = tiles(oh, ow)
    x = np.ascontiguousarray(x)
    u = weights_transform(w)
    k, blocks = _blocks(n, 16 * (c + f) * th * tw * x.itemsize)
    vbuf = scratch("wino_v", (16 * c * k * th * tw,), x.dtype)
    mbuf = scratch("wino_m", (16 * f * k * th * tw,), x.dtype)
    y = np.empty((n, f, oh, ow), x.dtype)
    bias = np.zeros(1, x.dtype) if b is None else np.ascontiguousarray(b, x.dtype)
    for n0, n1 in blocks:
        t = (n1 - n0) * th * tw
        v = vbuf[:16 * c * t].reshape(16, c, t)
        m = mbuf[:16 * f * t].reshape(16, f, t)
        input_transform(x, n0, n1, pt, pl, th, tw, v)
        np.matmul(u, v, out=m)
        output_transform(m, bias, b is not None, relu, n0, th, tw, y)
    return y


def backward(dy: np.ndarray, x: np.ndarray, w: np.ndarray, pt: int, pl: int,
             dw_out: np.ndarray, db_out: np.ndarray | None, need_dx: bool
             ) -> tuple[np.ndarray | None, np.ndarray, np.ndarray | None]:
    """(dx or None, dw, db or None) of ``forward`` (without ReLU) for dy (N, F, OH, OW):
    the exact adjoint of the Winograd map. dw and db are overwritten into the outputs."""
    n, c, h, wd = x.shape
    f, oh, ow = dy.shape[1:]
    th, tw = tiles(oh, ow)
    dy = np.ascontiguousarray(dy)
    u = weights_transform(w)
    ut = u.transpose(0, 2, 1)
    k, blocks = _blocks(n, 16 * (c + f) * th * tw * x.itemsize)
    vbuf = scratch("wino_v", (16 * c * k * th * tw,), x.dtype)
    mbuf = scratch("wino_m", (16 * f * k * th * tw,), x.dtype)
    du = np.zeros((16, f, c), x.dtype)
    part = np.empty((16, f, c), x.dtype)
    db64 = np.zeros(f, np.float64)
    dx = np.empty((n, c, h, wd), x.dtype) if need_dx else None
    for n0, n1 in blocks:
        t = (n1 - n0) * th * tw
        v = vbuf[:16 * c * t].reshape(16, c, t)
        dm = mbuf[:16 * f * t].reshape(16, f, t)
        output_transform_adjoint(dy, n0, n1, th, tw, dm, db64, db_out is not None)
        input_transform(x, n0, n1, pt, pl, th, tw, v)
        np.matmul(dm, v.transpose(0, 2, 1), out=part)
        du += part
        if need_dx:
            np.matmul(ut, dm, out=v)
            input_transform_adjoint(v, n0, n1, pt, pl, th, tw, dx)
    weights_transform_adjoint(du, dw_out)
    if db_out is not None:
        db_out[...] = db64
    return dx, dw_out, db_out
