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


def threads_per_rank(local_size: int = 1) -> int:
    """The loops' threads before a run sets them: ``DISTNN_NUM_THREADS`` or
    ``OMP_NUM_THREADS`` when set, else this process's cores divided by ``local_size`` (the
    processes known to share them; 1 unless the caller says)."""
    for var in ("DISTNN_NUM_THREADS", "OMP_NUM_THREADS"):
        value = os.environ.get(var, "").strip()
        if value.isdigit() and int(value) > 0:
            return int(value)
    return max(1, node_cores() // max(1, int(local_size)))
