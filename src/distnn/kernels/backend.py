"""Which implementation runs the kernels' element-wise loops: "numpy" or "numba".

NumPy is the reference and the fallback; "numba" runs compiled, multi-threaded loops for
the memory-bound parts (im2col/col2im, padding and layout copies, pooling, batch norm,
activations) and leaves the GEMMs to NumPy's BLAS. Results are the same to float rounding
of reductions. The default is "numba" when it imports, else "numpy"; the environment
variable ``DISTNN_KERNELS=numpy|numba`` or ``set_backend()`` choose explicitly.
"""
from __future__ import annotations

import os
import re

_BACKENDS = ("numpy", "numba")
_state = {"name": None, "module": None}


def _load_numba():
    from . import _numba  # noqa: F401  (compiles lazily, per kernel, from the disk cache)
    return _numba


def set_backend(name: str | None) -> str:
    """Select the kernel backend ("numpy", "numba", or None for the default); returns the
    backend in effect. Asking for "numba" when numba cannot be imported raises."""
    if name is None:
        name = os.environ.get("DISTNN_KERNELS", "").strip().lower() or None
    if name is not None and name not in _BACKENDS:
        raise ValueError(f"kernel backend must be one of {_BACKENDS}, got {name!r} "
                         "(from set_backend() or DISTNN_KERNELS)")
    module = None
    if name in (None, "numba"):
        try:
            module = _load_numba()
        except ImportError as exc:
            if name == "numba":
                raise ImportError(f"kernel backend 'numba' needs numba installed ({exc}); "
                                  "pip install numba or use DISTNN_KERNELS=numpy") from exc
    _state["name"] = "numba" if module is not None else "numpy"
    _state["module"] = module
    return _state["name"]


def backend() -> str:
    """The kernel backend in effect ("numpy" or "numba")."""
    if _state["name"] is None:
        set_backend(None)
    return _state["name"]


def compiled():
    """The compiled-kernel module, or None when the NumPy path is selected."""
    if _state["name"] is None:
        set_backend(None)
    return _state["module"]


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


def set_num_threads(n: int) -> None:
    """Threads of the compiled loops (default: ``threads_per_rank()``); BLAS threads are
    set separately (threadpoolctl)."""
    fast = compiled()
    if fast is not None:
        fast.set_num_threads(n)


def get_num_threads() -> int:
    """Threads of the compiled loops (1 on the NumPy backend)."""
    fast = compiled()
    return fast.get_num_threads() if fast is not None else 1
