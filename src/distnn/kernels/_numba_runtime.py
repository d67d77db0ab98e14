"""The numba runtime of the compiled kernels (``_numba``): the threading layer (OpenMP
first, with passive waiting while it loads), the ``njit`` options the kernels are compiled
with, the thread count, the dispatch of each kernel to its serial or parallel compilation,
and the work arrays shared by all layers (``scratch``).
"""
from __future__ import annotations

import functools
import math
import os
import threading
import types

# OpenMP (libgomp) when it loads, else numba's own workqueue (TBB last). With OpenMP's
# waiting threads passive (see _start_pool) and OpenBLAS's too (OPENBLAS_THREAD_TIMEOUT,
# distnn/__init__.py), the OpenMP pool measured fastest: resnet20 at 2 threads 379 ms per
# step against 542 ms on the workqueue layer with spinning BLAS threads.
os.environ.setdefault("NUMBA_THREADING_LAYER_PRIORITY", "omp workqueue tbb")

import numba as nb  # noqa: E402
import numpy as np  # noqa: E402

from . import _numba_cache, planner  # noqa: E402

_numba_cache.install()  # before any kernel compiles: processes compiling at once share it

_U = np.uintp
_jit = nb.njit(parallel=True, cache=True, nogil=True)
_jit_serial = nb.njit(cache=True, nogil=True)
# Per-channel sums: reassociation lets LLVM vectorize the float64 accumulation (a serial
# chain of dependent adds runs at one element per ~4 cycles); no other fast-math flag.
_jit_sums = nb.njit(parallel=True, cache=True, nogil=True, fastmath={"reassoc", "contract"})


# -- helpers of the loops (``_numba``, ``_numba_depthwise``) ----------------------------
@_jit_serial
def _valid_q(ow, sw, off, w):
    """[q0, q1): outputs q whose input column q*sw + off lies in [0, w)."""
    q0 = 0
    while q0 < ow and q0 * sw + off < 0:
        q0 += 1
    q1 = ow
    while q1 > q0 and (q1 - 1) * sw + off >= w:
        q1 -= 1
    return q0, q1


def default_threads() -> int:
    """OMP_NUM_THREADS when set; else this process's cores shared among its node's ranks."""
    from .node import loop_threads
    return loop_threads()


def set_num_threads(n: int) -> None:
    n = max(1, min(int(n), nb.config.NUMBA_NUM_THREADS))
    _threads[0] = n
    nb.set_num_threads(n)  # this thread's parallel launches (``parallel_at_one`` at 1)


def get_num_threads() -> int:
    return _threads[0]


# -- dispatch -------------------------------------------------------------------------
# With one thread the serial compilation runs in the caller's thread: a parallel launch
# would hand the loop to a pool worker and wait for it, a context switch per kernel call.
# Parallel launches are serialized: the workqueue layer aborts the process when two Python
# threads launch parallel loops at once (a layer used from several threads, or ranks
# simulated by threads in the tests); a lock costs ~0.1 us against kernels of 10 us and up.
_launch = threading.Lock()
_threads = [1]


