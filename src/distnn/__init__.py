"""distnn: distributed training and inference of deep neural networks over MPI."""
import os as _os
import sys as _sys

# OpenBLAS's threads sleep soon after their work instead of spinning: on a node where BLAS
# and the compiled kernels (numba over OpenMP, whose waiting threads distnn.kernels makes
# passive) take turns on the same cores, a pool that spins steals the core the other needs
# next: resnet20 at 2 threads took 542 ms per step with spinning pools and 379 ms without
# (docs/kernels.md). OpenBLAS reads it when it loads, so it applies when distnn is
# imported before numpy (the command always is); a value set in the environment wins.
_os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")

from . import distributed
from .distributed import (DistributedOptimizer, broadcast_parameters, init, local_rank,
                          local_size, rank, size)

# The package was called ``distnn.dist`` before; the old name keeps working.
dist = distributed
_sys.modules[__name__ + ".dist"] = distributed

__version__ = "0.1.0"
__all__ = ["init", "rank", "size", "local_rank", "local_size", "broadcast_parameters",
           "DistributedOptimizer", "distributed", "__version__"]
