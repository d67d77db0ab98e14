"""ImageNet as NPZ shards (``x``: uint8 NCHW, ``y``: int labels), read shard by shard.

Shards written by ``distnn convert-imagenet`` and by PyDTNN's converter (labels ``y`` of
shape (N, 1), any integer type, 1-based) are both read.

The dataset knows every shard's size from the ``.npy`` headers inside the zip; opening it
reads only the labels (to check their range), never the images. An epoch is one stream of
samples: the shards in an order drawn from
the seed, each permuted by its own generator. Rank ``r`` takes a contiguous stretch of that
stream, exactly as long as the sum of its ``array_split`` shares of the global batches, so
every rank reads only about 1/size of the shards, all ranks agree on the plan, the batch
counts and sizes match the in-memory datasets, and each sample is seen once per epoch.
Only the composition of a global batch differs from ``ArrayDataset`` (it follows the shards).
"""
from __future__ import annotations

import glob
import math
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from ..fileio import read_npz
from . import fetch
from .base import Dataset, DatasetError, Preprocess, Splits, global_batch_sizes


@dataclass(frozen=True)
class Shard:
    """Rows ``[start, stop)`` of the NPZ file ``path``."""

    path: Path
    start: int
    stop: int

    def __len__(self) -> int:
        return self.stop - self.start


def npz_header(path: str | os.PathLike, key: str) -> tuple[tuple[int, ...], np.dtype]:
    """Shape and dtype of array ``key`` in an ``.npz`` file, read from its header only."""
    try:
        with zipfile.ZipFile(path) as zf, zf.open(f"{key}.npy") as f:
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, _, dtype = np.lib.format.read_array_header_1_0(f)
            else:
                shape, _, dtype = np.lib.format.read_array_header_2_0(f)
            size = zf.getinfo(f"{key}.npy").file_size
    except KeyError as exc:
        raise DatasetError(f"{path}: no array {key!r} in this npz; shards need 'x' (uint8 "
                           f"N,C,H,W) and 'y' (int labels)") from exc
    except (zipfile.BadZipFile, ValueError, OSError) as exc:
        raise DatasetError(f"{path}: not a readable npz shard ({exc}); convert it again") from exc
    if math.prod(shape) * dtype.itemsize > size:  # checked before anything is allocated
        raise DatasetError(f"{path}: {key!r} declares shape {tuple(shape)} but the file holds "
                           f"{size} bytes of it; the shard is corrupt, convert it again")
    return tuple(shape), np.dtype(dtype)


def scan_shards(files: Sequence[str | os.PathLike]):
    """Check every shard's headers; return [(path, count, sample shape, labels)]."""
    scanned, input_shape = [], None
    for file in map(Path, files):
        x_shape, dtype = npz_header(file, "x")
        y_shape, _ = npz_header(file, "y")
        if dtype != np.uint8 or len(x_shape) != 4:
            raise DatasetError(f"{file}: 'x' is {dtype} of shape {tuple(x_shape)}; shards "
                               f"need uint8 (N, C, H, W)")
        n, *shape = x_shape
        if input_shape is not None and tuple(shape) != input_shape:
            raise DatasetError(f"{file}: samples of shape {tuple(shape)}, but earlier shards "
                               f"have {input_shape}; convert all shards at one image_size")
        if y_shape not in ((n,), (n, 1)):
            raise DatasetError(f"{file}: {n} images but 'y' has shape {y_shape}; labels "
                               f"must be (N,) or (N, 1); the shard is inconsistent, convert "
                               f"it again")
        input_shape = tuple(shape)
        scanned.append((file, n, input_shape, _read(file, "y")))
    return scanned


def _read(path: Path, key: str) -> np.ndarray:
    try:  # plain arrays only: an entry that holds a pickle is refused, never loaded
        value = read_npz(path, [key])[key]
    except (ValueError, OSError, KeyError) as exc:
        raise DatasetError(f"{path}: cannot read {key!r} ({exc}); the shard is corrupt, "
                           f"convert it again") from exc
    # PyDTNN's converter stores labels as (N, 1)
    return value.reshape(-1) if key == "y" and value.ndim == 2 else value


