"""The data of a run: the dataset splits a ``RunConfig`` asks for, read on every rank
(``load_data``), and its training-time augmentations."""
from __future__ import annotations

import inspect

import numpy as np

from .config import PRED, TRAIN, RunConfig
from .errors import RunError, agreed
from .rule import build_rule

__all__ = ["load_splits", "load_data", "build_augment", "READER_OPTIONS"]


READER_OPTIONS = ("download", "train_list", "val_list", "test_list", "features_name",
                  "labels_name", "input_shape", "num_classes", "num_samples", "data_layout",
                  "context", "tokenizer", "vocab_size")


def load_splits(cfg: RunConfig, comm, rule=None):
    """The dataset splits the config asks for (train/val/test; test from
    ``dataset_test_path`` when given). Reader options go to the readers that take them;
    ``rule``: the run's training rule, which says which part of the training files this
    rank reads (built here from ``cfg`` where not given and needed)."""
    from ..data import DATASETS, load_dataset
    d = cfg.data
    accepted = set(inspect.signature(DATASETS[d.dataset]).parameters)
    reader_options = {name: getattr(d, name) for name in READER_OPTIONS
                      if name in accepted and getattr(d, name) is not None}
    if "rank" in accepted:  # readers that read only this rank's part (hdf5)
        reader_options.update(rank=comm.rank, size=comm.size)
        if "train_part" in accepted and cfg.command == TRAIN and comm.size > 1:
            # the training files are split among the ranks that train (the workers)
            rule = build_rule(cfg, comm) if rule is None else rule
            reader_options.update(train_part=rule.shard_of(comm))
    from ..nn.losses import CategoricalCrossEntropy, get_loss
    from ..nn.metrics import get_metric, mean_absolute_error, mean_squared_error
    # mse, mae and bce (losses or metrics) compare the outputs with targets of their
    # shape: one-hot labels then (the other losses and metrics take those too).
    one_hot = (not isinstance(get_loss(cfg.optim.loss_func), CategoricalCrossEntropy)
               or any(get_metric(m) in (mean_squared_error, mean_absolute_error)
                      for m in cfg.optim.metrics))
    common = dict(dtype=np.dtype(cfg.model.dtype), normalize=d.normalize, one_hot=one_hot,
                  seed=cfg.model.random_seed, **reader_options)
    training = cfg.command == TRAIN and not cfg.train.evaluate_only
    test_as_val = training and d.test_as_validation
    # predict --split val holds out the same tail of the training set as train did.
    held_out = training or (cfg.command == PRED and cfg.predict.split == "val")
    splits = load_dataset(d.dataset, path=d.dataset_path,
                          validation_split=0.0 if test_as_val or not held_out
                          else d.validation_split,
                          test_as_validation=test_as_val, **common)
    if d.dataset_test_path:
        from ..data import Splits
        other = load_dataset(d.dataset, path=d.dataset_test_path, **common)
        # A folder of test files only (ImageNet validation shards) reads as train.
        test = other.test if other.test is not None else other.train
        splits = Splits(splits.train, test if test_as_val else splits.val, test)
    return splits


def load_data(cfg: RunConfig, comm, rule=None):
    """``load_splits`` on every rank (a failure on one is an error on all), then datasets
    of which each rank read only its part learn the sizes of the other parts."""
    splits = agreed(comm, "dataset", lambda: load_splits(cfg, comm, rule))
    parts = {id(ds): ds for ds in (splits.train, splits.val, splits.test)
             if getattr(ds, "part_sizes", ()) is None}
    if parts:
        infos = {key: comm.allgather_obj((ds.rank, *ds.part_info())) if comm.size > 1
                 else [(ds.rank, *ds.part_info())] for key, ds in parts.items()}
        num_classes = max(top for info in infos.values() for _, _, top in info)
        for key, ds in parts.items():
            sizes = [0] * ds.size
            for part, n, _ in infos[key]:
                if part is not None:
                    sizes[part] = n
            ds.set_parts(sizes, num_classes, owners=[p for p, _, _ in infos[key]],
                         job_rank=comm.rank)
    if cfg.command == TRAIN and splits.train is not None and len(splits.train) == 0:
        d = cfg.data  # every rank has the sizes of every part: all raise alike
        where = (f"--train_list {d.train_list}" if d.train_list else
                 f"--dataset_path {d.dataset_path}" if d.dataset_path else d.dataset)
        raise RunError(f"dataset: {where}: the training split holds no samples; give files "
                       "that hold some")
    return splits


def build_augment(cfg: RunConfig) -> list:
    """The training-time augmentations of ``cfg.data``."""
    from ..data import RandomCrop, RandomFlip
    d = cfg.data
    out = []
    if d.flip_images:
        out.append(RandomFlip(d.flip_images_prob))
    if d.crop_images:
        out.append(RandomCrop(d.crop_images_padding, d.crop_images_prob,
                              d.crop_images_padding_mode))
    return out
