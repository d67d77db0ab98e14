"""Whole blocks of samples split among threads, for the compiled convolution kernels.

A convolution over a batch is a loop over blocks of samples (transform or im2col, GEMM,
write back). With more than one thread, each thread takes every ``workers``-th block (or,
where ``run`` is ``dynamic``, the next block not yet taken) and runs it with the serial
kernels and one BLAS thread: no copies (the blocks touch disjoint
samples of x, y and dx; each thread has its own scratch work arrays; weight gradients are
summed after, in a fixed order) and one join per call. Splitting every kernel instead
costs a barrier per kernel and per threaded GEMM, and numba's OpenMP threads then share
the cores with OpenBLAS's spinning ones (measured on resnet20 at 2 threads: the im2col
layers used 4-9x their 1-thread CPU time that way).
"""
from __future__ import annotations

import contextlib
import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numba as nb
import numpy as np

from . import planner
from ._atomics import (  # noqa: F401  (fetch_add, _spin_while: kernels' and tests' names)
    _exchange, _load_acquire, _load_seq_cst, _post_add, _sched_yield, _spin_while,
    _store_release, _wait_done, fetch_add)
from ._numba_runtime import get_num_threads
from .planner import balanced_block, split_blocks  # noqa: F401  (the blocks' planning)

_pool: list = []  # the ThreadPoolExecutor, made on first use
_blas: list = []  # the threadpoolctl controller, made on first use


class _OneBlasThread:
    """BLAS on one thread inside, each BLAS library's previous count restored after.
    threadpoolctl's ``limit()`` builds a new limiter and asks every library for its
    state on each entry: 7.6 us per use against 1.7 us here, ~100 uses per resnet20 step."""

    def __init__(self, libs):
        self.libs, self.saved = libs, []

    def __enter__(self):
        saved = [lib.get_num_threads() for lib in self.libs]
        for lib in self.libs:
            lib.set_num_threads(1)
        self.saved.append(saved)
        return self

    def __exit__(self, *exc):
        for lib, n in zip(self.libs, self.saved.pop()):
            lib.set_num_threads(n)
        return False


def one_blas_thread():
    """A context in which BLAS runs on the calling thread only (threadpoolctl's library
    controllers; only the thread that entered it may leave it). The BLAS libraries are
    those loaded at the first use, numpy's among them (the kernels' GEMMs are numpy's);
    one loaded later (scipy's own, torch's) keeps its count."""
    if not _blas:
        from threadpoolctl import ThreadpoolController
        libs = [lib for lib in ThreadpoolController().lib_controllers
                if lib.user_api == "blas"]
        _blas.append(threading.local())
        _blas.append(libs)
    ctx = getattr(_blas[0], "ctx", None)
    if ctx is None:
        ctx = _blas[0].ctx = _OneBlasThread(_blas[1])
    return ctx


def blas_for(workers: int):
    """One BLAS thread when the blocks are split among threads (also for the small GEMMs
    around them: a threaded 16x9 by 9x4096 weight transform cost 4 ms of waiting on a
    preempted BLAS thread per call on a loaded host, more than its work), else no change."""
    return one_blas_thread() if workers > 1 else contextlib.nullcontext()


def block_workers(n: int, k: int) -> tuple[int, int]:
    """(samples per block, workers) for n samples in blocks of up to k: with 2+ threads
    and at least one sample per thread, at most ceil(n / threads) samples a block so that
    every thread gets work."""
    threads = get_num_threads()
    k = max(1, min(n, k))
    if threads > 1 and n >= threads:
        return balanced_block(n, k, threads), threads
    return k, 1


@nb.njit(cache=True, nogil=True)
def _post(flags, i, n):
    """Hand helper i of a team of n its next task (the task's words written before): its
    posted count, flags[i], + 1; whether it was awake (flags[2n + i]): if not, it sleeps on
    its semaphore, or is about to, and the caller releases that. Both steps are
    sequentially consistent, as the helper's going to sleep (``_team_jobs.serve``): it
    clears its awake flag, then looks at its posted count once more; so either it sees this
    task or the caller sees it asleep (a release it does not need wakes it for nothing)."""
    _post_add(flags, i)
    return _load_seq_cst(flags, 2 * n + i) != 0


