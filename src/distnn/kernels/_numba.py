"""Compiled loops for the memory-bound parts of the kernels (numba, ``parallel=True``).

Each function is compiled on first use and cached on disk (``cache=True``: next to this
file, or in ``NUMBA_CACHE_DIR``), so a process after the first pays only the cache load.
Loops run over a ``prange`` of channels, rows or samples with no shared writes, so every
thread count gives the same result. Arrays are indexed through flat views with unsigned
offsets: numba's negative-index check on signed indices stops LLVM from vectorizing.
The GEMMs stay in NumPy (BLAS); ``conv.py``, ``pooling.py`` and ``batchnorm.py`` call these
when the "numba" backend is selected (``distnn.kernels.backend``). The threading layer,
the jit options, the thread count, the serial/parallel dispatch and ``scratch`` are in
``_numba_runtime`` (imported first: it picks the threading layer before numba loads).
"""
from __future__ import annotations

import numpy as np

from ._numba_runtime import (_U, _dispatch, _jit, _jit_sums, _valid_q, default_threads,
                             elements, get_num_threads, nb, scratch, set_num_threads)
from ._threads import pieces

__all__ = ["default_threads", "get_num_threads", "scratch", "set_num_threads"]


# -- convolution: compact columns (C*KH*KW, N*OH*OW) -------------------------------------
@_jit
def im2col(x, n0, n1, kh, kw, sh, sw, pt, pl, dh, dw, oh, ow, col):
    """col (C*KH*KW, (n1-n0)*OH*OW) = the patches of samples n0..n1-1 of x (N, C, H, W)."""
    _, c_, h_, w_ = x.shape
    n_ = n1 - n0
    xf = x.ravel()
    cf = col.ravel()
    p_ = oh * ow
    for r in nb.prange(c_ * kh * kw):
        c = r // (kh * kw)
        i = (r // kw) % kh
        j = r % kw
        off = j * dw - pl
        q0, q1 = _valid_q(ow, sw, off, w_)
        for n in range(n_):
            xb = ((n + n0) * c_ + c) * h_ * w_
            for p in range(oh):
                ih = p * sh + i * dh - pt
                d = (r * n_ + n) * p_ + p * ow
                if ih < 0 or ih >= h_:
                    for q in range(ow):
                        cf[_U(d + q)] = 0
                    continue
                s = xb + ih * w_ + off
                for q in range(q0):
                    cf[_U(d + q)] = 0
                if sw == 1:
                    for q in range(q0, q1):
                        cf[_U(d + q)] = xf[_U(s + q)]
                else:
                    for q in range(q0, q1):
                        cf[_U(d + q)] = xf[_U(s + q * sw)]
                for q in range(q1, ow):
                    cf[_U(d + q)] = 0


@_jit
def col2im(col, n0, n1, kh, kw, sh, sw, pt, pl, dh, dw, oh, ow, dx):
    """dx[n0:n1] = adjoint of im2col; offsets added in (i, j) order like the NumPy path."""
    _, c_, h_, w_ = dx.shape
    n_ = n1 - n0
    df = dx.ravel()
    cf = col.ravel()
    p_ = oh * ow
    for c in nb.prange(c_):
        for n in range(n_):
            b = ((n + n0) * c_ + c) * h_ * w_
            for k in range(h_ * w_):
                df[_U(b + k)] = 0
        for i in range(kh):
            for j in range(kw):
                r = (c * kh + i) * kw + j
                off = j * dw - pl
                q0, q1 = _valid_q(ow, sw, off, w_)
                for n in range(n_):
                    xb = ((n + n0) * c_ + c) * h_ * w_
                    for p in range(oh):
                        ih = p * sh + i * dh - pt
                        if ih < 0 or ih >= h_:
                            continue
                        d = (r * n_ + n) * p_ + p * ow
                        s = xb + ih * w_ + off
                        if sw == 1:
                            for q in range(q0, q1):
                                df[_U(s + q)] += cf[_U(d + q)]
                        else:
                            for q in range(q0, q1):
                                df[_U(s + q * sw)] += cf[_U(d + q)]


@_jit
def cols_to_nchw(yw, b, use_b, y, n0):
    """y[n0:n0+k] (k, F, P) = yw (F, k*P) transposed, plus b[f] when use_b."""
    _, f_, p_ = y.shape
    n_ = yw.shape[1] // p_
    yf = y.ravel()
    wf = yw.ravel()
    for t in nb.prange(n_ * f_):
        n = t // f_
        f = t % f_
        s = (f * n_ + n) * p_
        d = (t + n0 * f_) * p_
        if use_b:
            bias = b[f]
            for k in range(p_):
                yf[_U(d + k)] = wf[_U(s + k)] + bias
        else:
            for k in range(p_):
                yf[_U(d + k)] = wf[_U(s + k)]


@_jit_sums
def nchw_to_cols(dy, n0, dyw, db, use_db):
    """dyw (F, k*P) = dy[n0:n0+k] (k, F, P) transposed; db[f] += its row sums when use_db."""
    _, f_, p_ = dy.shape
    n_ = dyw.shape[1] // p_
    df = dy.ravel()
    wf = dyw.ravel()
    for f in nb.prange(f_):
        acc = 0.0
        for n in range(n_):
            s = ((n + n0) * f_ + f) * p_
            d = (f * n_ + n) * p_
            part = df[_U(s)] * 0
            for k in range(p_):
                v = df[_U(s + k)]
                wf[_U(d + k)] = v
                part += v
            acc += part
        if use_db:
            db[f] += acc


# -- activations --------------------------------------------------------------------------
@_jit
def relu_forward(x, y, lo, hi):
    """y = max(x, 0) over flat elements lo to hi (``_dispatch``'s split; unsigned indices:
    a signed i from an argument gets a negative-index check that stops vectorization, 2x
    slower)."""
    xf = x.ravel()
    yf = y.ravel()
    z = x.dtype.type(0)
    for i in nb.prange(lo, hi):
        v = xf[_U(i)]
        yf[_U(i)] = z if v <= z else v  # NaN stays NaN, as np.maximum


@_jit
def relu_backward(dy, y, dx, lo, hi):
    """dx = dy where y > 0, else 0 (times dy: NaN stays NaN), flat elements lo to hi."""
    df = dy.ravel()
    yf = y.ravel()
    xf = dx.ravel()
    z = dy.dtype.type(0)
    for i in nb.prange(lo, hi):
        d = df[_U(i)]
        xf[_U(i)] = d if yf[_U(i)] > z else d * z


@_jit
def add(a, b, out, lo, hi):
    """out = a + b over flat elements lo to hi (a residual block's sum, its gradients')."""
    af = a.ravel()
    bf = b.ravel()
    of = out.ravel()
    for i in nb.prange(lo, hi):
        of[_U(i)] = af[_U(i)] + bf[_U(i)]


@_jit
def add_relu(a, b, y, lo, hi):
    """y = max(a + b, 0) over flat elements lo to hi: a residual sum and the ReLU after it
    in one pass, rounded as ``add`` then ``relu_forward`` (NaN stays NaN)."""
    af = a.ravel()
    bf = b.ravel()
    yf = y.ravel()
    z = a.dtype.type(0)
    for i in nb.prange(lo, hi):
        v = af[_U(i)] + bf[_U(i)]
        yf[_U(i)] = z if v <= z else v


@_jit
def add_relu_backward(a, b, y, dx, lo, hi):
    """dx = a + b where y > 0, else (a + b) * 0, over flat elements lo to hi: a residual
    block's gradient sum masked by the ReLU that made the block's input y (``add`` then
    ``relu_backward``, the same bits, in one pass)."""
    af = a.ravel()
    bf = b.ravel()
    yf = y.ravel()
    xf = dx.ravel()
    z = a.dtype.type(0)
    for i in nb.prange(lo, hi):
        d = af[_U(i)] + bf[_U(i)]
        xf[_U(i)] = d if yf[_U(i)] > z else d * z


# -- max pooling --------------------------------------------------------------------------
@_jit
def maxpool_forward(x, kh, kw, sh, sw, ph, pw, y, idx):
    """y and the window offset (i*kw + j) of each window's first maximum (-inf padding)."""
    n_, c_, h_, w_ = x.shape
    oh, ow = y.shape[2], y.shape[3]
    xf = x.ravel()
    yf = y.ravel()
    kf = idx.ravel()
    for t in nb.prange(n_ * c_):
        xb = t * h_ * w_
        yb = t * oh * ow
        for p in range(oh):
            for q in range(ow):
                best = -np.inf
                arg = 0
                first = True
                for i in range(kh):
                    ih = p * sh + i - ph
                    for j in range(kw):
                        iw = q * sw + j - pw
                        if 0 <= ih < h_ and 0 <= iw < w_:
                            v = xf[_U(xb + ih * w_ + iw)]
                        else:
                            v = -np.inf
                        if first or v > best:
                            best = v
                            arg = i * kw + j
                            first = False
                yf[_U(yb + p * ow + q)] = best
                kf[_U(yb + p * ow + q)] = arg


@_jit
def maxpool2x2_forward(x, y, idx):
    """maxpool_forward for 2x2 windows, stride 2, no padding (the common case)."""
    n_, c_, h_, w_ = x.shape
    oh, ow = y.shape[2], y.shape[3]
    xf = x.ravel()
    yf = y.ravel()
    kf = idx.ravel()
    for t in nb.prange(n_ * c_):
        for p in range(oh):
            r0 = t * h_ * w_ + 2 * p * w_
            r1 = r0 + w_
            o = (t * oh + p) * ow
            for q in range(ow):
                best = xf[_U(r0 + 2 * q)]
                arg = 0
                v = xf[_U(r0 + 2 * q + 1)]
                if v > best:
                    best = v
                    arg = 1
                v = xf[_U(r1 + 2 * q)]
                if v > best:
                    best = v
                    arg = 2
                v = xf[_U(r1 + 2 * q + 1)]
                if v > best:
                    best = v
                    arg = 3
                yf[_U(o + q)] = best
                kf[_U(o + q)] = arg


@_jit
def maxpool2x2_backward(dy, idx, dx, zero):
    """maxpool_backward for maxpool2x2_forward: every dx element written once (dy where it
    was its window's maximum, else zero[0], a 0 of dx's dtype), no zero-fill and scatter;
    the loop runs along whole input rows so that it vectorizes. An odd last row or column
    is in no window and gets 0."""
    n_, c_, h_, w_ = dx.shape
    oh, ow = dy.shape[2], dy.shape[3]
    df = dy.ravel()
    kf = idx.ravel()
    xf = dx.ravel()
    z = zero[0]
    for t in nb.prange(n_ * c_):
        for p in range(oh):
            r0 = t * h_ * w_ + 2 * p * w_
            r1 = r0 + w_
            o = (t * oh + p) * ow
            for q in range(2 * ow):
                g = df[_U(o + q // 2)]
                a = kf[_U(o + q // 2)]
                xf[_U(r0 + q)] = g if a == (q & 1) else z
                xf[_U(r1 + q)] = g if a == (q & 1) + 2 else z
            for q in range(2 * ow, w_):
                xf[_U(r0 + q)] = z
                xf[_U(r1 + q)] = z
        for k in range(2 * oh * w_, h_ * w_):
            xf[_U(t * h_ * w_ + k)] = z


@_jit
def maxpool_backward(dy, idx, kh, kw, sh, sw, ph, pw, dx):
    n_, c_, h_, w_ = dx.shape
    oh, ow = dy.shape[2], dy.shape[3]
    df = dy.ravel()
    kf = idx.ravel()
    xf = dx.ravel()
    for t in nb.prange(n_ * c_):
        xb = t * h_ * w_
        yb = t * oh * ow
        for k in range(h_ * w_):
            xf[_U(xb + k)] = 0
        for p in range(oh):
            for q in range(ow):
                a = kf[_U(yb + p * ow + q)]
                ih = p * sh + a // kw - ph
                iw = q * sw + a % kw - pw
                if 0 <= ih < h_ and 0 <= iw < w_:
                    xf[_U(xb + ih * w_ + iw)] += df[_U(yb + p * ow + q)]


for _name in ("im2col", "col2im", "cols_to_nchw", "nchw_to_cols"):
    globals()[_name] = _dispatch(globals()[_name])
for _name in ("relu_forward", "relu_backward", "add", "add_relu", "add_relu_backward"):
    globals()[_name] = _dispatch(globals()[_name], small_serial=True, split=elements,
                                 pieces=pieces)
for _name in ("maxpool_forward", "maxpool_backward"):
    globals()[_name] = _dispatch(globals()[_name], small_serial=True)
for _name in ("maxpool2x2_forward", "maxpool2x2_backward"):
    globals()[_name] = _dispatch(globals()[_name], parallel_at_one=True,
                                 small_serial=True)
