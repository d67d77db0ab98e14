"""Communicators: the one place distnn talks to MPI.

``MPIComm`` wraps an mpi4py communicator; ``LocalComm`` is the size-1 stand-in used when
mpi4py is not installed (every collective is then the identity). Both follow the
``Communicator`` protocol, which is all the rest of distnn sees. mpi4py is imported
lazily, on the first ``MPIComm`` or ``world()`` call, so ``import distnn`` never needs it.

Array collectives are in place on contiguous NumPy arrays (uppercase mpi4py methods with
``MPI.IN_PLACE``: no packing, no copies); the ``*_obj`` ones pickle small Python objects.
Every rank must call the same collectives in the same order.

The protocol and ``LocalComm`` are in ``comm_base``, ``MPIComm`` in ``mpi_comm``; this
module gathers them and holds the default communicator (``init``, ``get_comm``) and what
a rank learns of its node through it: threads per rank, decided in one place
(``threads_per_rank``). A rank knows its node through its communicator (the ranks of its
node whose cores overlap its own, ``core_sharers``, else ``local_size``) and its cores
through its CPU affinity (``os.sched_getaffinity``: what Slurm's cpusets, ``taskset`` and
the emulated cluster's hosts set), never through ``os.cpu_count()`` or the world size. The
run builder (``distnn.run``) applies the number to the kernels, BLAS and torch; ``init``
hands it to the kernels of a script's ranks; ``distnn info`` reports it.
"""
from __future__ import annotations

from ..kernels.node import environment_threads, node_cores
from .comm_base import OPS, Communicator, Handle, LocalComm
from .mpi_comm import MPIComm, _mpi

__all__ = ["OPS", "Communicator", "Handle", "LocalComm", "MPIComm", "mpi_available", "world",
           "init", "get_comm", "node_cores", "threads_per_rank", "default_threads"]


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
        kernels.set_num_threads(threads_per_rank(comm))


def get_comm() -> "Communicator":
    """The default communicator (``init()`` is called when none is set yet)."""
    return _default if _default is not None else init()


def threads_per_rank(comm: Communicator | None = None, asked: int = 0) -> int:
    """The threads a rank of ``comm`` (default: ``get_comm()``) runs: ``asked`` when > 0
    (``--threads``), else ``DISTNN_NUM_THREADS`` or ``OMP_NUM_THREADS`` when set, else its
    cores shared among the ranks of its node that share them (all of its node's ranks,
    unless the launcher pinned each rank to cores of its own). Never 0.

    Example:
        threads_per_rank(comm)  # 2 hosts x 1 rank on 8-core nodes -> 8 on each rank
    """
    if asked and int(asked) > 0:
        return int(asked)
    if environment_threads():
        return environment_threads()
    comm = comm if comm is not None else get_comm()
    sharers = max(1, int(getattr(comm, "core_sharers", 0) or comm.local_size or 1))
    return max(1, node_cores() // sharers)


# The name it had before it took ``asked`` (``--threads``) too.
default_threads = threads_per_rank