# A team's board: per helper, its task's kind (PYTHON: a Python share, ``task``; else a
# compiled job, ``_team_jobs``) and the job's words.
PYTHON = 0
WORDS = 64


@nb.njit(cache=True, nogil=True)
def put(row, k, a):
    """Array a's address and shape into a job's words row[k:], returning the next free
    word (the jobs' encoders: ``_team_jobs``, ``_winograd4``)."""
    row[k] = a.ctypes.data
    for d in range(a.ndim):
        row[k + 1 + d] = a.shape[d]
    return k + 1 + a.ndim


@nb.njit(cache=True, nogil=True)
def _watch(flags, i, n, seq, yields, board):
    """Helper i's watching (of a team of n), its awake flag set: returns (its posted count,
    True) when a task is handed to it (posted count flags[i] past seq), or (seq, False)
    after ``yields`` looks without one, its awake flag cleared (``_may_sleep``). Before
    compiled jobs are loaded (``_SERVE``) every task goes back to Python; then
    ``_team_jobs.serve`` runs the jobs between calls of this."""
    _exchange(flags, 2 * n + i, 1)
    looks = 0
    while True:
        posted = _load_acquire(flags, i)
        if posted != seq:
            return posted, True
        if looks >= yields:
            if _may_sleep(flags, i, n, seq):
                return seq, False
            looks = 0
            continue
        looks += 1
        _sched_yield()


@nb.njit(cache=True, nogil=True)
def _may_sleep(flags, i, n, seq):
    """Helper i's awake flag cleared, then its posted count looked at once more (``_post``'s
    handshake): True when nothing was handed to it meanwhile (it sleeps on its semaphore
    next), else False with the flag set again."""
    _exchange(flags, 2 * n + i, 0)
    if _load_acquire(flags, i) == seq:
        return True
    _exchange(flags, 2 * n + i, 1)
    return False


@nb.njit(cache=True, nogil=True)
def _finish(flags, i, value):
    """flags[i] = value, a release store (a compiled job's completion)."""
    _store_release(flags, i, value)


# The helpers' watching loop and the runner of a compiled job found outside it:
# ``_team_jobs`` installs its own (``use_jobs``) when it is imported.
_SERVE = [_watch, None]


def use_jobs(serve, run_job) -> None:
    """Let the helpers run compiled jobs: serve(flags, i, n, seq, yields, board) watches
    and runs them (as ``_watch`` for the rest), run_job(board row) runs one."""
    _SERVE[:] = [serve, run_job]


