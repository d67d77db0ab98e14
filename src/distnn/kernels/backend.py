"""Which implementation runs the kernels' element-wise loops: "numpy" or "numba".

NumPy is the reference and the fallback; "numba" runs compiled, multi-threaded loops for
the memory-bound parts (im2col/col2im, padding and layout copies, pooling, batch norm,
activations) and leaves the GEMMs to NumPy's BLAS. Results are the same to float rounding
of reductions. The default is "numba" when it imports, else "numpy"; the environment
variable ``DISTNN_KERNELS=numpy|numba`` or ``set_backend()`` choose explicitly.
"""
from __future__ import annotations

import os

import numpy as np

_BACKENDS = ("numpy", "numba")
_state = {"name": None, "module": None}


def _load_numba():
    from . import _numba  # noqa: F401  (compiles lazily, per kernel, from the disk cache)
    from . import _team_jobs  # noqa: F401  (the block threads' compiled jobs, installed)
    return _numba


def set_backend(name: str | None) -> str:
    """Select the kernel backend ("numpy", "numba", or None for the default); returns the
    backend in effect. Asking for "numba" when numba cannot be imported raises."""
    if name is None:
        name = os.environ.get("DISTNN_KERNELS", "").strip().lower() or None
    if name is not None and name not in _BACKENDS:
        raise ValueError(f"kernel backend must be one of {_BACKENDS}, got {name!r} "
                         "(from set_backend() or DISTNN_KERNELS)")
    module = None
    if name in (None, "numba"):
        try:
            module = _load_numba()
        except ImportError as exc:
            if name == "numba":
                raise ImportError(f"kernel backend 'numba' needs numba installed ({exc}); "
                                  "pip install numba or use DISTNN_KERNELS=numpy") from exc
    _state["name"] = "numba" if module is not None else "numpy"
    _state["module"] = module
    return _state["name"]


def backend() -> str:
    """The kernel backend in effect ("numpy" or "numba")."""
    if _state["name"] is None:
        set_backend(None)
    return _state["name"]


def compiled():
    """The compiled-kernel module, or None when the NumPy path is selected."""
    if _state["name"] is None:
        set_backend(None)
    return _state["module"]


def set_num_threads(n: int) -> None:
    """Threads of the compiled loops (default: ``threads_per_rank()``); BLAS threads are
    set separately (threadpoolctl)."""
    fast = compiled()
    if fast is not None:
        fast.set_num_threads(n)


def get_num_threads() -> int:
    """Threads of the compiled loops (1 on the NumPy backend)."""
    fast = compiled()
    return fast.get_num_threads() if fast is not None else 1


def matmul(a, b, out=None):
    """np.matmul(a, b, out=out); with 2+ compiled threads, a small 2-D product runs on one
    BLAS thread (``_threads.matmul``). numba is not imported on the NumPy backend."""
    if get_num_threads() <= 1:
        return np.matmul(a, b, out=out)
    from ._threads import matmul as threaded
    return threaded(a, b, out=out)


def pieces(n: int, fn, min_items: int = 1 << 20) -> None:
    """fn(a, b) over contiguous pieces covering range(n), split among the compiled threads
    (``_threads.pieces``); fn(0, n) here with one thread or on the NumPy backend."""
    if get_num_threads() <= 1 or n < min_items:
        fn(0, n)
        return
    from ._threads import pieces as threaded
    threaded(n, fn, min_items)


def compile_counts() -> tuple[int, int]:
    """(compiled, loaded): how many compiled-kernel signatures this process has compiled
    anew and how many it loaded from numba's disk cache so far ((0, 0) on NumPy)."""
    if compiled() is None:
        return 0, 0
    import sys

    from numba.core.registry import CPUDispatcher
    made = loaded = 0
    for name, module in list(sys.modules.items()):
        if not name.startswith(__package__ + ".") or module is None:
            continue
        for value in vars(module).values():
            if isinstance(value, CPUDispatcher):
                stats = value.stats
                made += sum(stats.cache_misses.values())
                loaded += sum(stats.cache_hits.values())
    return made, loaded
