"""Distributed training over MPI with a Horovod-like API.

    import distnn.dist as dist
    comm = dist.init()                     # COMM_WORLD under mpiexec, size 1 otherwise
    dist.broadcast_parameters(model)       # initial weights from rank 0
    opt = dist.DistributedOptimizer(SGD(model, lr=dist.scale_lr(0.01, dist.size())), model)
    ...; model.backward(dlogits); opt.step()

Every function takes the default communicator made by ``init()`` unless given ``comm=``.
Array functions with a trailing ``_`` work in place; ``*_async`` ones return a handle whose
``wait()`` returns the result. How gradients are combined is documented in one place:
``DistributedOptimizer``.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .comm import Communicator, Handle, LocalComm, MPIComm, get_comm, init, mpi_available, world
from .optimizer import DistributedOptimizer, make_buckets
from .sharded import ShardedOptimizer
from .sliced import ParameterSlice, build_sliced
from .adasum import adasum_
from .autotune import BucketTuner
from .join import JoinableComm
from .lossy import PowerSGD, Threshold, TopK
from .reducer import Compression, Reducer
from .replicas import (broadcast_optimizer_state, broadcast_parameters, metrics_allreduce,
                       scale_lr, sync_batchnorm)
from .runtime import abort_on_error, describe, install_abort_handler
from .comm import default_threads, node_cores, threads_per_rank

__all__ = [
    "Communicator", "Handle", "MPIComm", "LocalComm", "init", "get_comm", "world",
    "mpi_available", "threads_per_rank", "default_threads", "node_cores", "rank", "size",
    "local_rank", "local_size",
    "allreduce", "allreduce_",
    "allreduce_async", "allreduce_async_", "broadcast", "broadcast_", "allgather", "barrier",
    "broadcast_parameters", "broadcast_optimizer_state", "DistributedOptimizer",
    "ShardedOptimizer", "ParameterSlice", "build_sliced",
    "make_buckets", "sync_batchnorm", "metrics_allreduce", "scale_lr", "abort_on_error",
    "install_abort_handler", "describe", "Compression", "Reducer", "JoinableComm", "adasum_",
    "TopK", "Threshold", "PowerSGD", "BucketTuner",
]


def _c(comm: Communicator | None) -> Communicator:
    return comm if comm is not None else get_comm()


def rank(comm: Communicator | None = None) -> int:
    return _c(comm).rank


def size(comm: Communicator | None = None) -> int:
    return _c(comm).size


def local_rank(comm: Communicator | None = None) -> int:
    return _c(comm).local_rank


def local_size(comm: Communicator | None = None) -> int:
    return _c(comm).local_size


def _fresh(x, op: str = "sum") -> np.ndarray:
    a = np.array(x, order="C", copy=True)
    return a.astype(np.float64) if op == "mean" and a.dtype.kind in "iub" else a


def allreduce(x: Any, op: str = "mean", comm: Communicator | None = None):
    """Reduction of x over ranks, as a new array (a Python number for a number input).
    op: "mean" (default), "sum", "max" or "min"."""
    out = _c(comm).allreduce_(_fresh(x, op), op)
    return out.item() if np.ndim(x) == 0 and not isinstance(x, np.ndarray) else out


def allreduce_(x: np.ndarray, op: str = "mean", comm: Communicator | None = None) -> np.ndarray:
    """In-place reduction of a contiguous array over ranks; returns x."""
    return _c(comm).allreduce_(x, op)


def allreduce_async_(x: np.ndarray, op: str = "mean",
                     comm: Communicator | None = None) -> Handle:
    """Start an in-place reduction of x; ``handle.wait()`` completes it and returns x."""
    return _c(comm).iallreduce_(x, op)


def allreduce_async(x: Any, op: str = "mean", comm: Communicator | None = None) -> Handle:
    """Start a reduction of a copy of x; ``handle.wait()`` returns the new array."""
    return _c(comm).iallreduce_(_fresh(x, op), op)


def broadcast(x: Any, root: int = 0, comm: Communicator | None = None) -> np.ndarray:
    """Root's x on every rank, as a new array (every rank passes an array of the same
    shape and dtype)."""
    return _c(comm).bcast_(_fresh(x), root)


def broadcast_(x: np.ndarray, root: int = 0, comm: Communicator | None = None) -> np.ndarray:
    """Overwrite x in place with root's x; returns x."""
    return _c(comm).bcast_(x, root)


def allgather(x: Any, comm: Communicator | None = None) -> np.ndarray:
    """Every rank's x stacked along a new first axis: shape (size, *x.shape)."""
    return _c(comm).allgather(np.ascontiguousarray(x))


def barrier(comm: Communicator | None = None) -> None:
    _c(comm).barrier()
