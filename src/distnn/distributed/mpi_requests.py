"""What a rank waits on in MPI: the handle of a started non-blocking operation
(``_MPIHandle``: collectives, point to point, one-sided reads), its completion by polling
when the stall inspector must be able to interrupt it (``_poll``), and ``SlotWindow``, a
few float64 numbers per rank that any rank reads without the target taking part (the stall
inspector's). ``MPIComm`` (mpi_comm.py) makes them; nothing here imports mpi4py.
"""
from __future__ import annotations

import numpy as np

from .comm_base import _divide_
from .coordination import Backoff


def _poll(request, inspector, keep=None) -> None:
    """Complete ``request`` by testing it between ``Backoff`` pauses; the inspector's
    ``PeerFailed`` once a peer has said it failed (``keep`` then stays alive)."""
    backoff = Backoff(1e-3, min_sleep=1e-5, spin_s=0.05)  # MPI progresses only while tested
    while not request.Test():
        if inspector.any_failed:
            inspector.give_up(request, keep)
        backoff.pause()


class _MPIHandle:
    def __init__(self, request, arr: np.ndarray, divide_by: int, keep=None, watch=None):
        self._request = request
        self._arr = arr
        self._divide_by = divide_by
        self._keep = keep  # objects MPI reads from until completion (datatype, op)
        self._done = False
        self._watch = watch  # (stall inspector, collective number or None, peers)

    def wait(self) -> np.ndarray:
        if not self._done:
            if self._watch is not None:
                inspector, seq, peers = self._watch
                inspector.enter(seq, peers)
                try:
                    if inspector.interruptible:
                        _poll(self._request, inspector, (self._arr, self._keep))
                    else:
                        self._request.Wait()
                finally:
                    inspector.leave()
            else:
                self._request.Wait()
            self._done = True
            _divide_(self._arr, self._divide_by)
        return self._arr

    def test(self) -> bool:
        """True once the collective is complete (drives MPI progress)."""
        if not self._done and self._request.Test():
            self._done = True
            _divide_(self._arr, self._divide_by)
        return self._done


class SlotWindow:
    """``slots`` float64 numbers per rank in a one-sided window (collective) under passive
    target (``Lock_all``: a read needs nothing from the target); ``local``: this rank's."""

    def __init__(self, comm, slots: int):  # comm: an MPIComm
        self._MPI = comm.MPI
        self._comm = comm.comm.Dup()
        self._win = self._MPI.Win.Allocate(slots * 8, 8, comm=self._comm)
        self.local = np.frombuffer(self._win.tomemory(), dtype=np.float64)
        self._win.Lock_all()

    @property
    def open(self) -> bool:  # not freed yet, and MPI still running
        return self._win is not None and not self._MPI.Is_finalized()

    def get_(self, buf: np.ndarray, rank: int) -> "_MPIHandle":  # read rank's slots
        return _MPIHandle(self._win.Rget(buf, rank), buf, 1)

    def put(self, values: np.ndarray, rank: int, slot: int) -> None:
        """Write ``values`` into ``rank``'s slots from ``slot`` on (``flush`` completes it)."""
        self._win.Put(values, rank, target=slot)

    def flush(self) -> None:
        self._win.Flush_all()

    def free(self) -> None:  # collective
        self._win.Unlock_all()
        self._win.Free()
        self._comm.Free()
        self._win = None
