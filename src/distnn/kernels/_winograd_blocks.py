"""Compiled drivers of the Winograd convolution's blocks (float32, register-tiled products).

``winograd.forward`` and ``backward`` loop over blocks of samples: per block the transforms
(compiled) and a batched GEMM. With the GEMM in BLAS that loop is Python: a few
dispatches and a BLAS call a block, and with 2 threads each taken under the GIL. Here one
compiled call runs a thread's whole share: each block's transforms and products back to
back, the products on the register tiles (``_vgemm``; numba code can call them, not
BLAS), without the GIL. Threads take block numbers from a shared counter
(``_atomics.fetch_add``) or every ``step``-th block. The blocks are ``winograd._plan``'s.

Where they run is ``plan.drivers_apply`` / ``plan.winograd_drivers``.
"""
from __future__ import annotations

import numba as nb

from ._numba_runtime import _U
from ._atomics import fetch_add
from ._vgemm import matmul_flat, matmul_nt_flat
from ._winograd4 import input_transform as _in4
from ._winograd4 import input_transform_adjoint as _iadj4
from ._winograd4 import output_transform as _out4
from ._winograd4 import output_transform_adjoint as _oadj4

_jit = nb.njit(cache=True, nogil=True)

# the serial twins (``_dispatch``): each call here is one thread's, over all its planes
_IN4, _OUT4, _OADJ4, _IADJ4 = _in4.serial, _out4.serial, _oadj4.serial, _iadj4.serial


@_jit
def _first(counter, first, step):
    """The first block this thread takes: the counter's next number (step 0), else first."""
    return fetch_add(counter, 0) if step == 0 else first


@_jit
def _then(counter, i, step):
    """The block after i: the counter's next number (step 0), else i + step."""
    return fetch_add(counter, 0) if step == 0 else i + step


@_jit
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


@_jit
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
