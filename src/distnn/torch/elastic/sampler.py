"""``ElasticSampler``: a torch ``Sampler`` that shards a dataset over the ranks and, kept in
a ``TorchState``, goes on after a reset with the samples of the epoch not yet processed,
shared among the new ranks (Horovod's ``ElasticSampler``).

Every rank shuffles the same way (``seed + epoch``); the epoch's order, less its first
``processed_num`` indices, is padded to a multiple of the number of ranks and rank r takes
every size-th index from r. ``record_batch`` adds one global batch (``batch_size`` × ranks)
to ``processed_num``; as the ranks step together, the processed samples are exactly the
first ``processed_num`` of the epoch's order (``processed_indices``), whatever the number
of ranks was when each was processed.
"""
from __future__ import annotations

import math
import random
from typing import Iterator, Sized

import torch.utils.data

from ...distributed import rank, size

__all__ = ["ElasticSampler"]


class ElasticSampler(torch.utils.data.Sampler):
    """Shards ``dataset`` over the ranks; remembers what this epoch processed.

    Args:
        dataset: a sized dataset (its length must not change).
        shuffle: shuffle the indices each epoch (the same order on every rank).
        seed: the shuffle's seed (the same on every rank).

    Use: keep it in the ``TorchState``, call ``record_batch`` after each batch and
    ``set_epoch`` at the END of each epoch (it clears what was processed).

    Example:
        sampler = hvd.elastic.ElasticSampler(dataset)
        loader = DataLoader(dataset, batch_size=32, sampler=sampler)
        state = hvd.elastic.TorchState(model, opt, train_sampler=sampler, epoch=0)
    """

    def __init__(self, dataset: Sized, shuffle: bool = True, seed: int = 0):
        self.dataset, self.shuffle, self.seed = dataset, shuffle, seed
        self.epoch = 0
        self.processed_num = 0
        self.reset()

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch``: a new order, nothing processed."""
        self.epoch = epoch
        self.processed_num = 0
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """One batch of ``batch_size`` samples per rank was processed (every rank)."""
        self.processed_num += batch_size * self.num_replicas

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "processed_num": self.processed_num}

    def load_state_dict(self, state_dict: dict) -> None:
        self.epoch = state_dict["epoch"]
        self.processed_num = state_dict["processed_num"]
        self.reset()

    def _order(self) -> list[int]:
        order = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)
        return order

    @property
    def processed_indices(self) -> set[int]:
        """The dataset indices processed this epoch (by every rank together)."""
        return set(self._order()[:self.processed_num])

    def reset(self) -> None:
        """Re-shard what is left of the epoch over the current ranks."""
        self.num_replicas, self.rank = size(), rank()
        self.remaining_indices = self._order()[self.processed_num:]
        self.num_samples = int(math.ceil(len(self.remaining_indices) / self.num_replicas))
        self.total_size = self.num_samples * self.num_replicas

    def __iter__(self) -> Iterator[int]:
        indices = list(self.remaining_indices)
        if indices:
            while len(indices) < self.total_size:  # pad by wrapping, as DistributedSampler
                indices += indices[:self.total_size - len(indices)]
        return iter(indices[self.rank:self.total_size:self.num_replicas])

    def __len__(self) -> int:
        return self.num_samples
