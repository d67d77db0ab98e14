"""Compiled layer norm forward and backward over the last axis (numba, parallel over
rows), each one pass over memory where NumPy takes six to ten (one temporary per
operator), and the float32 tanh GELU forward and backward, one pass each (NumPy: nine and
fourteen). numba's ``math.tanh`` is a scalar libm call that does not vectorize (12x slower
than NumPy's ``np.tanh``), so the GELU's tanh is ``_tanhf`` here, built on the attention
kernel's vectorizing ``_expf``; float64 stays on NumPy (its exact tanh, torch parity).
``transformer_ops`` is the entry point and holds the NumPy reference.

Row statistics of the layer norm are accumulated in float64; everything else is in the
input's dtype, as the reference. Each row is written by one thread only, and the layer norm's
parameter gradients are summed over a fixed number of row ranges (``PARTS``, one row of a
(PARTS, D) array each, whatever the thread count) and then over the ranges in order, so
every thread count gives the same result.
"""
from __future__ import annotations

import math

import numpy as np

from ._numba_attention import _expf
from ._numba_runtime import _dispatch, nb

_jit = nb.njit(parallel=True, cache=True, nogil=True, fastmath={"reassoc", "contract"})

PARTS = 16


@_jit
def _layer_norm_forward(x, gamma, beta, eps, y, xhat, invstd):
    rows, d = x.shape
    for r in nb.prange(rows):
        s = 0.0
        for j in range(d):
            s += x[r, j]
        mean = s / d
        ss = 0.0
        for j in range(d):
            c = x[r, j] - mean
            ss += c * c
        inv = 1.0 / math.sqrt(ss / d + eps)
        invstd[r] = inv
        for j in range(d):
            h = (x[r, j] - mean) * inv
            xhat[r, j] = h
            y[r, j] = h * gamma[j] + beta[j]


@_jit
def _layer_norm_backward(dy, xhat, invstd, gamma, center, dx, dgamma_parts, dbeta_parts):
    rows, d = dy.shape
    teams = dgamma_parts.shape[0]
    per = (rows + teams - 1) // teams
    for t in nb.prange(teams):
        dg = dgamma_parts[t]
        db = dbeta_parts[t]
        dg[:] = 0.0
        db[:] = 0.0
        for r in range(t * per, min(rows, (t + 1) * per)):
            sg = 0.0
            sgx = 0.0
            for j in range(d):
                g = dy[r, j]
                h = xhat[r, j]
                dg[j] += g * h
                db[j] += g
                gg = g * gamma[j]
                sg += gg
                sgx += gg * h
            mg = sg / d if center else 0.0
            mgx = sgx / d
            inv = invstd[r]
            for j in range(d):
                dx[r, j] = inv * (dy[r, j] * gamma[j] - mg - xhat[r, j] * mgx)


_C = math.sqrt(2.0 / math.pi)
_K = 0.044715
_CHUNK = 4096
# float32 constants of the GELU loops (numba freezes a global NumPy scalar as a constant)
_C32, _K32, _HALF, _ONE = np.float32(_C), np.float32(_K), np.float32(0.5), np.float32(1.0)


# NumPy's error model: numba's default tests every float division for zero, to raise
# ZeroDivisionError, and that test stops the loop from vectorizing
_jit_gelu = nb.njit(parallel=True, cache=True, nogil=True, fastmath={"reassoc", "contract"},
                    error_model="numpy")


@nb.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"}, error_model="numpy")
def _tanhf(u):
    """tanh of float32 u within a few ulp, branch-free so that loops over it vectorize:
    (1 - e) / (1 + e) with e = exp(-2|u|) for |u| >= 0.625 (no cancellation there), an odd
    polynomial below (Cephes' tanhf coefficients)."""
    a = abs(u)
    e = _expf(np.float32(-2.0) * a)
    big = (np.float32(1.0) - e) / (np.float32(1.0) + e)
    z = a * a
    p = np.float32(-5.70498872745e-3)
    p = p * z + np.float32(2.06390887954e-2)
    p = p * z - np.float32(5.37397155531e-2)
    p = p * z + np.float32(1.33314422036e-1)
    p = p * z - np.float32(3.33332819422e-1)
    small = p * z * a + a
    t = big if a >= np.float32(0.625) else small
    return t if u >= np.float32(0.0) else -t


@_jit_gelu
def _gelu_tanh_forward(x, y):
    n = x.size
    c, k, half, one = _C32, _K32, _HALF, _ONE
    for b in nb.prange((n + _CHUNK - 1) // _CHUNK):
        lo = b * _CHUNK
        xs = x[lo:min(n, lo + _CHUNK)]
        ys = y[lo:min(n, lo + _CHUNK)]
        for i in range(xs.size):  # from 0 on a slice: no negative-index test, it vectorizes
            v = xs[i]
            ys[i] = half * v * (one + _tanhf(c * (v + k * v * v * v)))


@_jit_gelu
def _gelu_tanh_backward(x, dy, dx):
    n = x.size
    c, k, half, one = _C32, _K32, _HALF, _ONE
    for b in nb.prange((n + _CHUNK - 1) // _CHUNK):
        lo = b * _CHUNK
        hi = min(n, lo + _CHUNK)
        xs, gs, ds = x[lo:hi], dy[lo:hi], dx[lo:hi]
        for i in range(xs.size):
            v = xs[i]
            v2 = v * v
            t = _tanhf(c * (v + k * v2 * v))
            ds[i] = gs[i] * (half * (one + t)
                             + half * v * (one - t * t) * c * (one + np.float32(3.0) * k * v2))


layer_norm_forward = _dispatch(_layer_norm_forward)
layer_norm_backward = _dispatch(_layer_norm_backward)
# one compilation at every thread count (a team of one at 1 thread): the serial twin
# vectorizes with other FMA contractions, a last-bit difference
gelu_tanh_forward = _dispatch(_gelu_tanh_forward, parallel_at_one=True)
gelu_tanh_backward = _dispatch(_gelu_tanh_backward, parallel_at_one=True)
