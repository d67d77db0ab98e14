"""distnn: distributed training and inference of deep neural networks over MPI."""
from .dist import (DistributedOptimizer, broadcast_parameters, init, local_rank, local_size,
                   rank, size)

__version__ = "0.1.0"
__all__ = ["init", "rank", "size", "local_rank", "local_size", "broadcast_parameters",
           "DistributedOptimizer", "__version__"]
