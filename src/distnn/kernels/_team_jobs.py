"""Compiled jobs of the block threads (``_threads._Team``): the helper's watching loop and
the jobs it runs without returning to Python.

A job is one thread's share of a compiled kernel, float32: the Winograd drivers' forward
and backward blocks (``_winograd4``), and batch norm's kernels split by channels
(``_numba_bn``: pieces of channels taken from a shared counter), and the
elementwise ones (ReLU, a residual block's sum: pieces of elements). It is
written to the helper's row of the team's board as int64 words: its kind, then per array
its address and shape, then the scalars (floats as their float64 bits). The caller keeps
the arrays alive and waits for the job's completion (``_threads.run_jobs``); the helper
views them with ``carray`` (C-contiguous, as the kernels get them) and runs its share as
the caller runs its own.

``serve`` links the kernels it calls into its compiled code, and numba's disk cache checks
only this file: after editing a kernel it runs, delete this module's cache files
(``__pycache__/_team_jobs*``). Compiling it cold takes ~25 s, once.
"""
from __future__ import annotations

import numba as nb
import numpy as np
from numba import types
from numba.extending import intrinsic

from . import _numba, _numba_bn
from ._numba_runtime import get_num_threads
from . import planner
from ._atomics import _store_release, fetch_add
from ._threads import PYTHON, _watch, put, run_jobs, use_jobs
from ._winograd4 import BACKWARD, FORWARD, backward_blocks, forward_blocks

# (FORWARD and BACKWARD, the Winograd drivers' jobs, are ``_winograd4``'s: it encodes them)
BN_FORWARD, BN_RELU_FORWARD, BN_BACKWARD, ELEMENTWISE = range(PYTHON + 3, PYTHON + 7)
# the elementwise kernels' operations in an ELEMENTWISE job
RELU_FORWARD, RELU_BACKWARD, ADD = range(3)
# (a board row holds ``_threads.WORDS`` words: the longest job here, BACKWARD, takes 49)

# the batch-norm kernels' serial twins: a thread runs them on the channels it takes
_BNF = _numba_bn.bn_forward_train.serial
_BNRF = _numba_bn.bn_relu_forward_train.serial
_BNB = _numba_bn.bn_backward.serial
_RELUF, _RELUB, _ADD = (_numba.relu_forward.serial, _numba.relu_backward.serial,
                        _numba.add.serial)


def _pointer_to(nbtype):
    @intrinsic
    def pointer(typingctx, address):
        sig = types.CPointer(nbtype)(types.int64)

        def codegen(context, builder, sig, args):
            return builder.inttoptr(args[0], context.get_value_type(sig.return_type))
        return sig, codegen
    return pointer


_f32 = _pointer_to(types.float32)
_f64 = _pointer_to(types.float64)
_i64 = _pointer_to(types.int64)

_jit = nb.njit(cache=True, nogil=True)


# -- the caller's side: a job's words -----------------------------------------------------
@_jit
def encode_bn_forward(row, kind, counter, step, x, gamma, beta, eps, y, xhat, mean, var,
                      invstd):
    """A share of ``bn_forward_train`` or ``bn_relu_forward_train`` (kind) as a job."""
    row[0] = kind
    k = put(row, 1, counter)
    k = put(row, k, x)
    k = put(row, k, y)
    k = put(row, k, xhat)
    k = put(row, k, gamma)
    k = put(row, k, beta)
    k = put(row, k, mean)
    k = put(row, k, var)
    k = put(row, k, invstd)
    row[k] = step
    row.view(np.float64)[k + 1] = eps


@_jit
def encode_bn_backward(row, kind, counter, step, dy, src, mean, gamma, beta, invstd, count,
                       relu, centre, sum_dy, sum_dy_xhat, dx):
    """A share of ``_numba_bn.bn_backward`` as a job."""
    row[0] = kind
    k = put(row, 1, counter)
    k = put(row, k, dy)
    k = put(row, k, src)
    k = put(row, k, dx)
    k = put(row, k, mean)
    k = put(row, k, gamma)
    k = put(row, k, beta)
    k = put(row, k, invstd)
    k = put(row, k, sum_dy)
    k = put(row, k, sum_dy_xhat)
    row[k], row[k + 1], row[k + 2] = step, relu, centre
    row.view(np.float64)[k + 3] = count


@_jit
def take_bn_forward(relu, counter, step, x, gamma, beta, eps, y, xhat, mean, var, invstd):
    """Batch norm's (``relu``: fused with ReLU) forward over pieces of ``step`` channels
    taken from the counter until none is left: every channel computed as at 1 thread."""
    c = x.shape[1]
    lo = fetch_add(counter, 0) * step
    while lo < c:
        if relu:
            _BNRF(x, gamma, beta, eps, y, xhat, mean, var, invstd, lo, min(c, lo + step))
        else:
            _BNF(x, gamma, beta, eps, y, xhat, mean, var, invstd, lo, min(c, lo + step))
        lo = fetch_add(counter, 0) * step


