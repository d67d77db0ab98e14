"""Datasets and their batches: preprocessing, sharding of global batches across ranks, prefetch.

``batch_size`` is always the GLOBAL batch. The permutation of an epoch depends only on the
seed, so every rank computes the same global batches; rank ``r`` of ``size`` keeps
``np.array_split(global_batch, size)[r]``. Every rank therefore iterates the same number of
batches, and a rank whose share of the last global batch is empty still gets a (0, ...)
batch so that it joins the collectives of that step.
"""
from __future__ import annotations

import math
import queue
import threading
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence, TypeVar

import numpy as np

T = TypeVar("T")
Augment = Callable[[np.ndarray, np.random.Generator], np.ndarray]
RawBatches = Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, int]]


class DatasetError(ValueError):
    """A dataset file is missing, malformed or inconsistent; the message names the file,
    the problem, and what to do about it."""


@dataclass(frozen=True)
class Preprocess:
    """How stored samples become model inputs: cast, scale to [0, 1], standardize, encode labels.

    Args:
        dtype: float dtype of ``batch.x`` (and of one-hot ``batch.y``).
        normalize: divide by the stored value range (255 for uint8 images, 16 for digits)
            so inputs lie in [0, 1]; float data without a known range is left as is.
        mean, std: per-channel (axis 1) or scalar statistics applied after scaling,
            ``x = (x - mean) / std``. ``std`` alone means ``mean = 0``; ``mean`` alone ``std = 1``.
        one_hot: labels as float rows (N, C) instead of int64 (N,).

    Example:
        Preprocess(mean=(0.4914, 0.4822, 0.4465), std=(0.247, 0.243, 0.261))  # CIFAR-10
    """

    dtype: np.dtype = np.dtype(np.float32)
    normalize: bool = True
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    one_hot: bool = False

    def __post_init__(self):
        dtype = np.dtype(self.dtype)
        if dtype.kind != "f":
            raise ValueError(f"dtype must be a floating-point dtype, got {dtype}; "
                             f"use np.float32 or np.float64")
        object.__setattr__(self, "dtype", dtype)
        for name in ("mean", "std"):
            value = getattr(self, name)
            if value is None:
                continue
            arr = np.atleast_1d(np.asarray(value, dtype=np.float64))
            if arr.ndim != 1 or arr.size == 0 or not np.all(np.isfinite(arr)):
                raise ValueError(f"{name} must be a finite number or a sequence of one per "
                                 f"channel, got {value!r}")
            if name == "std" and np.any(arr <= 0):
                raise ValueError(f"std must be > 0 for every channel, got {value!r}")
            object.__setattr__(self, name, tuple(float(v) for v in arr))

    def check(self, input_shape: tuple[int, ...]) -> None:
        """Raise if ``mean``/``std`` do not match the channel count (axis 1) of ``input_shape``."""
        channels = input_shape[0] if input_shape else 1
        for name in ("mean", "std"):
            value = getattr(self, name)
            if value is not None and len(value) not in (1, channels):
                raise ValueError(f"{name} has {len(value)} values but the samples of shape "
                                 f"{input_shape} have {channels} channels; give 1 or {channels}")

    def scale(self, raw: np.ndarray, value_range: float | None) -> np.ndarray:
        x = raw.astype(self.dtype, copy=True)
        if self.normalize and value_range:
            x *= self.dtype.type(1.0 / value_range)
        return x

    def standardize_(self, x: np.ndarray) -> np.ndarray:
        if self.mean is None and self.std is None:
            return x
        shape = (1, -1) + (1,) * (x.ndim - 2)
        if self.mean is not None:
            x -= np.asarray(self.mean, dtype=x.dtype).reshape(shape)
        if self.std is not None:
            x /= np.asarray(self.std, dtype=x.dtype).reshape(shape)
        return x

    def labels(self, y: np.ndarray, num_classes: int) -> np.ndarray:
        if not self.one_hot:
            return y
        out = np.zeros((len(y), num_classes), dtype=self.dtype)
        out[np.arange(len(y)), y] = 1
        return out


@dataclass
class Batch:
    """One rank's share of one global batch.

    Attributes:
        x: this rank's samples, float, (n, *input_shape); n may be 0.
        y: int64 labels (n,), or float one-hot rows (n, num_classes).
        global_size: number of samples in the global batch (all ranks together).
        indices: dataset positions of this rank's samples (for tests and debugging).
    """

    x: np.ndarray
    y: np.ndarray
    global_size: int
    indices: np.ndarray

    def __len__(self) -> int:
        return len(self.x)


def local_range(global_size: int, rank: int, size: int) -> tuple[int, int]:
    """Slice ``[lo, hi)`` of a global batch that ``np.array_split(batch, size)[rank]`` takes."""
    q, r = divmod(global_size, size)
    lo = rank * q + min(rank, r)
    return lo, lo + q + (1 if rank < r else 0)


