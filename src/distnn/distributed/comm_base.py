"""The ``Communicator`` protocol, the argument checks every communicator shares, and
``LocalComm``, the size-1 communicator used when mpi4py is not installed (every
collective is then the identity). ``MPIComm`` is in ``distnn.distributed.mpi_comm``;
``distnn.distributed.comm`` gathers both.
"""
from __future__ import annotations

import os
import sys
from typing import Any, Protocol, runtime_checkable

import numpy as np

OPS = ("sum", "mean", "max", "min")


def _check_op(op: str, arr: np.ndarray | None = None) -> str:
    if op not in OPS:
        raise ValueError(f"op must be one of {OPS}, got {op!r}")
    if op == "mean" and arr is not None and not np.issubdtype(arr.dtype, np.inexact):
        raise TypeError(f"op='mean' needs a floating array, got dtype {arr.dtype}; "
                        "use op='sum' and divide yourself")
    return op


def _check_array(arr: np.ndarray, what: str) -> np.ndarray:
    if not isinstance(arr, np.ndarray):
        raise TypeError(f"{what} needs a NumPy array, got {type(arr).__name__}; "
                        "use the *_obj variant for Python objects")
    if not arr.flags.c_contiguous or not arr.flags.writeable:
        raise ValueError(f"{what} works in place on a C-contiguous writeable array; got "
                         f"shape {arr.shape} contiguous={arr.flags.c_contiguous} "
                         f"writeable={arr.flags.writeable}; pass np.ascontiguousarray(x)")
    return arr


def _divide_(arr: np.ndarray, n: int) -> np.ndarray:
    if n != 1:
        arr /= n
    return arr


@runtime_checkable
class Handle(Protocol):
    """A started non-blocking collective; ``wait()`` completes it and returns the array."""

    def wait(self) -> np.ndarray: ...


@runtime_checkable
class Communicator(Protocol):
    """What distnn needs from a group of processes (see ``MPIComm`` and ``LocalComm``)."""

    rank: int
    size: int
    local_rank: int
    local_size: int

    def allreduce_(self, arr: np.ndarray, op: str = "sum") -> np.ndarray: ...
    def iallreduce_(self, arr: np.ndarray, op: str = "sum") -> Handle: ...
    def bcast_(self, arr: np.ndarray, root: int = 0) -> np.ndarray: ...
    def allgather(self, arr: np.ndarray) -> np.ndarray: ...
    def bcast_obj(self, obj: Any, root: int = 0) -> Any: ...
    def allgather_obj(self, obj: Any) -> list: ...
    def allreduce_obj(self, obj: Any, op: str = "sum") -> Any: ...
    def barrier(self) -> None: ...
    def split(self, color: int, key: int = 0) -> "Communicator": ...
    def abort(self, code: int = 1) -> None: ...


class _DoneHandle:
    """Handle of a collective that finished when it was started (size 1)."""

    def __init__(self, arr: np.ndarray):
        self._arr = arr

    def wait(self) -> np.ndarray:
        return self._arr

    def test(self) -> bool:
        return True


class LocalComm:
    """A communicator of one process: every collective returns its input.

    Example:
        comm = LocalComm(); comm.allreduce_(g, "mean")  # g unchanged
    """

    rank = 0
    size = 1
    local_rank = 0
    local_size = 1
    core_sharers = 1

    def allreduce_(self, arr, op="sum"):
        _check_op(op, _check_array(arr, "allreduce_"))
        return arr

    def iallreduce_(self, arr, op="sum"):
        return _DoneHandle(self.allreduce_(arr, op))

    def bcast_(self, arr, root=0):
        self._check_root(root)
        return _check_array(arr, "bcast_")

    def allgather(self, arr):
        return np.asarray(arr)[None].copy()

    def bcast_obj(self, obj, root=0):
        self._check_root(root)
        return obj

    def allgather_obj(self, obj):
        return [obj]

    def allreduce_obj(self, obj, op="sum"):
        _check_op(op)
        return obj

    def barrier(self):
        pass

    def split(self, color, key=0):
        return LocalComm()

    def _p2p(self, what):
        raise RuntimeError(f"{what}: a communicator of size 1 has no other rank to talk to; "
                           "run the point-to-point rule under mpiexec -n 2 or more")

    def send_(self, arr, dest, tag=0):
        self._p2p("send_")

    def recv_(self, arr, source, tag=0):
        self._p2p("recv_")

    def isend_(self, arr, dest, tag=0):
        self._p2p("isend_")

    def irecv_(self, arr, source, tag=0):
        self._p2p("irecv_")

    def iprobe(self, source=-1, tag=-1):
        return None

    def ibarrier(self):
        return _DoneHandle(np.zeros(0))

    def abort(self, code=1):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

    def _check_root(self, root):
        if root != 0:
            raise ValueError(f"root must be 0 on a communicator of size 1, got {root}")

    # -- added for Horovod's collectives (alltoall, reducescatter, Adasum) ---------------
    def sendrecv_(self, send, dest, recv, source, tag=0):
        self._p2p("sendrecv_")

    def alltoallv_(self, send, send_counts, recv, recv_counts):
        """Exchange slices: ``send_counts[r]`` elements go to rank r (size 1: a copy)."""
        np.copyto(recv[:recv_counts[0]], send[:send_counts[0]])
        return recv

    def allgatherv(self, arr, counts):
        """Every rank's 1-D ``arr`` (``counts[r]`` elements from rank r), concatenated in
        rank order (size 1: a copy)."""
        return np.array(arr[:counts[0]], copy=True)

    def iallgatherv(self, arr, counts):
        return _DoneHandle(self.allgatherv(arr, counts))

    def reduce_scatter_(self, send, recv, counts, op="sum"):
        """Reduce ``send`` over ranks; this rank gets its ``counts[rank]`` elements."""
        _check_op(op, _check_array(recv, "reduce_scatter_"))
        np.copyto(recv, send[:counts[0]])
        return recv

    # -- sharded training state (distributed/sharded.py) -------------------------------
    def ireduce_scatter_(self, send, recv, counts, op="sum"):
        return _DoneHandle(self.reduce_scatter_(send, recv, counts, op))

    def allgatherv_(self, buf, counts):
        """In place: every rank's block of ``buf`` reaches every rank (size 1: nothing)."""
        return _check_array(buf, "allgatherv_")

    def __repr__(self):
        return "LocalComm()"
