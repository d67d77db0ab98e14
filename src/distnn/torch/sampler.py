"""Sharding a dataset over the ranks the way distnn's trainer does.

Each epoch draws one permutation from the seed (the same on every rank), cuts it into
global batches, and rank r keeps ``np.array_split(global_batch, size)[r]``; every rank gets
the same number of batches, the last rank(s) possibly an empty share of the last one. With
the loss summed over the local samples and divided by the *global* batch size, and
``DistributedOptimizer(op="sum")``, N ranks then make exactly the updates of one process.

Needle's shape (``distnn.torch.ddp``): ``needle_partition`` returns a ``Loader`` of equal
per-rank batches and the per-rank batch size.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np
import torch

from .. import distributed as dist
from ..data import ArrayDataset
from ..data import Dataset as DistnnDataset
from ..data import local_range
from ..distributed import Communicator


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
        if epoch or drop_last:
            raise ValueError("partition_dataset(..., device=/dtype=) returns Needle's "
                             "(loader, batch size), which takes no epoch/drop_last: iterate "
                             "the loader once per epoch")
        return needle_partition(data, global_batch_size, device, dtype, shuffle=shuffle,
                                seed=seed, comm=comm)
    return _shards(data, global_batch_size, shuffle, seed, epoch, drop_last, comm)


def _length(data, what: str) -> int:
    """Samples in a TensorDataset, a tuple/list of equally long arrays or tensors, or any
    sized dataset."""
    if isinstance(data, torch.utils.data.TensorDataset):
        return len(data.tensors[0])
    if isinstance(data, (tuple, list)):
        lengths = {len(t) for t in data}
        if len(lengths) != 1:
            raise ValueError(f"partition_dataset: the {what} have lengths {sorted(lengths)}; "
                             "they must have the same first dimension")
        return lengths.pop()
    return len(data)


def _shards(data, global_batch_size, shuffle, seed, epoch, drop_last, comm) -> Iterator[Shard]:
    c = comm if comm is not None else dist.get_comm()
    n = _length(data, "tensors")
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


_DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
           "bfloat16": torch.bfloat16}


def _device(device) -> torch.device:
    dev = torch.device("cpu") if device is None else torch.device(device)
    if dev.type != "cpu":
        raise ValueError(f"partition_dataset: device={device!r}: distnn.torch trains on the CPU "
                         "(no GPU backend); pass the device ddp.init() returned, or 'cpu'")
    return dev


def _dtype(dtype) -> torch.dtype | None:
    if dtype is None or (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        return dtype
    key = dtype if isinstance(dtype, str) else (
        str(dtype).removeprefix("torch.") if isinstance(dtype, torch.dtype)
        else np.dtype(dtype).name)
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

    def _items(self, idx: np.ndarray) -> tuple:
        d = self.data
        if isinstance(d, ArrayDataset):  # stored values (uint8) scaled per batch, as distnn's
            x = d.preprocess.standardize_(d.preprocess.scale(d.x[idx], d.value_range))
            return x, d.preprocess.labels(d.y[idx], d.num_classes)
        return _take(d, idx)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        order = (np.random.default_rng([self.seed, self.epoch]).permutation(self.n)
                 if self.shuffle else np.arange(self.n))[:self.used]
        self.epoch += 1
        for idx, _ in shard_indices(self.used, self.global_batch_size, rank=self.comm.rank,
                                    size=self.comm.size, shuffle=False):
            yield tuple(self._tensor(t) for t in self._items(order[idx]))

    def __repr__(self) -> str:
        return (f"Loader({self.n} samples, batch_size={self.batch_size} per rank, "
                f"{len(self)} batches)")


def needle_partition(dataset: Any, batch_size: int, device=None, dtype=None, *,
                     shuffle: bool = True, seed: int = 0,
                     comm: Communicator | None = None) -> tuple[Loader, int]:
    """Needle's ``ddp.partition_dataset`` (``distnn.torch.ddp``): this rank's loader and its
    batch size.

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
    if isinstance(dataset, DistnnDataset) and not isinstance(dataset, ArrayDataset):
        dataset = dataset.arrays()
    n = _length(dataset, "arrays")
    if n < c.size:
        raise ValueError(f"partition_dataset: {n} samples cannot be shared by {c.size} ranks")
    bsz = int(batch_size) // c.size
    loader = Loader(dataset, n, bsz, c, _device(device), _dtype(dtype), bool(shuffle),
                    int(seed))
    return loader, bsz
