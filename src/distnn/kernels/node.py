"""The compiled loops' thread count until a run sets it (``set_num_threads``).

Threads per rank are decided by ``distnn.distributed.threads_per_rank`` (from the
communicator: the ranks of this node) and handed here by the run builder; the kernels know
nothing of MPI or the launcher. Before that, the loops use what OpenMP itself would:
``OMP_NUM_THREADS`` (or ``DISTNN_NUM_THREADS``) when set, else this process's cores.
"""
from __future__ import annotations

import os


def node_cores() -> int:
    """Cores this process may run on: its CPU affinity (what Slurm's cpusets, ``taskset``
    and the emulated cluster's hosts set), not ``os.cpu_count()`` (all of the machine)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


# The user's choice of threads (OpenMP's own variable, or distnn's), the first one set.
THREADS_VARIABLES = ("DISTNN_NUM_THREADS", "OMP_NUM_THREADS")


def environment_threads() -> int | None:
    """The threads ``DISTNN_NUM_THREADS`` or ``OMP_NUM_THREADS`` ask for, None if neither
    holds a positive number."""
    for var in THREADS_VARIABLES:
        value = os.environ.get(var, "").strip()
        if value.isdigit() and int(value) > 0:
            return int(value)
    return None


def loop_threads(sharers: int = 1) -> int:
    """The loops' threads before a run sets them: ``environment_threads()`` when set, else
    this process's cores divided by ``sharers`` (the processes known to share them; 1
    unless the caller says). A run's own count is ``distnn.distributed.threads_per_rank``."""
    return environment_threads() or max(1, node_cores() // max(1, int(sharers)))
