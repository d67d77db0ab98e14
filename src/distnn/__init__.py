"""distnn: distributed training and inference of deep neural networks over MPI."""
import os as _os
import sys as _sys

# Waiting threads sleep instead of spinning. On a node where BLAS (OpenBLAS) and the compiled
# kernels (numba over OpenMP) take turns on the same cores, a pool that spins after its work
# steals the core the other pool needs next: resnet20 at 2 threads took 576 ms per step with
# spinning pools and 344 ms without (benchmarks/RESULTS.md). Both are read when the library
# loads, so they apply when distnn is imported before numpy (the command always does);
# values set in the environment win.
_os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from . import distributed
from .distributed import (DistributedOptimizer, broadcast_parameters, init, local_rank,
                          local_size, rank, size)

# The package was called ``distnn.dist`` before; the old name keeps working.
dist = distributed
_sys.modules[__name__ + ".dist"] = distributed

__version__ = "0.1.0"
__all__ = ["init", "rank", "size", "local_rank", "local_size", "broadcast_parameters",
           "DistributedOptimizer", "distributed", "__version__"]