def global_batch_sizes(n: int, batch_size: int, drop_last: bool) -> list[int]:
    full, rest = divmod(n, batch_size)
    return [batch_size] * full + ([rest] if rest and not drop_last else [])


def epoch_ids(n: int, batch_size: int, shuffle: bool, seed, rank: int, size: int,
              drop_last: bool) -> Iterator[tuple[np.ndarray, int]]:
    """Each global batch of an epoch over ``n`` samples (in order, or permuted by ``seed``):
    the dataset positions of this rank's share and the batch's global size."""
    order = np.random.default_rng(seed).permutation(n) if shuffle else np.arange(n)
    start = 0
    for global_size in global_batch_sizes(n, batch_size, drop_last):
        lo, hi = local_range(global_size, rank, size)
        yield order[start + lo:start + hi], global_size
        start += global_size


def _check_int(name: str, value, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    if value < low or (high is not None and value >= high):
        bound = f">= {low}" if high is None else f"in [{low}, {high})"
        raise ValueError(f"{name} must be {bound}, got {value}")
    return int(value)


class Dataset:
    """A labelled set of samples that yields this rank's share of each global batch.

    Subclasses implement ``__len__``, ``_raw_batches`` (stored samples of this rank, batch
    by batch), ``split_tail`` and ``arrays``; preprocessing and augmentation live here.

    Attributes:
        input_shape: per-sample shape, NCHW without N, e.g. (1, 28, 28).
        num_classes: number of label values; labels are 0 .. num_classes - 1.
        preprocess: the ``Preprocess`` applied to every batch.
        value_range: the stored maximum that ``normalize`` divides by (None: left as is).
    """

    def __init__(self, input_shape: Sequence[int], num_classes: int, *,
                 value_range: float | None = None, preprocess: Preprocess | None = None):
        self.input_shape = tuple(int(s) for s in input_shape)
        self.num_classes = int(num_classes)
        self.value_range = value_range
        self.preprocess = preprocess or Preprocess()
        self.preprocess.check(self.input_shape)

    def __len__(self) -> int:
        raise NotImplementedError

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(len={len(self)}, input_shape={self.input_shape}, "
                f"num_classes={self.num_classes})")

    def num_batches(self, batch_size: int, drop_last: bool = False) -> int:
        """Number of global batches per epoch (the same on every rank)."""
        batch_size = _check_int("batch_size", batch_size, 1)
        n = len(self)
        return n // batch_size if drop_last else math.ceil(n / batch_size)

    def batches(self, batch_size: int, *, shuffle: bool = True, seed: int = 0, rank: int = 0,
                size: int = 1, drop_last: bool = False, augment: Sequence[Augment] | None = None,
                prefetch: bool = False) -> Iterator[Batch]:
        """Iterate this rank's share of the global batches of one epoch.

        Args:
            batch_size: the GLOBAL batch size (all ranks together).
            shuffle: permute the samples with a generator seeded by ``seed`` alone.
            seed: epoch seed; pass the same value on every rank (e.g. ``base_seed + epoch``).
            rank, size: this process's rank and the number of ranks.
            drop_last: skip the last global batch when it is smaller than ``batch_size``.
            augment: transforms ``f(x, rng) -> x`` applied in order to the [0, 1]-scaled
                batch before mean/std; ``rng`` is ``default_rng([seed, rank])``.
            prefetch: prepare the next batch in a background thread.

        Example:
            for batch in ds.batches(256, seed=epoch, rank=comm.rank, size=comm.size):
                loss = step(batch.x, batch.y, batch.global_size)
        """
        batch_size = _check_int("batch_size", batch_size, 1)
        size = _check_int("size", size, 1)
        rank = _check_int("rank", rank, 0, size)
        seed = _check_int("seed", seed, 0)
        augment = list(augment or [])
        for a in augment:
            if not callable(a):
                raise ValueError(f"augment entries must be callables f(x, rng) -> x, got {a!r}")
        batches = self._batches(batch_size, bool(shuffle), seed, rank, size, bool(drop_last),
                                augment)
        return prefetched(batches) if prefetch else batches

    def _batches(self, batch_size, shuffle, seed, rank, size, drop_last, augment):
        rng = np.random.default_rng([seed, rank]) if augment else None
        for ids, raw, y, global_size in self._raw_batches(batch_size, shuffle, seed, rank,
                                                          size, drop_last):
            x = self.preprocess.scale(raw, self.value_range)
            for transform in augment:
                x = transform(x, rng)
            x = self.preprocess.standardize_(x)
            yield Batch(x, self.preprocess.labels(y, self.num_classes), global_size, ids)

    def _raw_batches(self, batch_size: int, shuffle: bool, seed: int, rank: int, size: int,
                     drop_last: bool) -> RawBatches:
        """Yield (dataset indices, stored x, int64 labels, global batch size) for this rank."""
        raise NotImplementedError

    def split_tail(self, count: int) -> tuple["Dataset", "Dataset"]:
        """Split into (all but the last ``count`` samples, the last ``count`` samples)."""
        raise NotImplementedError

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """All samples in order, preprocessed (x) and encoded (y), as two arrays."""
        raise NotImplementedError


class ArrayDataset(Dataset):
    """A dataset held in memory as two arrays.

    Args:
        x: samples (N, *input_shape), any numeric dtype (kept as given; scaled per batch).
        y: int labels (N,) in [0, num_classes).
        num_classes: number of classes; default ``y.max() + 1``.
        value_range: stored maximum that ``normalize`` divides by; default 255 for uint8
            and None (leave as is) otherwise.
        preprocess: cast/scale/standardize/label encoding (default float32, normalized).

    Example:
        ds = ArrayDataset(x_uint8, labels, 10)
        for batch in ds.batches(64, seed=epoch): ...
    """

    def __init__(self, x: np.ndarray, y: np.ndarray, num_classes: int | None = None, *,
                 value_range: float | None = None, preprocess: Preprocess | None = None):
        x, y = np.asarray(x), np.asarray(y)
        if x.ndim < 2:
            raise ValueError(f"x must have shape (N, *input_shape), got shape {x.shape}")
        if y.ndim != 1 or y.dtype.kind not in "iu":
            raise ValueError(f"y must be integer labels of shape (N,), got {y.dtype} {y.shape}")
        if len(x) != len(y):
            raise ValueError(f"x has {len(x)} samples but y has {len(y)} labels; they must match")
        if num_classes is None:
            num_classes = int(y.max()) + 1 if len(y) else 0
        if len(y) and (y.min() < 0 or y.max() >= num_classes):
            raise ValueError(f"labels must be in [0, {num_classes}), got range "
                             f"[{y.min()}, {y.max()}]; pass num_classes or fix the labels")
        if value_range is None and x.dtype == np.uint8:
            value_range = 255
        super().__init__(x.shape[1:], num_classes, value_range=value_range,
                         preprocess=preprocess)
        self.x, self.y = x, y.astype(np.int64, copy=False)

    def __len__(self) -> int:
        return len(self.x)

    def _raw_batches(self, batch_size, shuffle, seed, rank, size, drop_last):
        for ids, global_size in epoch_ids(len(self), batch_size, shuffle, seed, rank, size,
                                          drop_last):
            yield ids, self.x[ids], self.y[ids], global_size

    def split_tail(self, count):
        count = _check_int("count", count, 0, len(self) + 1)
        cut = len(self) - count
        kw = dict(value_range=self.value_range, preprocess=self.preprocess)
        return (ArrayDataset(self.x[:cut], self.y[:cut], self.num_classes, **kw),
                ArrayDataset(self.x[cut:], self.y[cut:], self.num_classes, **kw))

    def arrays(self):
        x = self.preprocess.standardize_(self.preprocess.scale(self.x, self.value_range))
        return x, self.preprocess.labels(self.y, self.num_classes)


@dataclass(frozen=True)
class Splits:
    """The splits ``load_dataset`` returns; ``val`` may be None."""

    train: Dataset
    val: Dataset | None
    test: Dataset | None


def batch_file_splits(read: Callable, root, files: dict | None, train: Sequence[str],
                      test: str, preprocess, classes: int = 10) -> Splits:
    """Splits (train, None, test) of a dataset stored as batch files (CIFAR's): the
    training files concatenated in order. ``read(root / name)`` reads one from a folder;
    with ``files`` (an archive's members) ``read(root / name, files[name])``."""
    def one(name):
        return read(root / name) if files is None else read(root / name, files[name])
    parts = [one(name) for name in train]
    x_test, y_test = one(test)
    whole = ArrayDataset(np.concatenate([p[0] for p in parts]),
                         np.concatenate([p[1] for p in parts]), classes, preprocess=preprocess)
    return Splits(whole, None, ArrayDataset(x_test, y_test, classes, preprocess=preprocess))


_ITEM, _END, _ERROR = range(3)


def prefetched(items: Iterator[T], depth: int = 1) -> Iterator[T]:
    """Iterate ``items`` in a background thread, ``depth`` items ahead.

    Exceptions raised while producing are re-raised in the consumer; closing the returned
    generator early (``break``, ``del``, ``.close()``) stops and joins the thread.
    """
    slots: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(entry) -> bool:
        while not stop.is_set():
            try:
                slots.put(entry, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def produce():
        try:
            for item in items:
                if not put((_ITEM, item)):
                    return
        except BaseException as exc:  # handed to the consumer, which re-raises it
            put((_ERROR, exc))
            return
        put((_END, None))

    def consume():
        thread = threading.Thread(target=produce, name="distnn-prefetch", daemon=True)
        thread.start()
        try:
            while True:
                kind, item = slots.get()
                if kind == _END:
                    return
                if kind == _ERROR:
                    raise item
                yield item
        finally:
            stop.set()
            thread.join()
            close = getattr(items, "close", None)
            if close is not None:
                close()

    return consume()
