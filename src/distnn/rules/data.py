"""``data``: synchronous data parallelism (BSP), the default rule.

Every step all-reduces the gradients (bucketed, overlapped with backward, through
``distnn.distributed.DistributedOptimizer``) and every rank applies the same update, so N
ranks with batch B make exactly the update of one process with batch N·B.
"""
from __future__ import annotations

from .. import distributed as dist
from .base import Rule


class DataParallel(Rule):
    """Synchronous all-reduce of gradients (Horovod/DDP; Theano-MPI's BSP).

    Args:
        bucket_size_mb: gradient bucket size of the all-reduce (MiB).
        non_blocking: start each bucket's all-reduce during backward (``Iallreduce``).
        compression: None (or "none") or "fp16".

    Example:
        Trainer(model, SGD(model, lr=0.01, momentum=0.9), rule=DataParallel())
    """

    name = "data"
    lockstep = True
    options = {"non_blocking": "non_blocking_mpi", "compression": "gradient_compression"}

    def __init__(self, *, bucket_size_mb: float = 4.0, non_blocking: bool = True,
                 compression: str | None = None):
        self.bucket_size_mb = bucket_size_mb
        self.non_blocking = non_blocking
        self.compression = None if compression == "none" else compression

    def bind(self, trainer, optimizer):
        if not isinstance(optimizer, dist.DistributedOptimizer):
            # op="sum": the trainer's loss is already divided by the *global* batch size.
            optimizer = dist.DistributedOptimizer(
                optimizer, trainer.model, comm=trainer.comm, op="sum",
                bucket_size_mb=self.bucket_size_mb, non_blocking=self.non_blocking,
                compression=self.compression)
        self._optimizer = optimizer
        return optimizer

    def begin(self, trainer) -> None:
        dist.broadcast_parameters(trainer.model, comm=trainer.comm)

    def stats(self) -> dict[str, float]:
        opt = getattr(self, "_optimizer", None)
        if opt is None:
            return {}
        return {"messages": float(opt.allreduce_calls), "bytes": float(opt.bytes_reduced),
                "wait_s": float(opt.comm_wait_time)}

    def __repr__(self) -> str:
        return (f"DataParallel(bucket_size_mb={self.bucket_size_mb}, "
                f"non_blocking={self.non_blocking}, compression={self.compression!r})")
