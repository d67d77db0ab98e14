"""distnn: distributed training and inference of deep neural networks over MPI."""
import sys as _sys

from . import distributed
from .distributed import (DistributedOptimizer, broadcast_parameters, init, local_rank,
                          local_size, rank, size)

# The package was called ``distnn.dist`` before; the old name keeps working.
dist = distributed
_sys.modules[__name__ + ".dist"] = distributed

__version__ = "0.1.0"
__all__ = ["init", "rank", "size", "local_rank", "local_size", "broadcast_parameters",
           "DistributedOptimizer", "distributed", "__version__"]
