"""Needle's ``apps/ddp`` names over distnn.torch, in Needle's shapes: ``init()`` returns
``(rank, device)`` and ``partition_dataset`` returns ``(loader, per-rank batch size)``.

A Needle data-parallel script ports by changing the imports and the model/loss to torch
(README, "Coming from Needle")::

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

from typing import Any, Iterator

import numpy as np
import torch

from .. import distributed as dist
from ..data import Dataset as DistnnDataset
from ..distributed import Communicator
from .basics import init as _hvd_init
from .data import _take, shard_indices
from .functions import broadcast_parameters as _broadcast_parameters
from .optimizer import DistributedOptimizer

_DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
           "bfloat16": torch.bfloat16}


def init(comm: Communicator | None = None) -> tuple[int, torch.device]:
    """Start distnn's MPI communicator; returns ``(rank, device)`` as Needle's ``ddp.init``
    does (the device is the CPU: distnn reduces CPU tensors)."""
    c = _hvd_init(comm)
    return c.rank, torch.device("cpu")


def _device(device) -> torch.device:
    dev = torch.device("cpu") if device is None else torch.device(device)
    if dev.type != "cpu":
        raise ValueError(f"partition_dataset: device={device!r}: distnn.torch trains on the CPU "
                         "(no GPU backend); pass the device ddp.init() returned, or 'cpu'")
    return dev


def _dtype(dtype) -> torch.dtype | None:
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    key = np.dtype(dtype).name if not isinstance(dtype, str) else dtype
    if key not in _DTYPES:
        raise ValueError(f"partition_dataset: dtype={dtype!r} is not a floating dtype; use "
                         f"one of {sorted(_DTYPES)}")
    return _DTYPES[key]


class Loader:
    """This rank's batches of a dataset, one epoch per iteration (Needle's ``DataLoader``
    over its partition). Each pass draws a new permutation, the same on every rank.

    Attributes:
        batch_size: samples per rank and step (``global_batch_size // size``).
        global_batch_size: samples per step over all ranks.
        epoch: the number of passes started so far (``set_epoch`` sets it).
    """

    def __init__(self, data: Any, n: int, batch_size: int, comm: Communicator,
                 device: torch.device, dtype: torch.dtype | None, shuffle: bool, seed: int):
        self.data, self.n, self.comm = data, n, comm
        self.batch_size = batch_size
        self.global_batch_size = batch_size * comm.size
        self.device, self.dtype = device, dtype
        self.shuffle, self.seed = shuffle, seed
        self.epoch = 0
        self.used = (n // comm.size) * comm.size

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return -(-self.used // self.global_batch_size)

    def _tensor(self, t) -> torch.Tensor:
        t = t if isinstance(t, torch.Tensor) else torch.as_tensor(np.asarray(t))
        if self.dtype is not None and t.is_floating_point():
            t = t.to(self.dtype)
        return t.to(self.device)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        order = (np.random.default_rng([self.seed, self.epoch]).permutation(self.n)
                 if self.shuffle else np.arange(self.n))[:self.used]
        self.epoch += 1
        for idx, _ in shard_indices(self.used, self.global_batch_size, rank=self.comm.rank,
                                    size=self.comm.size, shuffle=False):
            yield tuple(self._tensor(t) for t in _take(self.data, order[idx]))

    def __repr__(self) -> str:
        return (f"Loader({self.n} samples, batch_size={self.batch_size} per rank, "
                f"{len(self)} batches)")


def partition_dataset(dataset: Any, batch_size: int, device=None, dtype=None, *,
                      shuffle: bool = True, seed: int = 0,
                      comm: Communicator | None = None) -> tuple[Loader, int]:
    """Needle's ``ddp.partition_dataset``: this rank's loader and its batch size.

    Args:
        dataset: a map-style dataset of ``(x, y)`` items (Needle's, torch's), a
            ``TensorDataset``, a tuple of arrays/tensors with one first dimension, or a
            distnn ``Dataset`` (e.g. ``load_dataset("cifar10").train``).
        batch_size: the GLOBAL batch size; each rank gets ``batch_size // size``.
        device: the device from ``init()`` (the CPU).
        dtype: floating dtype of the inputs ("float32", ``torch.float32``...); labels
            keep their integer dtype.
        shuffle, seed: a new permutation ``default_rng([seed, epoch])`` every pass.

    Returns:
        (loader, per-rank batch size); iterate the loader once per epoch.
    """
    c = comm if comm is not None else dist.get_comm()
    if isinstance(batch_size, bool) or int(batch_size) != batch_size \
            or batch_size < c.size:
        raise ValueError(f"partition_dataset: batch_size={batch_size!r} is the global batch "
                         f"size and must be an integer >= the number of ranks ({c.size})")
    if isinstance(dataset, DistnnDataset):
        dataset = dataset.arrays()
    if isinstance(dataset, torch.utils.data.TensorDataset):
        n = len(dataset.tensors[0])
    elif isinstance(dataset, (tuple, list)):
        lengths = {len(t) for t in dataset}
        if len(lengths) != 1:
            raise ValueError(f"partition_dataset: the arrays have lengths {sorted(lengths)}; "
                             "they must have the same first dimension")
        n = lengths.pop()
    else:
        n = len(dataset)
    if n < c.size:
        raise ValueError(f"partition_dataset: {n} samples cannot be shared by {c.size} ranks")
    bsz = int(batch_size) // c.size
    loader = Loader(dataset, n, bsz, c, _device(device), _dtype(dtype), bool(shuffle),
                    int(seed))
    return loader, bsz


def broadcast_parameters(model: torch.nn.Module, root_rank: int = 0) -> None:
    """Root's parameters and buffers into ``model`` on every rank (Needle's call)."""
    _broadcast_parameters(model, root_rank=root_rank)


__all__ = ["init", "partition_dataset", "broadcast_parameters", "DistributedOptimizer",
           "Loader"]
