"""A dataset of which each rank holds only its own part (NNLO's split of the HDF5 files
among the workers), so that the whole set never has to fit in one process.

A reader builds ``PartDataset`` from this rank's rows before the sizes of the other parts
are known; the caller that has the communicator then all-gathers ``part_info()`` and calls
``set_parts`` (``distnn.run.load_data`` does). Nothing here communicates.

Batches: in step k of an epoch rank r contributes the next ``min(s_r, left_r)`` samples of
its part, ``s_r`` being its ``np.array_split`` share of the global batch, so every sample is
used once per epoch. Every rank computes the global size of each step from the part sizes,
and iterates the same number of steps (``num_batches``), ranks whose part is used up
contributing empty batches.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from .base import ArrayDataset, Dataset, Preprocess, local_range


class PartDataset(Dataset):
    """This rank's part of a dataset spread over ``size`` ranks.

    Args:
        x, y: this rank's samples and integer labels.
        num_classes: the number of classes, or None until ``set_parts`` gives it.
        rank, size: this rank and the number of ranks the data is spread over.
        value_range, preprocess: as for ``ArrayDataset``.

    Example:
        part = PartDataset(x_mine, y_mine, None, rank=comm.rank, size=comm.size)
        infos = comm.allgather_obj(part.part_info())
        part.set_parts([n for n, _ in infos], max(top for _, top in infos))
    """

    def __init__(self, x: np.ndarray, y: np.ndarray, num_classes: int | None, *, rank: int,
                 size: int, value_range: float | None = None,
                 preprocess: Preprocess | None = None):
        y = np.asarray(y)
        if len(y) and y.min() < 0:
            raise ValueError(f"labels must be >= 0, got {int(y.min())}")
        self.fixed_classes = num_classes is not None
        top = int(y.max()) + 1 if len(y) else 0
        self.local = ArrayDataset(x, y, num_classes if num_classes is not None else top,
                                  value_range=value_range, preprocess=preprocess)
        super().__init__(self.local.input_shape, self.local.num_classes,
                         value_range=self.local.value_range, preprocess=preprocess)
        if not 0 <= rank < size:
            raise ValueError(f"rank must be in [0, {size}), got {rank}")
        self.rank, self.size = int(rank), int(size)
        self.part_sizes: list[int] | None = None

    # -- completing the dataset --------------------------------------------------------
    def local_len(self) -> int:
        return len(self.local)

    def part_info(self) -> tuple[int, int]:
        """(samples in this part, 1 + largest label here) for the all-gather."""
        y = self.local.y
        return len(y), int(y.max()) + 1 if len(y) else 0

    def set_part_sizes(self, sizes: Sequence[int]) -> None:
        """Complete the dataset from the sizes of all parts (rank order)."""
        self.set_parts(sizes, None)

    def set_parts(self, sizes: Sequence[int], num_classes: int | None) -> None:
        """Complete the dataset: the sizes of all parts and the number of classes over all
        parts (ignored when the reader was given it)."""
        sizes = [int(n) for n in sizes]
        if len(sizes) != self.size or sizes[self.rank] != len(self.local):
            raise ValueError(f"part sizes {sizes} do not fit rank {self.rank} of {self.size} "
                             f"holding {len(self.local)} samples")
        if num_classes is not None and not self.fixed_classes:
            self.num_classes = self.local.num_classes = int(num_classes)
        self.part_sizes = sizes

    # -- Dataset -------------------------------------------------------------------------
    def __len__(self) -> int:
        return sum(self.part_sizes) if self.part_sizes is not None else len(self.local)

    def _shares(self, batch_size: int) -> list[int]:
        return [hi - lo for lo, hi in (local_range(batch_size, r, self.size)
                                       for r in range(self.size))]

    def num_batches(self, batch_size: int, drop_last: bool = False) -> int:
        if self.part_sizes is None:
            return self.local.num_batches(batch_size, drop_last)
        shares = self._shares(batch_size)
        if any(n and not s for n, s in zip(self.part_sizes, shares)):
            raise ValueError(f"global batch size {batch_size} is smaller than the {self.size} "
                             f"ranks holding parts of the data; use a larger batch")
        steps = [(n // s if drop_last else math.ceil(n / s))
                 for n, s in zip(self.part_sizes, shares) if s]
        return (min(steps) if drop_last else max(steps)) if steps else 0

    def _raw_batches(self, batch_size, shuffle, seed, rank, size, drop_last):
        if self.part_sizes is None:
            yield from self.local._raw_batches(batch_size, shuffle, seed, rank, size, drop_last)
            return
        if (rank, size) != (self.rank, self.size):
            raise ValueError(f"this dataset holds the part of rank {self.rank} of {self.size}; "
                             f"it cannot give batches for rank {rank} of {size}")
        n = len(self.local)
        order = (np.random.default_rng([seed, rank]).permutation(n) if shuffle
                 else np.arange(n))
        offset = sum(self.part_sizes[:rank])
        shares = self._shares(batch_size)
        for k in range(self.num_batches(batch_size, drop_last)):
            takes = [max(0, min(s, p - k * s)) for s, p in zip(shares, self.part_sizes)]
            start = k * shares[rank]
            ids = order[start:start + takes[rank]]
            yield ids + offset, self.local.x[ids], self.local.y[ids], sum(takes)

    def split_tail(self, count):
        if self.part_sizes is not None:
            raise ValueError("split_tail of a completed PartDataset: split each part before "
                             "set_parts")
        head, tail = self.local.split_tail(count)
        kw = dict(rank=self.rank, size=self.size, value_range=self.value_range,
                  preprocess=self.preprocess)
        classes = self.num_classes if self.fixed_classes else None
        return (PartDataset(head.x, head.y, classes, **kw),
                PartDataset(tail.x, tail.y, classes, **kw))

    def arrays(self):
        """This rank's part only (the other parts are on the other ranks)."""
        return self.local.arrays()
