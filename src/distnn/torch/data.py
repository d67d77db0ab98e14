"""Sharding a dataset over the ranks the way distnn's trainer does.

Each epoch draws one permutation from the seed (the same on every rank), cuts it into
global batches, and rank r keeps ``np.array_split(global_batch, size)[r]``; every rank gets
the same number of batches, the last rank(s) possibly an empty share of the last one. With
the loss summed over the local samples and divided by the *global* batch size, and
``DistributedOptimizer(op="sum")``, N ranks then make exactly the updates of one process.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np
import torch

from .. import distributed as dist
from ..data import local_range


@dataclass
class Shard:
    """This rank's share of one global batch.

    Attributes:
        tensors: this rank's samples of each dataset tensor (first dimension may be 0).
        global_size: samples in the global batch (the loss denominator).
        indices: dataset positions of this rank's samples.
    """

    tensors: tuple
    global_size: int
    indices: np.ndarray

    def __iter__(self):
        yield from self.tensors
        yield self.global_size


def shard_indices(n: int, global_batch_size: int, *, rank: int | None = None,
                  size: int | None = None, shuffle: bool = True, seed: int = 0,
                  epoch: int = 0, drop_last: bool = False) -> list[tuple[np.ndarray, int]]:
    """[(this rank's dataset indices, global batch size)] for every global batch of an
    epoch. The permutation depends on (seed, epoch) only, so all ranks agree."""
    if isinstance(global_batch_size, bool) or int(global_batch_size) != global_batch_size \
            or global_batch_size < 1:
        raise ValueError(f"global_batch_size must be an integer >= 1, got {global_batch_size!r}")
    rank = dist.rank() if rank is None else int(rank)
    size = dist.size() if size is None else int(size)
    if not 0 <= rank < size:
        raise ValueError(f"rank must be in [0, {size}), got {rank}")
    order = (np.random.default_rng([seed, epoch]).permutation(n) if shuffle
             else np.arange(n))
    full, rest = divmod(n, int(global_batch_size))
    sizes = [int(global_batch_size)] * full + ([rest] if rest and not drop_last else [])
    out, start = [], 0
    for g in sizes:
        lo, hi = local_range(g, rank, size)
        out.append((order[start + lo:start + hi], g))
        start += g
    return out


def _take(data: Any, idx: np.ndarray) -> tuple:
    if isinstance(data, torch.utils.data.TensorDataset):
        data = data.tensors
    if isinstance(data, (tuple, list)):
        index = torch.from_numpy(idx.astype(np.int64))
        return tuple(t[index] if isinstance(t, torch.Tensor) else np.asarray(t)[idx]
                     for t in data)
    if len(idx):
        items = [data[int(i)] for i in idx]
        batch = torch.utils.data.default_collate(items)
    else:  # an empty share: the shapes of one sample with 0 rows
        batch = torch.utils.data.default_collate([data[0]])
        batch = (tuple(b[:0] for b in batch) if isinstance(batch, (tuple, list))
                 else batch[:0])
    return tuple(batch) if isinstance(batch, (tuple, list)) else (batch,)


def partition_dataset(data: Any, global_batch_size: int, device=None, dtype=None, *,
                      shuffle: bool = True, seed: int = 0, epoch: int = 0,
                      drop_last: bool = False, comm=None):
    """This rank's share of every global batch of one epoch of ``data``.

    Needle's shape: with ``device`` or ``dtype`` given (``partition_dataset(dataset, 128,
    device=device, dtype="float32")``) it returns ``(loader, batch_size // size)`` as
    ``distnn.torch.ddp.partition_dataset`` does (see there).

    Args:
        data: a tuple/list of tensors (or arrays) with the same first dimension, a
            ``TensorDataset``, or any map-style dataset (items are collated with torch's
            ``default_collate``).
        global_batch_size: samples per global batch, all ranks together.
        shuffle, seed, epoch: the permutation is ``default_rng([seed, epoch])``'s.
        drop_last: skip a last global batch smaller than ``global_batch_size``.
        device, dtype: select Needle's shape (above).
        comm: communicator (default ``distnn.distributed.get_comm()``).

    Yields:
        ``Shard``s; unpack as ``x, y, global_size``.

    Example:
        for x, y, n in dtorch.partition_dataset((xs, ys), 128, epoch=epoch):
            loss = F.cross_entropy(model(x), y, reduction="sum") / n
    """
    if device is not None or dtype is not None:
        from .ddp import partition_dataset as needle_partition
        if epoch or drop_last:
            raise ValueError("partition_dataset(..., device=/dtype=) returns Needle's "
                             "(loader, batch size), which takes no epoch/drop_last: iterate "
                             "the loader once per epoch")
        return needle_partition(data, global_batch_size, device, dtype, shuffle=shuffle,
                                seed=seed, comm=comm)
    return _shards(data, global_batch_size, shuffle, seed, epoch, drop_last, comm)


def _shards(data, global_batch_size, shuffle, seed, epoch, drop_last, comm) -> Iterator[Shard]:
    c = comm if comm is not None else dist.get_comm()
    if isinstance(data, torch.utils.data.TensorDataset):
        n = len(data.tensors[0])
    elif isinstance(data, (tuple, list)):
        lengths = {len(t) for t in data}
        if len(lengths) != 1:
            raise ValueError(f"partition_dataset: the tensors have lengths {sorted(lengths)}; "
                             "they must have the same first dimension")
        n = lengths.pop()
    else:
        n = len(data)
    for idx, g in shard_indices(n, global_batch_size, rank=c.rank, size=c.size,
                                shuffle=shuffle, seed=seed, epoch=epoch, drop_last=drop_last):
        yield Shard(_take(data, idx), g, idx)


class DistributedSampler(torch.utils.data.Sampler):
    """Batch sampler for ``DataLoader(dataset, batch_sampler=...)``: this rank's indices of
    each global batch, as ``partition_dataset`` cuts them. ``global_sizes`` lists the global
    batch sizes of the epoch (the loss denominators). Call ``set_epoch(epoch)`` every epoch.

    A rank whose share of the last global batch is empty gets an empty list, which
    ``DataLoader``'s default collate cannot batch: use ``drop_last=True``, a global batch
    size that divides the dataset, or ``partition_dataset``.

    Example:
        sampler = DistributedSampler(len(ds), 128)
        loader = DataLoader(ds, batch_sampler=sampler)
    """

    def __init__(self, num_samples: int, global_batch_size: int, *, shuffle: bool = True,
                 seed: int = 0, drop_last: bool = False, rank: int | None = None,
                 size: int | None = None):
        self.num_samples = int(num_samples)
        self.global_batch_size = global_batch_size
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self.rank = dist.rank() if rank is None else rank
        self.size = dist.size() if size is None else size
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def _plan(self) -> list[tuple[np.ndarray, int]]:
        return shard_indices(self.num_samples, self.global_batch_size, rank=self.rank,
                             size=self.size, shuffle=self.shuffle, seed=self.seed,
                             epoch=self.epoch, drop_last=self.drop_last)

    @property
    def global_sizes(self) -> Sequence[int]:
        return [g for _, g in self._plan()]

    def __iter__(self):
        for idx, _ in self._plan():
            yield idx.tolist()

    def __len__(self) -> int:
        return len(self._plan())