def _dispatch(parallel_kernel, parallel_at_one: bool = False, small_serial: bool = False,
              split=None, pieces=None):
    """The kernel as called by the layers: its serial twin at 1 thread, the parallel
    compilation (serialized launches) with more. ``parallel_at_one``: at 1 thread too, on a
    team of one (numba's thread count of the calling thread is 1 after ``set_num_threads(1)``
    there; from another thread the serial twin runs), for kernels whose parallel compilation
    LLVM vectorizes and whose serial one it does not: the 2x2 max-pool backward, 64x8x24x24
    float32 on an AVX2 host, 0.18 ms against 0.99 (forward 0.105 against 0.174).
    ``small_serial`` (memory-bound loops): with more threads, a first array of fewer than
    the planner's ``parallel_min`` elements (read at each call) runs as at 1 thread.
    ``split(args)``: for a kernel whose last two arguments are the range (lo, hi) of its
    outer loop, that loop's length. The caller then leaves them out; with more threads the
    serial twin runs on contiguous pieces of the range, several a thread, through ``pieces``
    (``_threads.pieces``: the block threads, which look for work before they sleep)
    instead of on OpenMP's, whose sleeping thread needs a wake-up per call (batch norm runs
    between two convolutions, whose blocks keep the block threads awake).
    ``whole``: the serial twin over the kernel's whole range (a split kernel's range filled
    in), for callers that split the work among threads themselves.
    A split kernel's ``team`` attribute (None here; ``_team_jobs`` sets batch norm's):
    team(args), with more threads, is tried before ``small_serial``'s size rule and
    ``pieces``: True where it ran the kernel (as compiled jobs of the block threads, no GIL
    taken on their side)."""
    if split is not None and pieces is None:
        raise TypeError("_dispatch: a split kernel needs pieces (_threads.pieces)")
    # a copy under its own name: the disk cache is keyed by function name, not options
    f = parallel_kernel.py_func
    twin = types.FunctionType(f.__code__, f.__globals__, f.__name__ + "_serial",
                              f.__defaults__, f.__closure__)
    twin.__qualname__ = f.__qualname__ + "_serial"
    options = parallel_kernel.targetoptions
    serial_kernel = nb.njit(cache=True, nogil=True, fastmath=options.get("fastmath", False),
                            error_model=options.get("error_model", "python"))(twin)

    if split is not None:
        @functools.wraps(parallel_kernel.py_func)
        def call(*args):
            n = split(args)
            if _threads[0] == 1:
                return serial_kernel(*args, 0, n)
            if call.team is not None and call.team(args):
                return None
            if small_serial and args[0].size < planner.LIMITS.parallel_min:
                return serial_kernel(*args, 0, n)
            pieces(n, lambda lo, hi: serial_kernel(*args, lo, hi), min_items=2)
            return None
        call.parallel, call.serial, call.team = parallel_kernel, serial_kernel, None
        call.whole = lambda *args: serial_kernel(*args, 0, split(args))
        return call

    @functools.wraps(parallel_kernel.py_func)
    def call(*args):
        if _threads[0] == 1 and not (parallel_at_one and nb.get_num_threads() == 1):
            return serial_kernel(*args)
        if small_serial and args[0].size < planner.LIMITS.parallel_min:
            if not parallel_at_one:
                return serial_kernel(*args)
            with _launch:  # on a team of one, as at 1 thread
                saved = nb.get_num_threads()
                nb.set_num_threads(1)
                try:
                    return parallel_kernel(*args)
                finally:
                    nb.set_num_threads(saved)
        with _launch:
            return parallel_kernel(*args)
    call.parallel, call.serial, call.whole = parallel_kernel, serial_kernel, serial_kernel
    return call


def channels(args) -> int:
    """``_dispatch``'s split over axis 1 of the first argument (N, C, S)."""
    return args[0].shape[1]


def elements(args) -> int:
    """``_dispatch``'s split over the first argument's elements."""
    return args[0].size




# -- work arrays shared by all layers ---------------------------------------------------
_scratch = threading.local()


def scratch(name: str, shape: tuple, dtype) -> np.ndarray:
    """A C-contiguous work array of ``shape`` backed by one grow-only buffer per (name,
    dtype) and thread, shared by every layer: layers run one at a time, and the big column
    matrices then cost one buffer instead of one per layer."""
    dtype = np.dtype(dtype)
    size = math.prod(shape)  # np.prod of a tuple: ~8 us, called ~250 times a resnet20 step
    pool = _scratch.__dict__.setdefault("pool", {})
    buf = pool.get((name, dtype))
    if buf is None or buf.size < size:
        buf = pool[(name, dtype)] = np.empty(size, dtype)
    return buf[:size].reshape(shape)


def _start_pool() -> None:
    """Load numba's threading layer now, with OMP_WAIT_POLICY=PASSIVE unless the user set
    it: libgomp reads it once, when it loads. A spinning OpenMP pool and OpenBLAS's threads
    take turns on the same cores and slow each other. The variable is removed again, so an
    OpenMP runtime loaded later (torch has its own) keeps its default: passive waiting made
    torch's small convolutions at 2 threads 4x slower.

    Passive, but after a parallel loop a libgomp thread first spins GOMP_SPINCOUNT (1000
    pauses, tens of microseconds) for the next one: BN and ReLU launch several loops in a
    row, and a sleeping thread needs a wake-up per loop. resnet20 at 2 threads, 4 rounds
    alternated on a loaded host: 99-120 ms a step against 102-127 ms without spinning, the
    same process CPU; 10000 spins and more took the core from the block threads (+5-25%)."""
    added = {}
    if os.environ.get("OMP_WAIT_POLICY") is None:
        added["OMP_WAIT_POLICY"] = "PASSIVE"
        if os.environ.get("GOMP_SPINCOUNT") is None:
            added["GOMP_SPINCOUNT"] = str(GOMP_SPINCOUNT)
    os.environ.update(added)
    try:
        nb.get_num_threads()  # launches the threading layer
    finally:
        for var in added:
            os.environ.pop(var, None)


GOMP_SPINCOUNT = 1000


_start_pool()
set_num_threads(default_threads())
