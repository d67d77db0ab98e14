"""Compiled attention forward and backward (numba, parallel over (batch, head)): the
algorithm of ``attention``'s NumPy reference on tiles of ``block`` queries x ``block``
keys, the tile products on BLAS (``np.dot`` into preallocated tiles) and the masking,
exponentials, online-softmax rescaling and softmax Jacobian fused into one pass over each
tile, with no temporary the size of a tile. Each (batch, head) item writes only its own
slices of the outputs, so every thread count gives the same result. Row statistics (the
running maximum and sum) are float64; tiles and accumulators have the input's dtype, as
the NumPy path. ``attention`` is the entry point. numba's ``np.dot`` calls SciPy's BLAS:
without SciPy installed (``BLAS`` False) ``attention`` keeps to its NumPy path.
"""
from __future__ import annotations

import importlib.util

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from ._numba_runtime import _dispatch, nb

# Reassociation lets LLVM vectorize the row sums; no flag that assumes finite values: -inf
# scores and row maxima are how the masks work.
BLAS = importlib.util.find_spec("scipy") is not None

_jit_attn = nb.njit(parallel=True, cache=True, nogil=True, fastmath={"reassoc", "contract"})


@intrinsic
def _float32_from_bits(typingctx, bits):
    """The float32 whose bits are the int32 ``bits`` (LLVM's bitcast, which vectorizes)."""
    sig = types.float32(types.int32)

    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], ir.FloatType())
    return sig, codegen


@nb.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def _expf(x):
    """exp(x) of float32 x <= 0 within ~2 ulp, 0 for -inf: 2^n times a degree-7
    polynomial of the remainder (Cephes' expf coefficients), 2^n built from its bits. The
    libm call np.exp makes per element does not vectorize; this loop body does (one
    exponential per score is most of a tile's work)."""
    y = max(x, np.float32(-87.0))
    n = np.floor(y * np.float32(1.44269504) + np.float32(0.5))
    r = y - n * np.float32(0.693359375) + n * np.float32(2.12194440e-4)
    p = np.float32(1.9875691500e-4)
    p = p * r + np.float32(1.3981999507e-3)
    p = p * r + np.float32(8.3334519073e-3)
    p = p * r + np.float32(4.1665795894e-2)
    p = p * r + np.float32(1.6666665459e-1)
    p = p * r + np.float32(5.0000001201e-1)
    e = (p * r * r + r + np.float32(1.0)) * _float32_from_bits((np.int32(n) + 127) << 23)
    return e if x > np.float32(-87.0) else np.float32(0.0)


@nb.njit(cache=True, nogil=True)
def _exp(x, f32):
    return _expf(np.float32(x)) if f32 else np.exp(x)


@nb.njit(cache=True, nogil=True)
def _visible(i, j, off, causal, pad, b, has_pad):
    return (not causal or j <= i + off) and not (has_pad and pad[b, j])


@nb.njit(cache=True, nogil=True)
def _sizes(q, k, v, pad):
    """(batch, heads, queries, head width, keys, value width, the causal mask's offset
    keys - queries, whether keys are masked as padding, float32) of a call."""
    nb_, nh, tq, d_ = q.shape
    tk = k.shape[2]
    return nb_, nh, tq, d_, tk, v.shape[3], tk - tq, pad.shape[0] > 0, q.itemsize == 4


@nb.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def _softmax_row(s, rr, c, i, j0, off, causal, pad, b, has_pad, whole, scale, m, tot, alpha,
                 f32):
    """Row rr of a tile of scores s (c keys from j0, query i): scaled and masked, then
    exp(s - the row's new maximum) in place, with the row's running maximum m, sum tot and
    the rescaling alpha of what it has summed so far (the online softmax's step)."""
    bm = -np.inf
    for cc in range(c):
        x = s[rr, cc] * scale
        if not whole and not _visible(i, j0 + cc, off, causal, pad, b, has_pad):
            x = -np.inf
        s[rr, cc] = x
        bm = max(bm, x)
    mn = max(m[rr], bm)
    if mn == -np.inf:  # nothing seen yet in this row
        s[rr, :] = 0
        alpha[rr] = 1
        return
    alpha[rr] = np.exp(m[rr] - mn)
    rs = 0.0
    if f32:  # two loops: the float32 one vectorizes
        for cc in range(c):
            p = _expf(np.float32(s[rr, cc] - mn))
            s[rr, cc] = p
            rs += p
    else:
        for cc in range(c):
            p = np.exp(s[rr, cc] - mn)
            s[rr, cc] = p
            rs += p
    tot[rr] = tot[rr] * alpha[rr] + rs
    m[rr] = mn