class ShardedDataset(Dataset):
    """Samples in NPZ shards on disk, loaded one shard at a time.

    Args:
        shards: the row ranges that make up the dataset, in their stored order.
        input_shape: per-sample shape (C, H, W), the same in every shard.
        num_classes: number of classes.
        label_base: subtracted from the stored labels (1 for 1-based ImageNet labels).
        preprocess: cast/scale/standardize/label encoding.

    Example:
        ds = ShardedDataset.from_files(sorted(glob.glob("imagenet/train/*.npz")),
                                       num_classes=1000, label_base=1)
    """

    def __init__(self, shards: Sequence[Shard], input_shape: Sequence[int], num_classes: int,
                 *, label_base: int = 0, preprocess: Preprocess | None = None):
        super().__init__(input_shape, num_classes, value_range=255, preprocess=preprocess)
        self.shards = list(shards)
        self.label_base = int(label_base)
        self.offsets = np.cumsum([0] + [len(s) for s in self.shards])

    @classmethod
    def from_files(cls, files: Sequence[str | os.PathLike], *, num_classes: int,
                   label_base: int | str = 0,
                   preprocess: Preprocess | None = None) -> "ShardedDataset":
        """Open shard files, checking headers, label counts and label range.

        ``label_base="auto"`` means 1 when no label is 0 and the largest is ``num_classes``.
        """
        scanned = scan_shards(files)
        base = resolve_label_base([y for *_, y in scanned], label_base, num_classes)
        return cls._from_scan(scanned, num_classes, base, preprocess)

    @classmethod
    def _from_scan(cls, scanned, num_classes, label_base, preprocess) -> "ShardedDataset":
        if not scanned:
            raise DatasetError("no shard files given")
        for path, _, _, y in scanned:
            check_labels(path, y, label_base, num_classes)
        return cls([Shard(path, 0, n) for path, n, _, _ in scanned], scanned[0][2], num_classes,
                   label_base=label_base, preprocess=preprocess)

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def _load(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        shard = self.shards[k]
        x, y = _read(shard.path, "x"), _read(shard.path, "y")
        if len(x) < shard.stop or x.shape[1:] != self.input_shape or len(y) != len(x):
            raise DatasetError(f"{shard.path}: changed since the dataset was opened (now x "
                               f"{x.shape}, y {y.shape}); reload the dataset")
        y = y[shard.start:shard.stop].astype(np.int64) - self.label_base
        return x[shard.start:shard.stop], y

    def _stream(self, lo: int, hi: int, shuffle: bool, seed: int):
        """Yield (ids, x, y) chunks of stream positions [lo, hi) of this epoch, in order."""
        order = (np.random.default_rng(seed).permutation(len(self.shards)) if shuffle
                 else np.arange(len(self.shards)))
        pos = 0
        for k in order:
            n = len(self.shards[k])
            a, b = max(lo, pos), min(hi, pos + n)
            if a < b:
                rows = np.arange(n)
                if shuffle:
                    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(int(k),)))
                    rows = rng.permutation(n)
                rows = rows[a - pos:b - pos]
                x, y = self._load(k)
                yield self.offsets[k] + rows, x[rows], y[rows]
            pos += n
            if pos >= hi:
                return

    def _raw_batches(self, batch_size, shuffle, seed, rank, size, drop_last):
        sizes = global_batch_sizes(len(self), batch_size, drop_last)
        g = np.array(sizes, dtype=np.int64)[:, None]
        shares = g // size + (np.arange(size) < g % size)  # np.array_split's share sizes
        totals = shares.sum(axis=0)
        lo = int(totals[:rank].sum())
        chunks = self._stream(lo, lo + int(totals[rank]), shuffle, seed)
        pending: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        have = 0
        for global_size, need in zip(sizes, shares[:, rank]):
            while have < need:
                chunk = next(chunks)
                pending.append(chunk)
                have += len(chunk[0])
            if need == 0:
                yield (np.zeros(0, np.int64), np.zeros((0, *self.input_shape), np.uint8),
                       np.zeros(0, np.int64), global_size)
                continue
            ids, x, y = (parts[0] if len(pending) == 1 else np.concatenate(parts)
                         for parts in zip(*pending))
            pending = [(ids[need:], x[need:], y[need:])] if have > need else []
            have -= need
            yield ids[:need], x[:need], y[:need], global_size

    def split_tail(self, count):
        if not 0 <= count <= len(self):
            raise ValueError(f"count must be in [0, {len(self)}], got {count}")
        cut = len(self) - count
        head, tail = [], []
        for shard, start in zip(self.shards, self.offsets):
            split = min(max(cut - int(start), 0), len(shard))
            if split:
                head.append(Shard(shard.path, shard.start, shard.start + split))
            if split < len(shard):
                tail.append(Shard(shard.path, shard.start + split, shard.stop))
        kw = dict(label_base=self.label_base, preprocess=self.preprocess)
        return (ShardedDataset(head, self.input_shape, self.num_classes, **kw),
                ShardedDataset(tail, self.input_shape, self.num_classes, **kw))

    def arrays(self):
        """Every shard loaded into memory at once: only for small sets and tests."""
        parts = [self._load(k) for k in range(len(self.shards))]
        x = np.concatenate([p[0] for p in parts]) if parts else np.zeros((0, *self.input_shape))
        y = np.concatenate([p[1] for p in parts]) if parts else np.zeros(0, np.int64)
        x = self.preprocess.standardize_(self.preprocess.scale(x, self.value_range))
        return x, self.preprocess.labels(y, self.num_classes)