@_jit
def take_bn_backward(counter, step, dy, src, mean, gamma, beta, invstd, count, relu, centre,
                     sum_dy, sum_dy_xhat, dx):
    """``bn_backward`` over pieces of channels taken from the counter, as
    ``take_bn_forward``."""
    c = dy.shape[1]
    lo = fetch_add(counter, 0) * step
    while lo < c:
        _BNB(dy, src, mean, gamma, beta, invstd, count, relu, centre, sum_dy, sum_dy_xhat, dx,
             lo, min(c, lo + step))
        lo = fetch_add(counter, 0) * step


@_jit
def encode_elementwise(row, op, counter, step, a, b, c):
    """A share of an elementwise kernel (op) over the flat float32 arrays a, b, c as a job."""
    row[0] = ELEMENTWISE
    k = put(row, 1, counter)
    k = put(row, k, a)
    k = put(row, k, b)
    k = put(row, k, c)
    row[k], row[k + 1] = op, step


@_jit
def take_elementwise(op, counter, step, a, b, c):
    """The elementwise kernel op over pieces of ``step`` elements taken from the counter
    until none is left: relu_forward(a, b), relu_backward(a, b, c), add(a, b, c)."""
    n = a.size
    lo = fetch_add(counter, 0) * step
    while lo < n:
        hi = min(n, lo + step)
        if op == RELU_FORWARD:
            _RELUF(a, b, lo, hi)
        elif op == RELU_BACKWARD:
            _RELUB(a, b, c, lo, hi)
        else:
            _ADD(a, b, c, lo, hi)
        lo = fetch_add(counter, 0) * step




