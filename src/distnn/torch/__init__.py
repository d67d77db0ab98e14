"""PyTorch modules on distnn's distributed API (Horovod's PyTorch API, name for name), and
in distnn's trainer.

Horovod scripts port by changing the import (docs/horovod.md, "Coming from Horovod", lists every
name: collectives with name/op/pre- and postscale, async handles, grouped forms, alltoall,
reducescatter, process sets, join, Compression, Adasum)::

    import distnn
    import distnn.torch as hvd
    hvd.init()
    # threads per rank as distnn train decides them: this node's cores shared among its ranks
    torch.set_num_threads(distnn.distributed.threads_per_rank())
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

from ..distributed import Communicator, get_comm, local_rank, local_size, rank, size
from .basics import (Adasum, Average, Max, Min, Product, ProcessSet, Sum, add_process_set,
                     barrier, ccl_built, cross_rank, cross_size, cuda_built, ddl_built,
                     gloo_built, gloo_enabled, global_process_set, init, is_homogeneous,
                     is_initialized, join, mpi_built, mpi_enabled, mpi_threads_supported,
                     nccl_built, remove_process_set, rocm_built, shutdown, start_timeline,
                     stop_timeline)
from .batchnorm import SyncBatchNorm, convert_sync_batchnorm
from .collectives import (Handle, allreduce, allreduce_, allreduce_async, allreduce_async_,
                          grouped_allreduce, grouped_allreduce_, grouped_allreduce_async,
                          grouped_allreduce_async_, poll, sparse_allreduce_async, synchronize)
from .compression import Compression
from .sampler import DistributedSampler, Shard, partition_dataset, shard_indices
from .exchange import (allgather, allgather_async, alltoall, alltoall_async, broadcast,
                       broadcast_, broadcast_async, broadcast_async_, grouped_allgather,
                       grouped_allgather_async, grouped_reducescatter,
                       grouped_reducescatter_async, reducescatter, reducescatter_async)
from .functions import (allgather_object, broadcast_object, broadcast_optimizer_state,
                        broadcast_parameters, metric_average)
from .launch import run
from .model import TorchModel, TorchUnit
from .distributed_optimizer import DistributedOptimizer
from .process_group import init_process_group
from .zero import ZeroRedundancyOptimizer
from . import ddp, elastic, opt
from .elastic import HorovodInternalError, HostsUpdatedInterrupt
from .opt import DistOpt


__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
    "cross_rank", "cross_size", "is_homogeneous", "get_comm", "Communicator",
    "mpi_built", "mpi_enabled", "mpi_threads_supported", "gloo_built", "gloo_enabled",
    "nccl_built", "ddl_built", "ccl_built", "cuda_built", "rocm_built", "start_timeline",
    "stop_timeline", "Average", "Sum", "Adasum", "Max", "Min", "Product", "ProcessSet",
    "global_process_set", "add_process_set", "remove_process_set", "join", "barrier",
    "Handle", "poll", "synchronize", "allreduce", "allreduce_", "allreduce_async",
    "allreduce_async_", "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async",
    "grouped_allreduce_async_", "sparse_allreduce_async", "allgather", "allgather_async",
    "grouped_allgather", "grouped_allgather_async", "broadcast", "broadcast_",
    "broadcast_async", "broadcast_async_", "alltoall", "alltoall_async", "reducescatter",
    "reducescatter_async", "grouped_reducescatter", "grouped_reducescatter_async",
    "broadcast_object", "allgather_object", "broadcast_parameters",
    "broadcast_optimizer_state", "metric_average", "Compression", "DistributedOptimizer",
    "HorovodInternalError", "HostsUpdatedInterrupt", "elastic", "SyncBatchNorm",
    "convert_sync_batchnorm", "partition_dataset",
    "shard_indices", "DistributedSampler", "Shard", "TorchModel", "TorchUnit",
    "DistOpt", "ddp", "opt", "run", "ZeroRedundancyOptimizer",
    "init_process_group",
]
