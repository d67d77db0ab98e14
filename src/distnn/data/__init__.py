"""Datasets: readers, sharded batching across ranks, augmentation, prefetch.

Example:
    from distnn.data import load_dataset, RandomFlip, RandomCrop
    splits = load_dataset("cifar10", validation_split=0.1)
    for batch in splits.train.batches(256, seed=epoch, rank=rank, size=size,
                                      augment=[RandomFlip(), RandomCrop(4)], prefetch=True):
        ...  # batch.x, batch.y, batch.global_size
"""
from .augment import RandomCrop, RandomFlip
from .base import (ArrayDataset, Batch, Dataset, DatasetError, Preprocess, Splits,
                   local_range, prefetched)
from .cifar_python import read_cifar_pickle
from .fetch import Remote, download
from .imagenet import Shard, ShardedDataset
from .readers import read_cifar_bin, read_idx
from .registry import DATASETS, load_dataset
from .tfrecord import (convert_imagenet_tfrecords, crc32c, encode_example, parse_example,
                       read_tfrecord, write_tfrecord)

__all__ = [
    "ArrayDataset", "Batch", "DATASETS", "Dataset", "DatasetError", "Preprocess", "RandomCrop",
    "RandomFlip", "Remote", "Shard", "ShardedDataset", "Splits", "convert_imagenet_tfrecords",
    "crc32c", "download", "encode_example", "load_dataset", "local_range", "parse_example",
    "prefetched", "read_cifar_bin", "read_cifar_pickle",
    "read_idx", "read_tfrecord", "write_tfrecord",
]
