"""PyTorch modules on distnn's distributed API (Horovod's names), and in distnn's trainer.

Horovod scripts port by changing the import::

    import distnn.torch as hvd
    hvd.init()
    torch.set_num_threads(1)                          # one thread per rank on a shared host
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size(), momentum=0.9)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)   # never steps the optimizer
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    for x, y in loader:
        opt.zero_grad(); loss_fn(model(x), y).backward(); opt.step()

Exact uneven batches (distnn's rule): shard each global batch with ``partition_dataset``,
divide the SUMMED loss by the global batch size, and pass ``op="sum"``::

    opt = hvd.DistributedOptimizer(opt, model.named_parameters(), op="sum")
    for x, y, n in hvd.partition_dataset((xs, ys), 128, epoch=epoch):
        opt.zero_grad(); (F.cross_entropy(model(x), y, reduction="sum") / n).backward()
        opt.step()

To train a module with distnn's ``Trainer``, training rules, optimizers and checkpoints,
wrap it: ``TorchModel(module, input_shape)`` (what ``distnn train --model file.py`` does).

Communication goes through ``distnn.distributed`` (mpi4py, in-place on NumPy views of the
tensors); the tensors must be on the CPU. ``import distnn`` never imports this package
or torch.
"""
from __future__ import annotations

from ..distributed import Communicator, get_comm, init
from .batchnorm import SyncBatchNorm, convert_sync_batchnorm
from .collectives import (Average, Max, Min, Sum, allgather, allreduce, allreduce_, broadcast,
                          broadcast_, broadcast_object, broadcast_optimizer_state,
                          broadcast_parameters, metric_average)
from .data import DistributedSampler, Shard, partition_dataset, shard_indices
from .model import TorchModel, TorchUnit
from .optimizer import DistributedOptimizer

__all__ = [
    "init", "rank", "size", "local_rank", "local_size", "get_comm", "Communicator",
    "allreduce", "allreduce_", "allgather", "broadcast", "broadcast_", "broadcast_object",
    "broadcast_parameters", "broadcast_optimizer_state", "metric_average",
    "Average", "Sum", "Max", "Min", "DistributedOptimizer", "SyncBatchNorm",
    "convert_sync_batchnorm", "partition_dataset", "shard_indices", "DistributedSampler",
    "Shard", "TorchModel", "TorchUnit",
]


def rank(comm: Communicator | None = None) -> int:
    return (comm or get_comm()).rank


def size(comm: Communicator | None = None) -> int:
    return (comm or get_comm()).size


def local_rank(comm: Communicator | None = None) -> int:
    return (comm or get_comm()).local_rank


def local_size(comm: Communicator | None = None) -> int:
    return (comm or get_comm()).local_size