class _Team:
    """Helper threads, each watching its counters for its share of a ``run`` (a Python
    body) or a compiled job (``run_jobs``), and asleep on a semaphore after the planner's
    spin_yields sched_yield calls without one.

    The watching is compiled (``_team_jobs.serve``) and runs a compiled job itself: the
    helper never takes the GIL for it, and the caller sees it finish from a release store.
    Hand-off and return then cost ~2 us (a 2-vCPU KVM guest, both threads awake) against
    65 us for a Python share: that helper must take the GIL to start, from a caller that
    holds it until its own share enters compiled code, and a thread that waits for the
    GIL sleeps on a futex (the helper's start a median 70-100 us after the hand-off in
    resnet20's step, ~100 ``run``s a step). A hand-off to a helper asleep (its awake flag
    clear, ``_post``) also releases its semaphore (55 us to wake on an idle guest, 300-450
    us on a busy one); a ThreadPoolExecutor's queue, future and condition measured 106 us.
    """

    def __init__(self, n: int):
        self.busy = threading.Lock()  # held by the ``run`` using the team
        self.go = [threading.Semaphore(0) for _ in range(n)]
        self.done = [threading.Lock() for _ in range(n)]
        for lock in self.done:
            lock.acquire()
        self.broken = False
        # flags[i]: the number of tasks handed to helper i, flags[n + i]: of those it has
        # finished (both only ever grow), flags[2n + i]: 1 while it watches (awake)
        self.flags = np.zeros(3 * n, np.int64)
        self.board = np.zeros((n, WORDS), np.int64)  # helper i's task: row i
        # the watching loop compiled (or loaded) here, so that a failure raises in the
        # caller, not in a helper thread: one call that returns at once
        _SERVE[0](np.zeros(3, np.int64), 0, 1, 0, 0, np.zeros((1, WORDS), np.int64))
        self._scratch: dict = {}
        self.n = n
        self.task: list = [None] * n
        self.result: list = [None] * n
        self.threads = [threading.Thread(target=self._loop, args=(i,), daemon=True,
                                         name=f"distnn-blocks_{i}") for i in range(n)]
        for thread in self.threads:
            thread.start()

    def scratch(self, i: int, name: str, shape: tuple, dtype) -> np.ndarray:
        """Helper i's work array for compiled jobs (``_numba_runtime.scratch``'s rule: one
        grow-only buffer per name and dtype), kept by the team."""
        dtype = np.dtype(dtype)
        size = math.prod(shape)
        buf = self._scratch.get((i, name, dtype))
        if buf is None or buf.size < size:
            buf = self._scratch[(i, name, dtype)] = np.empty(size, dtype)
        return buf[:size].reshape(shape)

    def _loop(self, i: int) -> None:
        seq = 0
        while True:
            serve, run_job = _SERVE
            seq, python = serve(self.flags, i, self.n, seq, planner.LIMITS.spin_yields, self.board)
            if not python:  # nothing for spin_yields looks: sleep until a hand-off
                self.go[i].acquire()
                continue
            if self.board[i, 0] != PYTHON:  # a job, seen by ``_watch`` before use_jobs
                _SERVE[1](self.board[i])
                _finish(self.flags, self.n + i, seq)
                continue
            body, indices = self.task[i]
            self.task[i] = None
            try:
                self.result[i] = (True, body(indices, True))
            except BaseException as exc:  # handed to the caller, raised there
                self.result[i] = (False, exc)
            self.flags[self.n + i] = seq
            self.done[i].release()

    def _hand(self, i: int) -> None:
        """Hand helper i the task written to its board (and ``task`` for Python)."""
        if not _post(self.flags, i, self.n):
            self.go[i].release()

    def run(self, parts, body) -> list:
        """body over parts[:-1] on the helpers and parts[-1] here; every helper has
        finished when this returns or raises (the first error raised, the caller's first)."""
        for i, part in enumerate(parts[:-1]):
            self.task[i] = (body, part)
            self.board[i, 0] = PYTHON
            self._hand(i)
        try:
            last = body(parts[-1], True)
        finally:
            outs = []
            try:
                for i in range(len(parts) - 1):
                    yields = planner.LIMITS.spin_yields
                    if yields:
                        _spin_while(self.flags, self.n + i, self.flags[i] - 1, yields)
                    self.done[i].acquire()
                    outs.append(self.result[i])
                    self.result[i] = None
            except BaseException:
                # interrupted while a helper still runs (Ctrl-C): its lock states are
                # unknown now, so the next ``run`` makes a new team
                self.broken = True
                raise
        for ok, value in outs:
            if not ok:
                raise value
        return [value for _, value in outs] + [last]

    def run_jobs(self, helpers: int, encode, own) -> None:
        """encode(board row, i, team) writes helper i's compiled job, for helpers 0 to
        helpers - 1; own() runs here; returns when every helper has finished its job."""
        for i in range(helpers):
            encode(self.board[i], i, self)
            self._hand(i)
        try:
            own()
        finally:
            for i in range(helpers):  # compiled jobs raise nothing: each finishes
                while not _wait_done(self.flags, self.n + i, self.flags[i], 1 << 16):
                    if not self.threads[i].is_alive():  # (never seen: no hang if it were)
                        self.broken = True
                        raise RuntimeError(f"distnn block thread {i} died during a job")


_teams: dict = {}  # helpers -> _Team, each made on first use (and again after a fork)
_team_init = threading.Lock()


def _forget_teams() -> None:
    _teams.clear()  # their threads do not exist in a forked child
    _pool.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_teams)


