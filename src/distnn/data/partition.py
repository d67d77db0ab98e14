"""A dataset of which each rank holds only its own part (NNLO's split of the HDF5 files
among the workers), so that the whole set never has to fit in one process.

A reader builds ``PartDataset`` from this rank's rows before the sizes of the other parts
are known; the caller that has the communicator then all-gathers ``part_info()`` and calls
``set_parts`` (``distnn.run.load_data`` does). Nothing here communicates.

The parts may be spread over fewer ranks than the job has: under the parameter-server
rules rank 0 trains on nothing, so the training files are split among the workers only and
rank 0 holds no part (``rank=None``). ``set_parts`` then also learns which rank holds which
part (``owners``), so that the same dataset gives batches both to the workers' shards
(training) and to every rank of the job (evaluation, the master's share being empty).

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
        rank, size: the part this rank holds and the number of parts; rank None: this
            rank holds no part (x, y empty: a master that trains on nothing).
        value_range, preprocess: as for ``ArrayDataset``.

    Example:
        part = PartDataset(x_mine, y_mine, None, rank=comm.rank, size=comm.size)
        infos = comm.allgather_obj(part.part_info())
        part.set_parts([n for n, _ in infos], max(top for _, top in infos))
    """

    def __init__(self, x: np.ndarray, y: np.ndarray, num_classes: int | None, *,
                 rank: int | None,
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
        if rank is None and len(y):
            raise ValueError(f"a rank holding no part (rank=None) got {len(y)} samples")
        if rank is not None and not 0 <= rank < size:
            raise ValueError(f"rank must be in [0, {size}) or None, got {rank}")
        self.rank, self.size = (None if rank is None else int(rank)), int(size)
        self.part_sizes: list[int] | None = None
        self.owners: list[int | None] | None = None  # the part of every rank of the job
        self.job_rank: int | None = None

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

    def set_parts(self, sizes: Sequence[int], num_classes: int | None, *,
                  owners: Sequence[int | None] | None = None,
                  job_rank: int | None = None) -> None:
        """Complete the dataset: the sizes of all parts and the number of classes over all
        parts (ignored when the reader was given it). ``owners``: the part every rank of
        the job holds (None: none) and ``job_rank`` this rank in the job, when they differ
        from the parts' numbering (default: rank r holds part r)."""
        sizes = [int(n) for n in sizes]
        if len(sizes) != self.size or (self.rank is not None
                                       and sizes[self.rank] != len(self.local)):
            raise ValueError(f"part sizes {sizes} do not fit part {self.rank} of {self.size} "
                             f"holding {len(self.local)} samples")
        if owners is None:
            if self.rank is None:
                raise ValueError("a rank holding no part needs owners= and job_rank=")
            owners, job_rank = list(range(self.size)), self.rank
        owners = [None if p is None else int(p) for p in owners]
        if (job_rank is None or not 0 <= job_rank < len(owners)
                or owners[job_rank] != self.rank
                or sorted(p for p in owners if p is not None) != list(range(self.size))):
            raise ValueError(f"owners {owners} do not give each of the {self.size} parts to "
                             f"one rank with part {self.rank} on rank {job_rank}")
        self.owners, self.job_rank = owners, int(job_rank)
        if num_classes is not None and not self.fixed_classes:
            self.num_classes = self.local.num_classes = int(num_classes)
        self.part_sizes = sizes

    # -- Dataset -------------------------------------------------------------------------
    def __len__(self) -> int:
        return sum(self.part_sizes) if self.part_sizes is not None else len(self.local)

    @staticmethod
    def _shares(batch_size: int, size: int) -> list[int]:
        return [hi - lo for lo, hi in (local_range(batch_size, r, size) for r in range(size))]

    def _view(self, rank: int, size: int) -> list[int]:
        """The sizes of the data of the ``size`` shards when asked for shard ``rank``: the
        parts themselves, or the parts of the job's ranks (0 for a rank holding none)."""
        if self.rank is not None and (rank, size) == (self.rank, self.size):
            return self.part_sizes
        if (rank, size) == (self.job_rank, len(self.owners)):
            return [0 if p is None else self.part_sizes[p] for p in self.owners]
        raise ValueError(f"this dataset holds part {self.rank} of {self.size} (on rank "
                         f"{self.job_rank} of {len(self.owners)}); it cannot give batches "
                         f"for rank {rank} of {size}")

    @staticmethod
    def _steps(sizes: list[int], shares: list[int], drop_last: bool) -> int:
        if any(n and not s for n, s in zip(sizes, shares)):
            raise ValueError(f"global batch size {sum(shares)} is smaller than the "
                             f"{sum(1 for n in sizes if n)} ranks holding parts of the data; "
                             "use a larger batch")
        steps = [(n // s if drop_last else math.ceil(n / s))
                 for n, s in zip(sizes, shares) if s]
        return (min(steps) if drop_last else max(steps)) if steps else 0

    def num_batches(self, batch_size: int, drop_last: bool = False) -> int:
        if self.part_sizes is None:
            return self.local.num_batches(batch_size, drop_last)
        return self._steps(self.part_sizes, self._shares(batch_size, self.size), drop_last)

    def _raw_batches(self, batch_size, shuffle, seed, rank, size, drop_last):
        if self.part_sizes is None:
            yield from self.local._raw_batches(batch_size, shuffle, seed, rank, size, drop_last)
            return
        sizes = self._view(rank, size)
        n = len(self.local)
        order = (np.random.default_rng([seed, rank]).permutation(n) if shuffle
                 else np.arange(n))
        offset = sum(self.part_sizes[:self.rank or 0])
        shares = self._shares(batch_size, size)
        for k in range(self._steps(sizes, shares, drop_last)):
            takes = [max(0, min(s, p - k * s)) for s, p in zip(shares, sizes)]
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


# -- clients' partitions of a labelled dataset (federated learning) -------------------------
PARTITIONS = ("iid", "dirichlet", "shards")


def iid_partition(labels: np.ndarray, clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    """The samples shuffled and cut into ``clients`` near-equal parts (indices, sorted)."""
    order = rng.permutation(len(labels))
    return [np.sort(part) for part in np.array_split(order, clients)]


def dirichlet_partition(labels: np.ndarray, clients: int, alpha: float,
                        rng: np.random.Generator, min_size: int = 1) -> list[np.ndarray]:
    """Non-IID parts: each class's samples split among the clients in proportions drawn from
    Dirichlet(alpha) (Hsu et al. 2019; small alpha: few classes per client), redrawn until
    every client holds at least ``min_size`` samples.

    Example:
        parts = dirichlet_partition(y, 10, 0.5, np.random.default_rng(0))
    """
    labels = np.asarray(labels)
    if alpha <= 0:
        raise ValueError(f"dirichlet_alpha must be > 0, got {alpha!r}")
    if clients * min_size > len(labels):
        raise ValueError(f"{clients} clients of at least {min_size} samples need "
                         f"{clients * min_size}, the dataset has {len(labels)}")
    for _ in range(1000):
        parts: list[list[np.ndarray]] = [[] for _ in range(clients)]
        for c in np.unique(labels):
            idx = rng.permutation(np.flatnonzero(labels == c))
            cuts = (np.cumsum(rng.dirichlet(np.full(clients, alpha))) * len(idx)).astype(int)
            for k, piece in enumerate(np.split(idx, cuts[:-1])):
                parts[k].append(piece)
        out = [np.sort(np.concatenate(p)) for p in parts]
        if min(len(p) for p in out) >= min_size:
            return out
    raise ValueError(f"no Dirichlet({alpha}) draw gave every one of {clients} clients "
                     f"{min_size} samples in 1000 tries; raise dirichlet_alpha")


def shard_partition(labels: np.ndarray, clients: int, shards_per_client: int,
                    rng: np.random.Generator) -> list[np.ndarray]:
    """McMahan et al.'s pathological non-IID parts: the samples sorted by label, cut into
    ``clients * shards_per_client`` shards, each client given ``shards_per_client`` at
    random (so about that many classes each)."""
    order = np.argsort(np.asarray(labels), kind="stable")
    shards = np.array_split(order, clients * shards_per_client)
    picks = rng.permutation(len(shards)).reshape(clients, shards_per_client)
    return [np.sort(np.concatenate([shards[s] for s in row])) for row in picks]


def client_partition(labels: np.ndarray, clients: int, how: str = "iid", *,
                     alpha: float = 0.5, shards_per_client: int = 2,
                     seed: int = 0) -> list[np.ndarray]:
    """The indices of each client's samples: ``how`` iid | dirichlet | shards, the same on
    every rank for the same ``seed``."""
    rng = np.random.default_rng([seed, 7919])
    if how == "iid":
        return iid_partition(labels, clients, rng)
    if how == "dirichlet":
        return dirichlet_partition(labels, clients, alpha, rng)
    if how == "shards":
        return shard_partition(labels, clients, shards_per_client, rng)
    raise ValueError(f"partition must be one of {', '.join(PARTITIONS)}, got {how!r}")