@nb.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def _finish_rows(acc, m, tot, r, o, lse, b, h, i0, dv_):
    """The rows' outputs acc / tot and log-sum-exps m + log(tot); 0 and -inf for a row
    whose every key was masked."""
    for rr in range(r):
        if tot[rr] > 0.0:
            inv = 1.0 / tot[rr]
            for t in range(dv_):
                o[b, h, i0 + rr, t] = acc[rr, t] * inv
            lse[b, h, i0 + rr] = m[rr] + np.log(tot[rr])
        else:
            o[b, h, i0 + rr, :] = 0
            lse[b, h, i0 + rr] = -np.inf


@_jit_attn
def _forward(q, k, v, pad, causal, scale, block, o, lse):
    nb_, nh, tq, _, tk, dv_, off, has_pad, f32 = _sizes(q, k, v, pad)
    for bh in nb.prange(nb_ * nh):
        b, h = bh // nh, bh % nh  # one (batch, head) item an iteration
        sbuf = np.empty(block * block, q.dtype)
        pvbuf = np.empty(block * dv_, q.dtype)
        acc = np.empty((block, dv_), q.dtype)
        m = np.empty(block, np.float64)
        tot = np.empty(block, np.float64)
        alpha = np.empty(block, q.dtype)
        for i0 in range(0, tq, block):
            i1 = min(i0 + block, tq)
            r = i1 - i0
            m[:r] = -np.inf
            tot[:r] = 0.0
            acc[:r] = 0
            jend = min(tk, max(i1 + off, 0)) if causal else tk
            for j0 in range(0, jend, block):
                j1 = min(j0 + block, jend)
                c = j1 - j0
                s = sbuf[:r * c].reshape((r, c))
                np.dot(q[b, h, i0:i1], k[b, h, j0:j1].T, s)
                whole = not has_pad and (not causal or j1 - 1 <= i0 + off)
                for rr in range(r):
                    _softmax_row(s, rr, c, i0 + rr, j0, off, causal, pad, b, has_pad, whole,
                                 scale, m, tot, alpha, f32)
                pv = pvbuf[:r * dv_].reshape((r, dv_))
                np.dot(s, v[b, h, j0:j1], pv)
                for rr in range(r):
                    a = alpha[rr]
                    for t in range(dv_):
                        acc[rr, t] = acc[rr, t] * a + pv[rr, t]
            _finish_rows(acc, m, tot, r, o, lse, b, h, i0, dv_)


@_jit_attn
def _backward(q, k, v, pad, do, lse, drow, causal, scale, block, dq, dk, dv):
    nb_, nh, tq, d_, tk, dv_, off, has_pad, f32 = _sizes(q, k, v, pad)
    for bh in nb.prange(nb_ * nh):
        b, h = bh // nh, bh % nh  # one (batch, head) item an iteration
        pbuf = np.empty(block * block, q.dtype)
        dpbuf = np.empty(block * block, q.dtype)
        tq_buf = np.empty(block * d_, q.dtype)
        tk_buf = np.empty(block * d_, q.dtype)
        tv_buf = np.empty(block * dv_, q.dtype)
        dq[b, h] = 0
        for j0 in range(0, tk, block):
            j1 = min(j0 + block, tk)
            c = j1 - j0
            dk[b, h, j0:j1] = 0
            dv[b, h, j0:j1] = 0
            start = max(0, j0 - off) if causal else 0
            for i0 in range(start, tq, block):
                i1 = min(i0 + block, tq)
                r = i1 - i0
                p = pbuf[:r * c].reshape((r, c))
                np.dot(q[b, h, i0:i1], k[b, h, j0:j1].T, p)
                whole = not has_pad and (not causal or j1 - 1 <= i0 + off)
                for rr in range(r):
                    i = i0 + rr
                    li = lse[b, h, i]
                    if whole and f32:
                        for cc in range(c):
                            p[rr, cc] = _expf(np.float32(p[rr, cc] * scale - li))
                        continue
                    for cc in range(c):
                        if whole or _visible(i, j0 + cc, off, causal, pad, b, has_pad):
                            p[rr, cc] = _exp(p[rr, cc] * scale - li, f32)
                        else:
                            p[rr, cc] = 0
                tv = tv_buf[:c * dv_].reshape((c, dv_))
                np.dot(p.T, do[b, h, i0:i1], tv)
                dv[b, h, j0:j1] += tv
                ds = dpbuf[:r * c].reshape((r, c))
                np.dot(do[b, h, i0:i1], v[b, h, j0:j1].T, ds)
                for rr in range(r):
                    di = drow[b, h, i0 + rr]
                    for cc in range(c):
                        ds[rr, cc] = p[rr, cc] * (ds[rr, cc] - di) * scale
                tqb = tq_buf[:r * d_].reshape((r, d_))
                np.dot(ds, k[b, h, j0:j1], tqb)
                dq[b, h, i0:i1] += tqb
                tkb = tk_buf[:c * d_].reshape((c, d_))
                np.dot(ds.T, q[b, h, i0:i1], tkb)
                dk[b, h, j0:j1] += tkb


attention_forward = _dispatch(_forward)
attention_backward = _dispatch(_backward)
