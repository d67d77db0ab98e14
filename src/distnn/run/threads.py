"""Threads per rank applied to everything that runs threads: the compiled kernels' loops,
the BLAS pools (threadpoolctl) and torch's intra-op pool. The number is decided once, by
``distnn.distributed.threads_per_rank`` (``--threads``, else the node's cores shared among
its ranks); the run builder applies it before it reads any data.
"""
from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass, field
from typing import Any, Iterator

__all__ = ["AppliedThreads", "apply_threads", "threads_scope"]


@dataclass
class AppliedThreads:
    """What ``apply_threads`` set, and what was there before (``restore`` puts it back)."""

    threads: int
    _kernels_before: int = 1
    _blas: Any = None
    _torch_before: int | None = None
    _done: bool = field(default=False, repr=False)

    def restore(self) -> None:
        if self._done:
            return
        self._done = True
        from .. import kernels
        kernels.set_num_threads(self._kernels_before)
        if self._blas is not None:
            self._blas.restore_original_limits()
        if self._torch_before is not None and "torch" in sys.modules:
            sys.modules["torch"].set_num_threads(self._torch_before)


def apply_threads(n: int) -> AppliedThreads:
    """Give ``n`` threads to the compiled kernels, the BLAS pools and, when torch is
    loaded, torch (a torch model loaded later gets them from the run builder). Stays in
    effect until ``restore()``: a run's threads are the process's, as torch's are."""
    from threadpoolctl import threadpool_limits

    from .. import kernels
    n = max(1, int(n))
    applied = AppliedThreads(n, _kernels_before=kernels.get_num_threads())
    kernels.set_num_threads(n)
    applied._blas = threadpool_limits(limits=n)
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "set_num_threads"):
        applied._torch_before = torch.get_num_threads()
        torch.set_num_threads(n)
    return applied


def apply_kernel_plan(spec: str) -> str:
    """``--kernels``: how the kernels choose each layer's method (``kernels.measure``); a
    plan file that cannot be read is a RunError naming --kernels (on every rank alike:
    each reads the same path)."""
    from ..kernels import measure
    from .errors import RunError
    try:
        return measure.set_mode(spec)
    except ValueError as exc:
        raise RunError(str(exc)) from None


@contextlib.contextmanager
def threads_scope(n: int | None = None) -> Iterator[AppliedThreads | None]:
    """Threads as they were before the block, after it: ``n`` applied for the block (None:
    only the restoring, around code that builds runs, which apply their own)."""
    from threadpoolctl import threadpool_limits

    from .. import kernels
    before = kernels.get_num_threads()
    blas = threadpool_limits(limits=None)  # records the pools' sizes; changes nothing
    torch = sys.modules.get("torch")
    torch_before = torch.get_num_threads() if torch is not None else None
    applied = apply_threads(n) if n is not None else None
    try:
        yield applied
    finally:
        if applied is not None:
            applied.restore()
        kernels.set_num_threads(before)
        blas.restore_original_limits()
        torch = sys.modules.get("torch")
        if torch is not None and torch_before is not None:
            torch.set_num_threads(torch_before)
