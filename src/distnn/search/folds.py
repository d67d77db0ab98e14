"""K-fold cross-validation splits of an in-memory dataset.

The samples are permuted once by ``seed`` and cut into ``k`` folds of near-equal size
(``np.array_split``); fold ``i`` is held out for validation and the others are trained
on. Every rank computes the same folds from the same seed.
"""
from __future__ import annotations

import numpy as np

from ..data import ArrayDataset, Dataset

__all__ = ["kfold_split"]


def kfold_split(dataset: Dataset, k: int, fold: int, seed: int = 0) -> tuple[Dataset, Dataset]:
    """(training part, held-out part) of fold ``fold`` of ``k``.

    Args:
        dataset: an in-memory dataset (``ArrayDataset``: the idx, CIFAR, digits, HDF5 and
            synthetic readers give one).
        k: number of folds, >= 2.
        fold: which fold is held out, 0 .. k-1.
        seed: seed of the permutation that assigns samples to folds.

    Example:
        train, val = kfold_split(splits.train, 5, 0)
    """
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 2:
        raise ValueError(f"--n_fold must be an integer >= 2 for k-fold splits, got {k!r}")
    if isinstance(fold, bool) or not isinstance(fold, (int, np.integer)) or not 0 <= fold < k:
        raise ValueError(f"fold must be in [0, {k}), got {fold!r}")
    if not isinstance(dataset, ArrayDataset):
        raise ValueError(f"--n_fold {k}: k-fold needs a dataset held in memory, got "
                         f"{type(dataset).__name__} (e.g. ImageNet shards); use --n_fold 1 "
                         "with --validation_split instead")
    n = len(dataset)
    if n < k:
        raise ValueError(f"--n_fold {k}: the training set has only {n} samples; use fewer "
                         "folds")
    order = np.random.default_rng(seed).permutation(n)
    parts = np.array_split(order, k)
    held = np.sort(parts[fold])
    kept = np.sort(np.concatenate([p for i, p in enumerate(parts) if i != fold]))
    kw = dict(value_range=dataset.value_range, preprocess=dataset.preprocess)
    return (ArrayDataset(dataset.x[kept], dataset.y[kept], dataset.num_classes, **kw),
            ArrayDataset(dataset.x[held], dataset.y[held], dataset.num_classes, **kw))