def check_labels(path, y: np.ndarray, label_base: int, num_classes: int) -> None:
    if y.ndim != 1 or y.dtype.kind not in "iu":
        raise DatasetError(f"{path}: 'y' must be integer labels (N,), got {y.dtype} {y.shape}")
    if len(y) and (y.min() < label_base or y.max() >= num_classes + label_base):
        raise DatasetError(f"{path}: labels span [{y.min()}, {y.max()}], outside "
                           f"[{label_base}, {num_classes + label_base - 1}] for label_base="
                           f"{label_base} and num_classes={num_classes}; fix label_base or "
                           f"num_classes")


def resolve_label_base(labels: Sequence[np.ndarray], label_base, num_classes: int) -> int:
    if isinstance(label_base, (int, np.integer)) and label_base in (0, 1):
        return int(label_base)
    if label_base != "auto":
        raise ValueError(f"label_base must be 0, 1 or 'auto', got {label_base!r}")
    labels = [y for y in labels if len(y)]
    # 1-based (TF-slim's ImageNet, 0 = background) shows as labels 1..num_classes with no 0
    one_based = labels and min(y.min() for y in labels) >= 1 and max(
        y.max() for y in labels) == num_classes
    return 1 if one_based else 0


def read_imagenet(*, path=None, preprocess: Preprocess, seed: int = 0,
                  train_glob: str = "train/*.npz", val_glob: str = "val/*.npz",
                  label_base: int | str = "auto", num_classes: int = 1000) -> Splits:
    """ImageNet NPZ shards (see ``convert_imagenet_tfrecords``): ``val`` shards are the test split.

    Globs are relative to ``path`` (or the found ``imagenet`` folder); with the default
    globs a ``validation/`` folder (PyDTNN's name) serves as ``val/``. A folder holding the
    shards themselves (PyDTNN's --dataset_train_path / --dataset_test_path) is read as
    the training split, without a test split. ``label_base="auto"`` treats labels as
    1-based when none is 0 and the largest equals ``num_classes``.
    """
    def find(folder: Path) -> Path | None:
        return folder if glob.glob(str(folder / train_glob)) or glob.glob(
            str(folder / "*.npz")) else None

    how_to = ("Convert TFRecords with `distnn convert-imagenet` (distnn.data."
              "convert_imagenet_tfrecords) and pass path=<folder with train/ and val/>.")
    folder = fetch.locate("imagenet", ("imagenet",), path, find, None, how_to)
    train_files = [Path(f) for f in sorted(glob.glob(str(folder / train_glob)))]
    if val_glob == "val/*.npz" and not glob.glob(str(folder / val_glob)):
        val_glob = "validation/*.npz"
    test_files = [Path(f) for f in sorted(glob.glob(str(folder / val_glob)))]
    if not train_files:  # a folder of shards
        train_files = [Path(f) for f in sorted(glob.glob(str(folder / "*.npz")))]
    train, test = scan_shards(train_files), scan_shards(test_files)
    base = resolve_label_base([y for *_, y in train + test], label_base, num_classes)
    if test and test[0][2] != train[0][2]:
        raise DatasetError(f"{test[0][0]}: samples of shape {test[0][2]} but the train shards "
                           f"have {train[0][2]}; convert both splits at one image_size")
    train = ShardedDataset._from_scan(train, num_classes, base, preprocess)
    test = ShardedDataset._from_scan(test, num_classes, base, preprocess) if test else None
    return Splits(train, None, test)
