"""Two things every multi-rank caller needs, done one way:

* ``on_ranks``: run a function on every rank or on one, and agree on its error, so that a
  failure on one rank is the same exception on all of them (never a rank left waiting in
  the next collective);
* waiting without spinning: MPICH's blocking calls busy-poll a core, which on a machine
  with fewer cores than ranks steals it from the ranks that compute. ``Backoff`` sleeps
  between polls (doubling up to a bound), ``wait_all`` completes handles with it and
  ``lazy_barrier`` is a barrier built on it.
"""
from __future__ import annotations

import os
import pickle
import socket
import time
from typing import Any, Callable, Iterable

import numpy as np

__all__ = ["on_ranks", "Backoff", "wait_all", "lazy_barrier", "MIN_SLEEP"]

MIN_SLEEP = 1e-4


class Backoff:
    """Sleeps between polls: ``MIN_SLEEP`` first, doubling up to ``max_sleep``; ``reset()``
    after a poll that found work. With ``spin_s`` the first ``spin_s`` seconds (from the
    creation or the last ``reset``) only yield the core (``os.sched_yield``), as MPICH's own
    waits do, for waits that are usually short.

    Example:
        backoff = Backoff(2e-3)
        while (msg := comm.iprobe(-1, TAG)) is None:
            backoff.pause()
    """

    def __init__(self, max_sleep: float = 1e-3, min_sleep: float = MIN_SLEEP,
                 spin_s: float = 0.0):
        self.min_sleep, self.max_sleep = float(min_sleep), float(max_sleep)
        self.spin_s = float(spin_s)
        self.reset()

    def pause(self) -> None:
        if self.spin_s and time.perf_counter() - self._t0 <= self.spin_s:
            os.sched_yield()  # let a rank sharing this core run
            return
        time.sleep(self.delay)
        self.delay = min(self.delay * 2, self.max_sleep)

    def reset(self) -> None:
        self.delay = min(self.min_sleep, self.max_sleep)
        self._t0 = time.perf_counter()


def wait_all(handles: Iterable[Any], max_sleep: float = 1e-3, spin_s: float = 0.0) -> float:
    """Complete every handle (``test()``; None entries are skipped), sleeping between polls
    instead of spinning (after ``spin_s`` seconds of polls that only yield the core:
    ``Backoff``); returns the seconds it waited."""
    t0 = time.perf_counter()
    backoff = Backoff(max_sleep, spin_s=spin_s)
    pending = [h for h in handles if h is not None]
    watch = next((h._watch for h in pending if getattr(h, "_watch", None) is not None), None)
    if watch is not None:  # a stall inspector names whom these handles wait for
        watch[0].enter(watch[1], [p for h in pending if h._watch for p in h._watch[2] or ()])
    try:
        while pending:
            pending = [h for h in pending if not h.test()]
            if pending:
                if watch is not None and watch[0].interruptible:
                    watch[0].give_up(pending)  # a failed rank will not join (search blocks)
                backoff.pause()
    finally:
        if watch is not None:
            watch[0].leave()
    return time.perf_counter() - t0


def lazy_barrier(comm, max_sleep: float = 5e-3) -> float:
    """A barrier whose waiting ranks sleep instead of spinning (a non-blocking all-reduce
    of one number, tested between sleeps); returns the seconds it waited."""
    if comm.size == 1:
        return 0.0
    return wait_all([comm.iallreduce_(np.zeros(1))], max_sleep)


def _portable(exc: BaseException | None) -> BaseException | None:
    """``exc`` as it can travel to other ranks (a RuntimeError with its text when it does
    not pickle)."""
    if exc is None:
        return None
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001 - any pickling failure falls back to the text
        return RuntimeError(f"{type(exc).__name__}: {exc}")


def on_ranks(comm, fn: Callable[[], Any], *, root: int | None = None,
             catch: type[BaseException] | tuple[type[BaseException], ...] = Exception,
             lazy: bool = False) -> Any:
    """Run ``fn()`` on every rank (``root=None``) or on rank ``root`` only, and agree on
    its error: if it raises one of ``catch`` on any rank, every rank raises that exception
    (the first failing rank's; a copy on the others) with ``exc.rank`` (that rank),
    ``exc.ranks`` (every rank that failed), ``exc.host`` (the first failing rank's host)
    and ``exc.hosts`` (the hosts of the job, by rank; with ``root``, only its host) set.
    One all-gather (every rank) or broadcast (root) of the error; ``lazy``: the ranks
    that do not run ``fn`` wait without spinning.

    Returns ``fn()``'s result (None on the ranks that did not run it).

    Example:
        state = on_ranks(comm, lambda: load_checkpoint(path), catch=(OSError, ValueError))
    """
    error: BaseException | None = None
    result = None
    if root is None or comm.rank == root:
        try:
            result = fn()
        except catch as exc:
            error = exc
    host = socket.gethostname()
    if comm.size == 1:
        errors, hosts = [error], [host]
    elif root is None:
        pairs = comm.allgather_obj((host, _portable(error)))
        hosts, errors = [h for h, _ in pairs], [e for _, e in pairs]
    else:
        if lazy:
            lazy_barrier(comm)
        sent, root_host = comm.bcast_obj((_portable(error), host), root)
        errors = [sent if r == root else None for r in range(comm.size)]
        hosts = [root_host]
    failed = [r for r, e in enumerate(errors) if e is not None]
    if not failed:
        return result
    first = failed[0]
    exc = error if comm.rank == first else errors[first]  # own: with its traceback
    exc.rank, exc.ranks = first, failed
    exc.host, exc.hosts = hosts[first] if len(hosts) > first else hosts[0], hosts
    raise exc
