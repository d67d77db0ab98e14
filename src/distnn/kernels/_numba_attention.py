"""Compiled attention forward and backward (numba, parallel over (batch, head)), the same
algorithm as ``attention``'s NumPy reference, one query row at a time: the forward's
online softmax over tiles of ``block`` keys (scores of a tile in a small buffer, the
running maximum, sum and output rescaled once a tile), the backward's probabilities
recomputed from the row's log-sum-exp. Each (batch, head) item writes only its own slice
of the outputs, so every thread count gives the same result. The row statistics and the
output accumulator are float64 whatever the input dtype; ``attention`` is the entry point.
"""
from __future__ import annotations

import numpy as np

from ._numba_runtime import _dispatch, nb

# Reassociation lets LLVM vectorize the dot products over the head dimension; no flag that
# assumes finite values: -inf scores and row maxima are how the masks work.
_jit_attn = nb.njit(parallel=True, cache=True, nogil=True, fastmath={"reassoc", "contract"})


@nb.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def _dot(a, b):
    s = 0.0
    for t in range(a.size):
        s += a[t] * b[t]
    return s


@nb.njit(cache=True, nogil=True)
def _last_key(i, tk, off, causal):
    """One past the last key query row i may see."""
    if causal:
        return min(tk, max(i + off + 1, 0))
    return tk


@_jit_attn
def _forward(q, k, v, pad, causal, scale, block, o, lse):
    nb_, nh, tq, _ = q.shape
    tk = k.shape[2]
    dv_ = v.shape[3]
    off = tk - tq
    has_pad = pad.shape[0] > 0
    for bh in nb.prange(nb_ * nh):
        b = bh // nh
        h = bh % nh
        s = np.empty(block, np.float64)
        acc = np.empty(dv_, np.float64)
        for i in range(tq):
            qi = q[b, h, i]
            m = -np.inf
            tot = 0.0
            acc[:] = 0.0
            jend = _last_key(i, tk, off, causal)
            for j0 in range(0, jend, block):
                j1 = min(j0 + block, jend)
                bm = -np.inf
                for j in range(j0, j1):
                    if has_pad and pad[b, j]:
                        s[j - j0] = -np.inf
                        continue
                    x = _dot(qi, k[b, h, j]) * scale
                    s[j - j0] = x
                    if x > bm:
                        bm = x
                if bm == -np.inf:
                    continue
                mn = max(m, bm)
                alpha = np.exp(m - mn)
                tot *= alpha
                for t in range(dv_):
                    acc[t] *= alpha
                for j in range(j0, j1):
                    if s[j - j0] == -np.inf:
                        continue
                    p = np.exp(s[j - j0] - mn)
                    tot += p
                    vj = v[b, h, j]
                    for t in range(dv_):
                        acc[t] += p * vj[t]
                m = mn
            if tot > 0.0:
                inv = 1.0 / tot
                for t in range(dv_):
                    o[b, h, i, t] = acc[t] * inv
                lse[b, h, i] = m + np.log(tot)
            else:
                for t in range(dv_):
                    o[b, h, i, t] = 0.0
                lse[b, h, i] = -np.inf


@_jit_attn
def _backward(q, k, v, pad, do, lse, drow, causal, scale, block, dq, dk, dv):
    nb_, nh, tq, d_ = q.shape
    tk = k.shape[2]
    dv_ = v.shape[3]
    off = tk - tq
    has_pad = pad.shape[0] > 0
    for bh in nb.prange(nb_ * nh):
        b = bh // nh
        h = bh % nh
        gq = np.empty(d_, np.float64)
        gk = np.zeros((tk, d_), np.float64)
        gv = np.zeros((tk, dv_), np.float64)
        for i in range(tq):
            gq[:] = 0.0
            li = lse[b, h, i]
            if li == np.inf:  # the row saw no key
                for t in range(d_):
                    dq[b, h, i, t] = 0.0
                continue
            qi = q[b, h, i]
            doi = do[b, h, i]
            di = drow[b, h, i]
            jend = _last_key(i, tk, off, causal)
            for j0 in range(0, jend, block):
                for j in range(j0, min(j0 + block, jend)):
                    if has_pad and pad[b, j]:
                        continue
                    kj = k[b, h, j]
                    p = np.exp(_dot(qi, kj) * scale - li)
                    dp = _dot(doi, v[b, h, j])
                    ds = p * (dp - di) * scale
                    for t in range(dv_):
                        gv[j, t] += p * doi[t]
                    for t in range(d_):
                        gq[t] += ds * kj[t]
                        gk[j, t] += ds * qi[t]
            for t in range(d_):
                dq[b, h, i, t] = gq[t]
        for j in range(tk):
            for t in range(d_):
                dk[b, h, j, t] = gk[j, t]
            for t in range(dv_):
                dv[b, h, j, t] = gv[j, t]


attention_forward = _dispatch(_forward)
attention_backward = _dispatch(_backward)