def elementwise_job(op: int, args) -> bool:
    """An elementwise kernel (``_dispatch``'s args, without lo and hi; their flat views)
    run by the block threads as compiled jobs; False (nothing run) unless float32 of at
    least the planner's elementwise_min elements with the team free."""
    a = args[0]
    n = a.size
    if a.dtype != np.float32 or n < planner.LIMITS.elementwise_min:
        return False
    flat = [x.reshape(-1) for x in args]
    a, b = flat[0], flat[1]
    c = flat[2] if len(flat) > 2 else a
    threads = get_num_threads()
    limits = planner.LIMITS
    step = max(limits.elementwise_piece, -(-n // (threads * limits.pieces_per_thread)))
    counter = np.zeros(1, np.int64)

    def job(row, i, team):
        encode_elementwise(row, op, counter, step, a, b, c)

    return run_jobs(threads, job, lambda: take_elementwise(op, counter, step, a, b, c))


def split_job(kind: int, args) -> bool:
    """A split batch-norm kernel (``_dispatch``'s args, without lo and hi) run by the block
    threads as compiled jobs, pieces of channels (the planner's pieces_per_thread a
    thread) taken from a shared counter; False (nothing run) unless float32 with the team free."""
    x = args[0]
    if x.dtype != np.float32:
        return False
    threads = get_num_threads()
    c = x.shape[1]
    step = -(-c // min(c, threads * planner.LIMITS.pieces_per_thread))
    counter = np.zeros(1, np.int64)
    if kind == BN_BACKWARD:
        def job(row, i, team):
            encode_bn_backward(row, kind, counter, step, *args)

        def own():
            take_bn_backward(counter, step, *args)
    else:
        relu = kind == BN_RELU_FORWARD

        def job(row, i, team):
            encode_bn_forward(row, kind, counter, step, *args)

        def own():
            take_bn_forward(relu, counter, step, *args)
    return run_jobs(threads, job, own)


# -- the helper's side ----------------------------------------------------------------------
@nb.njit(cache=True, nogil=True, inline="always")
def _f32_4(r, k):
    return nb.carray(_f32(r[k]), (r[k + 1], r[k + 2], r[k + 3], r[k + 4]))


@nb.njit(cache=True, nogil=True, inline="always")
def _f32_3(r, k):
    return nb.carray(_f32(r[k]), (r[k + 1], r[k + 2], r[k + 3]))


@nb.njit(cache=True, nogil=True, inline="always")
def _f32_2(r, k):
    return nb.carray(_f32(r[k]), (r[k + 1], r[k + 2]))


@nb.njit(cache=True, nogil=True, inline="always")
def _f32_1(r, k):
    return nb.carray(_f32(r[k]), (r[k + 1],))


@nb.njit(cache=True, nogil=True, inline="always")
def _f64_1(r, k):
    return nb.carray(_f64(r[k]), (r[k + 1],))


@nb.njit(cache=True, nogil=True, inline="always")
def _f64_2(r, k):
    return nb.carray(_f64(r[k]), (r[k + 1], r[k + 2]))


@nb.njit(cache=True, nogil=True, inline="always")
def _i64_1(r, k):
    return nb.carray(_i64(r[k]), (r[k + 1],))


@nb.njit(cache=True, nogil=True, inline="always")
def _i64_2(r, k):
    return nb.carray(_i64(r[k]), (r[k + 1], r[k + 2]))


@_jit
def _run_bn(r):
    """Run the batch-norm job in board row r, as ``encode_bn_*`` wrote it."""
    counter = _i64_1(r, 1)
    a, b, c = _f32_3(r, 3), _f32_3(r, 7), _f32_3(r, 11)
    if r[0] == BN_BACKWARD:
        mean, gamma, beta, invstd = _f32_1(r, 15), _f32_1(r, 17), _f32_1(r, 19), _f32_1(r, 21)
        sum_dy, sum_dy_xhat = _f64_1(r, 23), _f64_1(r, 25)
        take_bn_backward(counter, r[27], a, b, mean, gamma, beta, invstd,
                         r.view(np.float64)[30], r[28] != 0, r[29] != 0, sum_dy, sum_dy_xhat,
                         c)
    else:
        gamma, beta = _f32_1(r, 15), _f32_1(r, 17)
        mean, var, invstd = _f64_1(r, 19), _f64_1(r, 21), _f64_1(r, 23)
        take_bn_forward(r[0] == BN_RELU_FORWARD, counter, r[25], a, gamma, beta,
                        r.view(np.float64)[26], b, c, mean, var, invstd)


@_jit
def _run(r):
    """Run the job in board row r, as ``encode_*`` wrote it."""
    if r[0] == FORWARD:
        x, u, bias = _f32_4(r, 1), _f32_3(r, 6), _f32_1(r, 10)
        blocks, counter = _i64_2(r, 12), _i64_1(r, 15)
        v2, m2, y = _f32_2(r, 17), _f32_2(r, 20), _f32_4(r, 23)
        k = 28
        forward_blocks(x, u, bias, r[k] != 0, r[k + 1] != 0, blocks, counter, r[k + 2],
                       r[k + 3], r[k + 4], r[k + 5], r[k + 6], r[k + 7], v2, m2, y)
    elif r[0] == BACKWARD:
        dy, x, u = _f32_4(r, 1), _f32_4(r, 6), _f32_3(r, 11)
        blocks, counter = _i64_2(r, 15), _i64_1(r, 18)
        v2, m2, dbp = _f32_2(r, 20), _f32_2(r, 23), _f64_1(r, 26)
        du, db, dx = _f32_4(r, 28), _f64_2(r, 33), _f32_4(r, 36)
        k = 41
        backward_blocks(dy, x, u, blocks, counter, r[k], r[k + 1], r[k + 2], r[k + 3],
                        r[k + 4], r[k + 5], v2, m2, dbp, du, db, r[k + 6], r[k + 7] != 0, dx)
    elif r[0] == ELEMENTWISE:
        take_elementwise(r[9], _i64_1(r, 1), r[10], _f32_1(r, 3), _f32_1(r, 5), _f32_1(r, 7))
    else:
        _run_bn(r)


@_jit
def serve(flags, i, n, seq, yields, board):
    """Helper i's watching (of a team of n): ``_threads._watch`` until a task is handed to
    it; runs each compiled job itself and stores its completion (flags[n + i] = its
    number, release); returns as ``_watch`` does for a Python task (seq, True) or after
    ``yields`` looks without a task (seq, False: it then sleeps on its semaphore)."""
    while True:
        seq, handed = _watch(flags, i, n, seq, yields, board)
        if not handed or board[i, 0] == PYTHON:
            return seq, handed
        _run(board[i])
        _store_release(flags, n + i, seq)


use_jobs(serve, _run)
# batch norm's channel-split kernels (``_dispatch``'s ``team`` hook) run as jobs
_numba_bn.bn_forward_train.team = lambda args: split_job(BN_FORWARD, args)
_numba_bn.bn_relu_forward_train.team = lambda args: split_job(BN_RELU_FORWARD, args)
_numba_bn.bn_backward.team = lambda args: split_job(BN_BACKWARD, args)
# and the elementwise ones, pieces of their elements
_numba.relu_forward.team = lambda args: elementwise_job(RELU_FORWARD, args)
_numba.relu_backward.team = lambda args: elementwise_job(RELU_BACKWARD, args)
_numba.add.team = lambda args: elementwise_job(ADD, args)
