"""Threads per rank, decided in one place: ``threads_per_rank``.

A rank knows its node through its communicator (the ranks of its node whose cores overlap
its own, ``core_sharers``, else ``local_size``) and its cores through its CPU affinity
(``os.sched_getaffinity``: what Slurm's cpusets, ``taskset`` and the emulated cluster's
hosts set), never through the machine's ``os.cpu_count()`` or the job's world size. The
run builder (``distnn.run``) applies the number to the compiled kernels, BLAS and torch;
``distnn info`` reports it.
"""
from __future__ import annotations

import os

from .comm import Communicator, get_comm

# The user's choice when no --threads is given (OpenMP's own variable, or distnn's).
THREADS_VARIABLES = ("DISTNN_NUM_THREADS", "OMP_NUM_THREADS")


def node_cores() -> int:
    """Cores this process may run on: its CPU affinity, not ``os.cpu_count()``."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


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
    for var in THREADS_VARIABLES:
        value = os.environ.get(var, "").strip()
        if value.isdigit() and int(value) > 0:
            return int(value)
    comm = comm if comm is not None else get_comm()
    sharers = max(1, int(getattr(comm, "core_sharers", 0) or comm.local_size or 1))
    return max(1, node_cores() // sharers)


# The name it had before it took ``asked`` (``--threads``) too.
default_threads = threads_per_rank
