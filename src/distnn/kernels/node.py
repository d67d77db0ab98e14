"""How many threads a rank should run: its node's cores shared among the node's ranks.

Read from the process itself (CPU affinity) and the launcher's environment, so it works
before MPI starts (the compiled loops' pool is sized at import) and on every kind of node:
a rank knows its node, never the machine's ``os.cpu_count()`` or the job's world size.
"""
from __future__ import annotations

import os
import re

# Ranks on this node as the launcher tells them before MPI starts: hydra (MPICH), Open MPI,
# PMIx, Slurm (SLURM_NTASKS_PER_NODE is set only with --ntasks-per-node; else srun's
# SLURM_STEP_TASKS_PER_NODE at SLURM_NODEID).
_LOCAL_SIZE_VARS = ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE", "PMIX_LOCAL_SIZE",
                    "SLURM_NTASKS_PER_NODE")


def node_cores() -> int:
    """Cores this process may run on: its CPU affinity (what Slurm's cpusets, ``taskset``
    and the emulated cluster's hosts set), not ``os.cpu_count()`` (all of the machine)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


def launcher_local_size() -> int:
    """Ranks the launcher put on this node (1 when started without a launcher)."""
    for var in _LOCAL_SIZE_VARS:
        value = os.environ.get(var, "").strip()
        if value.isdigit() and int(value) > 0:
            return int(value)
    return _srun_tasks_on_this_node() or 1


def _srun_tasks_on_this_node() -> int | None:
    """Tasks srun started on this node: SLURM_STEP_TASKS_PER_NODE ('2(x3),1': 2 on each
    of the first three nodes, then 1) at this task's SLURM_NODEID."""
    spec = os.environ.get("SLURM_STEP_TASKS_PER_NODE", "").strip()
    node = os.environ.get("SLURM_NODEID", "").strip()
    if not spec or not node.isdigit():
        return None
    counts: list[int] = []
    for part in spec.split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not m:
            return None
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    i = int(node)
    return counts[i] if i < len(counts) and counts[i] > 0 else None


def threads_per_rank(local_size: int | None = None) -> int:
    """Threads a rank should use by default: ``OMP_NUM_THREADS`` (or
    ``DISTNN_NUM_THREADS``) when set, else this process's cores shared among the ranks on
    its node (``local_size``: ``comm.local_size``; None reads the launcher's variables).

    Example:
        threads_per_rank(comm.local_size)  # 2 hosts x 1 rank on 8-core nodes -> 8
    """
    for var in ("DISTNN_NUM_THREADS", "OMP_NUM_THREADS"):
        value = os.environ.get(var, "").strip()
        if value.isdigit() and int(value) > 0:
            return int(value)
    ranks = launcher_local_size() if local_size is None else max(1, int(local_size))
    cores = node_cores()
    return max(1, cores // ranks) if cores > 1 else 1
