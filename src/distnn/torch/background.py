"""The background queue of ``distnn.torch``'s asynchronous collectives (Horovod's background
thread), and the names of the operations in flight.

Every ``*_async`` collective (all-reduces, allgather, broadcast, alltoall, reducescatter
and their grouped forms) returns at once: a worker thread runs them, in the order they were
called, on a duplicate of the process set's communicator made by ``hvd.init()`` (or
``add_process_set``), so they never interleave with the collectives the main thread calls
meanwhile (MPI matches collectives per communicator, in posting order). ``poll(handle)`` is
True once the worker has finished it; ``synchronize(handle)`` waits and returns its output
(or raises its error). The worker needs MPI_THREAD_MULTIPLE (mpi4py asks for it); without
it, or with an explicit ``comm=``, these calls complete when called.

``allreduce_async(_)``, ``grouped_allreduce_async(_)`` and ``sparse_allreduce_async`` are
queued too. The worker's communicator is join-safe (``JoinableComm``): ``hvd.join()`` serves
the queued all-reduces of the ranks still training as well as the main thread's.

Names: a name given to an ``*_async`` call stays taken until its handle is synchronized (a
handle dropped unsynchronized frees it once its collective has run); a second call with a
name in flight raises ``ValueError``, as in Horovod.
"""
from __future__ import annotations

import queue
import threading

import torch

from ..distributed.join import JoinableComm

_in_flight: set = set()
_lock = threading.Lock()


def reserve(name, what: str):
    """Take ``name`` for an operation in flight (None: nothing to take)."""
    if name is None:
        return None
    with _lock:
        if name in _in_flight:
            raise ValueError(f"{what}: an operation named {name!r} is still in flight "
                             "(not yet synchronized); names of operations in flight must be "
                             "unique: synchronize the first one or pick another name")
        _in_flight.add(name)
    return name


def check_free(name, what: str) -> None:
    """A blocking call may not reuse the name of an operation in flight."""
    if name is not None and name in _in_flight:
        raise ValueError(f"{what}: an operation named {name!r} is still in flight; "
                         "synchronize it first or pick another name")


def release(name) -> None:
    if name is not None:
        with _lock:
            _in_flight.discard(name)


class Worker:
    """One thread that runs queued collectives in call order on its own communicator.

    Args:
        comm: the communicator the queued collectives use (a duplicate of the channel's:
            every rank of it must make its Worker at the same point, e.g. in ``init``).
    """

    def __init__(self, comm):
        self.comm = comm
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self.submitted = 0
        self.completed = 0
        self._progress = threading.Condition()

    def submit(self, fn) -> "Future":
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, daemon=True,
                                            name="distnn-torch-collectives")
            self._thread.start()
        future = Future()
        self.submitted += 1
        self._queue.put((fn, future))
        return future

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            fn, future = item
            try:
                with torch.no_grad():
                    out, err = fn(self.comm), None
            except BaseException as exc:  # delivered to the caller by synchronize()
                out, err = None, exc
            future.set(out, err)
            with self._progress:
                self.completed += 1
                self._progress.notify_all()

    def wait_completed(self, count: int) -> None:
        """Wait until the first ``count`` queued collectives have run."""
        with self._progress:
            self._progress.wait_for(lambda: self.completed >= count)

    def stop(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread = None


class Future:
    """What a queued collective will produce; ``Handle`` wraps it."""

    def __init__(self):
        self._event = threading.Event()
        self.output = self.error = None
        self._after: list = []

    def set(self, output, error) -> None:
        self.output, self.error = output, error
        with _lock:
            self._event.set()
            after, self._after = self._after, []
        for fn in after:
            fn()

    def after(self, fn) -> None:
        """Call ``fn`` once the collective has run (now if it has)."""
        with _lock:
            if not self._event.is_set():
                self._after.append(fn)
                return
        fn()

    def test(self) -> bool:
        return self._event.is_set()

    def wait(self):
        self._event.wait()
        if self.error is not None:
            raise self.error
        return self.output


def make_worker(comm):
    """A Worker over a duplicate of ``comm`` (collective over comm), or None when the
    queued collectives would run when called (one rank, or MPI without threads)."""
    if comm is None or comm.size == 1 or not hasattr(comm, "split"):
        return None
    MPI = getattr(comm, "MPI", None)
    if MPI is None or MPI.Query_thread() != MPI.THREAD_MULTIPLE:
        return None
    dup = comm.split(0, comm.rank)
    dup.stall = None  # the stall inspector counts the main thread's collectives only
    return Worker(JoinableComm(dup))  # hvd.join() serves the queued all-reduces too


def release_after(future: Future, name) -> None:
    """Free ``name`` once ``future`` has run (a handle dropped without synchronize: the
    operation is in flight until then)."""
    future.after(lambda: release(name))
