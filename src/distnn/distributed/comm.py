"""Communicators: the one place distnn talks to MPI.

``MPIComm`` wraps an mpi4py communicator; ``LocalComm`` is the size-1 stand-in used when
mpi4py is not installed (every collective is then the identity). Both follow the
``Communicator`` protocol, which is all the rest of distnn sees. mpi4py is imported
lazily, on the first ``MPIComm`` or ``world()`` call, so ``import distnn`` never needs it.

Array collectives are in place on contiguous NumPy arrays (uppercase mpi4py methods with
``MPI.IN_PLACE``: no packing, no copies); the ``*_obj`` ones pickle small Python objects.
Every rank must call the same collectives in the same order.

The protocol and ``LocalComm`` are in ``comm_base``, ``MPIComm`` in ``mpi_comm``; this
module gathers them and holds the default communicator (``init``, ``get_comm``).
"""
from __future__ import annotations

from .comm_base import OPS, Communicator, Handle, LocalComm
from .mpi_comm import MPIComm, _mpi

__all__ = ["OPS", "Communicator", "Handle", "LocalComm", "MPIComm", "mpi_available", "world",
           "init", "get_comm"]


def mpi_available() -> bool:
    """True when mpi4py (and an MPI library for it) can be imported."""
    try:
        _mpi()
    except (ImportError, RuntimeError, OSError):
        return False
    return True


def world() -> "MPIComm | LocalComm":
    """COMM_WORLD as a Communicator: ``MPIComm`` when mpi4py works (size 1 when started
    without mpiexec: MPI singleton), else ``LocalComm``."""
    return MPIComm() if mpi_available() else LocalComm()


_default: "Communicator | None" = None


def init(comm: "Communicator | None" = None) -> "Communicator":
    """Set (or create, on the first call) the default communicator and return it.

    Idempotent: later calls without ``comm`` return the same one. With no argument it is
    ``world()``: COMM_WORLD under mpiexec, size 1 otherwise.
    """
    global _default
    if comm is not None:
        _default = comm
    elif _default is None:
        _default = world()
        _share_the_node(_default)
    return _default


def _share_the_node(comm: "Communicator") -> None:
    """The ranks of a node share its cores from the start, in a script that never builds a
    run too (as torchrun sets OMP_NUM_THREADS=1 for its workers): the compiled kernels get
    ``threads_per_rank(comm)``; the run builder applies ``--threads`` over it."""
    if comm.size > 1:
        from .. import kernels
        from .threads import threads_per_rank
        kernels.set_num_threads(threads_per_rank(comm))


def get_comm() -> "Communicator":
    """The default communicator (``init()`` is called when none is set yet)."""
    return _default if _default is not None else init()