def run(nblocks: int, workers: int, body, dynamic: bool = False) -> list:
    """body(indices, serial) over range(nblocks): in this thread with the parallel kernels
    (workers == 1), or split among ``workers`` threads with the serial ones.

    Split round-robin by default: the results in share order (share i holds blocks i,
    i + workers, ...), whichever thread ran it. This thread takes the last share, the
    lightest: it has fewer blocks, or the last, shorter block, and this thread has the
    hand-off and the serial work around.
    ``dynamic``: every thread takes the next block not yet taken (``indices`` is one
    iterator shared by all, in block order) until none is left, so a thread that started
    late or runs slower takes fewer; a body whose results must not depend on which thread
    ran a block keeps them per block (the results here are per thread, in no set order).
    The other shares go to a team of helper threads; while another ``run`` holds the team
    (a second Python thread's, or one nested in a body), to a ThreadPoolExecutor."""
    if workers == 1:
        return [body(range(nblocks), False)]
    if dynamic and planner.LIMITS.dynamic:
        # range_iterator's next() runs under the GIL: each block is taken exactly once
        parts = [iter(range(nblocks))] * workers
    else:
        parts = [range(i, nblocks, workers) for i in range(workers)]
    team = _team(workers)
    if team.busy.acquire(blocking=False):
        try:
            with one_blas_thread():
                return team.run(parts, body)
        finally:
            team.busy.release()
    if not _pool or _pool[0]._max_workers < workers - 1:
        # workers - 1 pool threads (the caller is the first worker): with more, a task
        # submitted before the last one's thread went idle starts another thread, and every
        # thread keeps its own scratch arrays and malloc arena
        _pool[:] = [ThreadPoolExecutor(workers - 1, thread_name_prefix="distnn-blocks")]
    with one_blas_thread():
        futures = [_pool[0].submit(body, part, True) for part in parts[:-1]]
        last = body(parts[-1], True)
        return [fu.result() for fu in futures] + [last]


def sum_shares(parts: list) -> tuple:
    """``run``'s results (part, float64 sums) of every share added in share order, a
    share's None part (no block) left out: the same sums for the same thread count."""
    total, sums = parts[0]
    for part, more in parts[1:]:
        if part is not None:
            total += part
        sums += more
    return total, sums


def _team(workers: int) -> _Team:
    team = _teams.get(workers - 1)
    if team is None or team.broken:
        with _team_init:
            team = _teams.get(workers - 1)
            if team is None or team.broken:
                team = _teams[workers - 1] = _Team(workers - 1)
    return team


def run_jobs(workers: int, encode, own) -> bool:
    """A compiled job on ``workers`` - 1 helper threads (encode(board row, i, team) writes
    helper i's: ``_team_jobs``) and own() in this thread, like ``run`` with one share each
    but without the helpers taking the GIL; False (nothing run) when the team is in use (a
    nested call, or another Python thread's): the caller then uses ``run``."""
    team = _team(workers)
    if not team.busy.acquire(blocking=False):
        return False
    try:
        team.run_jobs(workers - 1, encode, own)
    finally:
        team.busy.release()
    return True


def kernel(k, serial: bool):
    """The serial twin of a dispatched compiled kernel (over its whole range) when
    ``serial``, else the kernel."""
    return k.whole if serial else k




def matmul(a, b, out=None):
    """np.matmul(a, b, out=out), on one BLAS thread when a and b are 2-D, the product is
    small (m*n*k <= the planner's small_gemm) and more than one thread is set: a threaded
    BLAS call spins until its second thread gets a core, which costs more than a small
    product's work (on a loaded host, more than a large one's too)."""
    import numpy as np
    if (get_num_threads() > 1 and a.ndim == 2 and b.ndim == 2
            and a.shape[0] * a.shape[1] * b.shape[1] <= planner.LIMITS.small_gemm):
        with one_blas_thread():
            return np.matmul(a, b, out=out)
    return np.matmul(a, b, out=out)


def pieces(n: int, fn, min_items: int = 1 << 20) -> None:
    """fn(a, b) over contiguous pieces [a, b) covering range(n), the planner's
    pieces_per_thread pieces per thread taken in turn by whichever thread is free
    (``run``'s ``dynamic``) when n >= min_items and more than one thread is set (else
    fn(0, n) here): for elementwise or per-channel work (an optimizer step over a
    model's parameter buffer, whose NumPy ufuncs release the GIL; batch norm's channels).
    Each element is computed as it would be in one piece, whichever thread takes it."""
    threads = get_num_threads()
    if threads <= 1 or n < min_items:
        fn(0, n)
        return
    step = -(-n // min(n, threads * planner.LIMITS.pieces_per_thread))

    def body(indices, serial):
        for i in indices:
            fn(i * step, min(n, (i + 1) * step))

    run(-(-n // step), threads, body, dynamic=True)
