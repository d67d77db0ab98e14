"""Needle's ``apps/ddp`` names over distnn.torch, in Needle's shapes: ``init()`` returns
``(rank, device)`` and ``partition_dataset`` returns ``(loader, per-rank batch size)``.

A Needle data-parallel script ports by changing the imports and the model/loss to torch
(docs/horovod.md, "Coming from Needle")::

    from distnn.torch import ddp                       # was: import ddp (apps/ddp.py)
    rank, device = ddp.init()
    loader, bsz = ddp.partition_dataset(dataset, 128, device=device, dtype="float32")
    model = ResNet9()                                  # a torch.nn.Module
    ddp.broadcast_parameters(model)
    opt = ddp.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.001))
    for X, y in loader:                                # one epoch per pass
        opt.reset_grad()
        loss = loss_fn(model(X), y)
        loss.backward()
        opt.step()

``batch_size`` is the global batch, as in Needle: each rank gets ``batch_size // size``
samples per step, every rank the same number of steps and samples (the last
``len(dataset) % size`` samples of each epoch's permutation are left out, as Needle's
equal partitions leave them out), so the averaged gradients of N ranks are exactly those
of one process over the same global batch. ``distnn.torch.init()`` keeps Horovod's shape
(it returns the communicator); ``distnn.torch.partition_dataset`` takes Needle's shape
when ``device=`` or ``dtype=`` is given.
"""
from __future__ import annotations

from typing import Any

import torch

from ..distributed import Communicator
from .basics import init as _hvd_init
from .sampler import Loader, needle_partition
from .functions import broadcast_parameters as _broadcast_parameters
from .distributed_optimizer import DistributedOptimizer

def init(comm: Communicator | None = None) -> tuple[int, torch.device]:
    """Start distnn's MPI communicator; returns ``(rank, device)`` as Needle's ``ddp.init``
    does (the device is the CPU: distnn reduces CPU tensors)."""
    c = _hvd_init(comm)
    return c.rank, torch.device("cpu")


def partition_dataset(dataset: Any, batch_size: int, device=None, dtype=None, *,
                      shuffle: bool = True, seed: int = 0,
                      comm: Communicator | None = None) -> tuple[Loader, int]:
    """Needle's ``ddp.partition_dataset``: ``(loader, batch_size // size)``; see
    ``distnn.torch.sampler.needle_partition`` for the arguments."""
    return needle_partition(dataset, batch_size, device, dtype, shuffle=shuffle, seed=seed,
                            comm=comm)


def broadcast_parameters(model: torch.nn.Module, root_rank: int = 0) -> None:
    """Root's parameters and buffers into ``model`` on every rank (Needle's call)."""
    _broadcast_parameters(model, root_rank=root_rank)


__all__ = ["init", "partition_dataset", "broadcast_parameters", "DistributedOptimizer",
           "Loader"]
