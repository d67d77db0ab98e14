"""The dataset registry and ``load_dataset``, the one entry point the trainer and CLI use."""
from __future__ import annotations

import inspect
from typing import Callable

import numpy as np

from .base import Preprocess, Splits
from .cifar_python import read_cifar10_python
from .imagenet import read_imagenet
from .hdf5 import read_hdf5
from .text import read_text
from .readers import (read_cifar10, read_digits, read_fashion_mnist, read_mnist,
                      read_synthetic)

Reader = Callable[..., Splits]

DATASETS: dict[str, Reader] = {
    "mnist": read_mnist,
    "fashion_mnist": read_fashion_mnist,
    "cifar10": read_cifar10,
    "cifar10_python": read_cifar10_python,
    "imagenet": read_imagenet,
    "hdf5": read_hdf5,
    "digits": read_digits,
    "synthetic": read_synthetic,
    "text": read_text,
}
_COMMON = {"path", "preprocess", "seed"}


def load_dataset(name: str, *, path=None, dtype=np.float32, validation_split: float = 0.0,
                 test_as_validation: bool = False, one_hot: bool = False, normalize: bool = True,
                 mean=None, std=None, seed: int = 0, **reader_options) -> Splits:
    """Load dataset ``name`` from ``DATASETS`` as train/val/test ``Dataset`` splits.

    Args:
        name: a key of ``DATASETS`` (``fashion-mnist`` spellings with a hyphen work too).
        path: folder (or file, for ``hdf5``) to read; default: search the usual places.
        dtype: float dtype of the batches.
        validation_split: fraction of the training set, taken from its END (like Keras),
            held out as ``val``.
        test_as_validation: use the test split as ``val``.
        one_hot: labels as float one-hot rows instead of int64.
        normalize: scale stored values to [0, 1] (uint8 / 255).
        mean, std: per-channel statistics applied after scaling.
        seed: for readers that generate or shuffle (synthetic, digits).
        **reader_options: options of the reader, e.g. ``download=False`` for the idx/CIFAR
            readers, ``train_list=`` for hdf5, ``input_shape=`` for synthetic.

    Example:
        splits = load_dataset("fashion_mnist", validation_split=0.1)
        for batch in splits.train.batches(64, seed=epoch, rank=rank, size=size): ...
    """
    key = str(name).lower().replace("-", "_")
    if key not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; choose one of {sorted(DATASETS)}")
    reader = DATASETS[key]
    accepted = set(inspect.signature(reader).parameters) - _COMMON
    unknown = sorted(set(reader_options) - accepted)
    if unknown:
        raise ValueError(f"dataset {key!r} has no option(s) {unknown}; its options are "
                         f"{sorted(accepted)}")
    if not 0.0 <= validation_split < 1.0:
        raise ValueError(f"validation_split must be in [0, 1), got {validation_split}")
    if validation_split and test_as_validation:
        raise ValueError("validation_split and test_as_validation both choose the validation "
                         "set; pass only one of them")
    preprocess = Preprocess(dtype=dtype, normalize=normalize, mean=mean, std=std,
                            one_hot=one_hot)
    splits = reader(path=path, preprocess=preprocess, seed=seed, **reader_options)
    train, val, test = splits.train, splits.val, splits.test
    if validation_split:
        if val is not None:
            raise ValueError(f"dataset {key!r} already has a validation split; drop "
                             f"validation_split={validation_split}")
        count = len(train) - int(len(train) * (1.0 - validation_split))
        # A rank that holds no part of the data (a parameter-server master) splits nothing.
        holds_none = getattr(train, "rank", 0) is None
        if (count == 0 or count == len(train)) and not holds_none:
            raise ValueError(f"validation_split={validation_split} of {len(train)} training "
                             f"samples leaves {count} for validation; choose another fraction")
        train, val = train.split_tail(count)
    if test_as_validation:
        if test is None:
            raise ValueError(f"dataset {key!r} has no test split to use as validation")
        val = test
    return Splits(train, val, test)
