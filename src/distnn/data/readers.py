"""Readers of in-memory datasets: MNIST idx, CIFAR-10 binary, HDF5 lists, digits, synthetic.

Every reader is ``reader(*, path, preprocess, seed, **options) -> Splits`` and checks what
it reads: a wrong magic number, a truncated file, a count mismatch or a label out of range
raise ``DatasetError`` naming the file. Images are kept as stored (uint8) and scaled per batch.
"""
from __future__ import annotations

import os
import shutil
import struct
import tarfile
import tempfile
import zlib
from pathlib import Path

import numpy as np

from . import fetch
from .base import ArrayDataset, DatasetError, Preprocess, Splits, local_range
from .partition import PartDataset

# Published MD5 sums (the Fashion-MNIST README and torchvision for the idx files, the
# CIFAR-10 page for its archive). No SHA-256 is published for these files, and Debian's
# Fashion-MNIST copies were re-gzipped without the file name (24 bytes shorter than the
# mirror's), so their SHA-256 would reject a genuine download.
MNIST_URL = "https://ossci-datasets.s3.amazonaws.com/mnist/"
FASHION_MNIST_URL = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"
IDX_MD5 = {
    "mnist": {
        "train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
        "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
        "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
        "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
    },
    "fashion_mnist": {
        "train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
        "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
        "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
        "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310",
    },
}
REMOTES: dict[str, list[fetch.Remote]] = {
    "mnist": [fetch.Remote(MNIST_URL + f, ("md5", s)) for f, s in IDX_MD5["mnist"].items()],
    "fashion_mnist": [fetch.Remote(FASHION_MNIST_URL + f, ("md5", s))
                      for f, s in IDX_MD5["fashion_mnist"].items()],
    "cifar10": [fetch.Remote("https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz",
                             ("md5", "c32a1d4ab5d03f1284b67883e8d87530"))],
}
ALIASES = {"mnist": ("mnist",), "fashion_mnist": ("fashion_mnist", "fashion-mnist"),
           "cifar10": ("cifar10", "cifar-10")}

IDX_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
             "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4",
              0x0E: ">f8"}
CIFAR_TRAIN = tuple(f"data_batch_{i}.bin" for i in range(1, 6))
CIFAR_TEST = "test_batch.bin"
CIFAR_RECORD = 1 + 3 * 32 * 32


def _how_to(name: str) -> str:
    extra = ("Install Debian's copy with `apt-get install dataset-fashion-mnist`, or put "
             if name == "fashion_mnist" else "Put ")
    return (f"{extra}the files in one of these folders, set ${fetch.ENV_VAR} to a folder holding "
            f"{name}/, or pass path=<folder>.")


def _read_bytes(path: Path) -> bytes:
    raw = path.read_bytes()
    if path.suffix != ".gz":
        return raw
    try:
        return zlib.decompress(raw, wbits=31)
    except zlib.error as exc:
        raise DatasetError(f"{path}: cannot decompress ({exc}); the file is truncated or not "
                           f"gzip. Delete it and download it again") from exc


def read_idx(path: str | os.PathLike, ndim: int) -> np.ndarray:
    """Read an idx file (plain or ``.gz``) holding an ``ndim``-dimensional array."""
    path = Path(path)
    raw = _read_bytes(path)
    magic = int.from_bytes(raw[:4], "big") if len(raw) >= 4 else None
    if magic is None or raw[:2] != b"\0\0" or raw[2] not in IDX_DTYPES or raw[3] != ndim:
        shown = "missing" if magic is None else f"0x{magic:08x}"
        raise DatasetError(f"{path}: bad magic number {shown}, expected 0x0000080{ndim} "
                           f"(idx, {ndim}-d ubyte); it is not this idx file or it is corrupt. "
                           f"Delete it and download it again")
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DatasetError(f"{path}: truncated idx header ({len(raw)} bytes); download it again")
    dims = struct.unpack(f">{ndim}I", raw[4:header])
    dtype = np.dtype(IDX_DTYPES[raw[2]])
    need = int(np.prod(dims)) * dtype.itemsize
    if len(raw) - header != need:
        problem = "truncated" if len(raw) - header < need else "has trailing bytes"
        raise DatasetError(f"{path}: {problem}: the header announces shape {dims} "
                           f"({need} data bytes) but the file has {len(raw) - header}; "
                           f"delete it and download it again")
    return np.frombuffer(raw, dtype, offset=header).reshape(dims)


def _check_labels(path: Path, labels: np.ndarray, num_classes: int, count: int) -> np.ndarray:
    if len(labels) != count:
        raise DatasetError(f"{path}: {len(labels)} labels for {count} images; the image and "
                           f"label files belong to different sets. Get a matching pair")
    if len(labels) and (labels.min() < 0 or labels.max() >= num_classes):
        bad = int(labels.max() if labels.max() >= num_classes else labels.min())
        raise DatasetError(f"{path}: label {bad} out of range [0, {num_classes}); the file is "
                           f"corrupt or of another dataset")
    return labels.astype(np.int64)


def _idx_file(folder: Path, base: str) -> Path | None:
    for candidate in (folder / base, folder / f"{base}.gz"):
        if candidate.is_file():
            return candidate
    return None


def _read_idx_dataset(name: str, path, preprocess: Preprocess, download: bool) -> Splits:
    def find(folder):
        return folder if all(_idx_file(folder, b) for b in IDX_FILES) else None

    def fetch_all(folder):
        for remote in REMOTES[name]:
            if _idx_file(folder, remote.filename.removesuffix(".gz")) is None:
                fetch.download(remote, folder / remote.filename)

    folder = fetch.locate(name, ALIASES[name], path, find, fetch_all if download else None,
                          _how_to(name))
    splits = []
    for prefix in ("train", "t10k"):
        images_path = _idx_file(folder, f"{prefix}-images-idx3-ubyte")
        labels_path = _idx_file(folder, f"{prefix}-labels-idx1-ubyte")
        images = read_idx(images_path, 3)
        labels = _check_labels(labels_path, read_idx(labels_path, 1), 10, len(images))
        splits.append(ArrayDataset(images[:, None], labels, 10, preprocess=preprocess))
    return Splits(splits[0], None, splits[1])


def read_mnist(*, path=None, preprocess: Preprocess, seed: int = 0,
               download: bool = True) -> Splits:
    """MNIST idx files (plain or .gz): 60000 train / 10000 test, (1, 28, 28)."""
    return _read_idx_dataset("mnist", path, preprocess, download)


def read_fashion_mnist(*, path=None, preprocess: Preprocess, seed: int = 0,
                       download: bool = True) -> Splits:
    """Fashion-MNIST idx files (plain or .gz): 60000 train / 10000 test, (1, 28, 28)."""
    return _read_idx_dataset("fashion_mnist", path, preprocess, download)


def read_cifar_bin(path: str | os.PathLike,
                   data: bytes | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Read one CIFAR-10 binary batch: (N, 3, 32, 32) uint8 images and int64 labels
    (from ``data`` when given, ``path`` then only names it)."""
    path = Path(path)
    raw = (np.frombuffer(data, dtype=np.uint8) if data is not None
           else np.fromfile(path, dtype=np.uint8))
    if raw.size % CIFAR_RECORD:
        raise DatasetError(f"{path}: {raw.size} bytes is not a whole number of "
                           f"{CIFAR_RECORD}-byte records; the file is truncated. "
                           f"Download cifar-10-binary.tar.gz again")
    records = raw.reshape(-1, CIFAR_RECORD)
    labels = _check_labels(path, records[:, 0], 10, len(records))
    return np.ascontiguousarray(records[:, 1:]).reshape(-1, 3, 32, 32), labels


def _cifar_folder(folder: Path) -> Path | None:
    for candidate in (folder, folder / "cifar-10-batches-bin"):
        if all((candidate / f).is_file() for f in CIFAR_TRAIN + (CIFAR_TEST,)):
            return candidate
    return None


def _fetch_cifar(folder: Path) -> None:
    remote = REMOTES["cifar10"][0]
    archive = fetch.download(remote, folder / remote.filename)
    wanted = {f"cifar-10-batches-bin/{f}" for f in CIFAR_TRAIN + (CIFAR_TEST,)}
    staging = Path(tempfile.mkdtemp(dir=folder, prefix=".extract."))
    try:
        with tarfile.open(archive) as tar:
            members = [m for m in tar.getmembers() if m.name in wanted and m.isfile()]
            if len(members) != len(wanted):
                raise DatasetError(f"{archive}: missing members "
                                   f"{sorted(wanted - {m.name for m in members})}")
            tar.extractall(staging, members=members, filter="data")
        os.replace(staging / "cifar-10-batches-bin", folder / "cifar-10-batches-bin")
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    archive.unlink()


def _cifar_archive(archive: Path) -> dict[str, bytes]:
    """The batch files inside cifar-10-binary.tar.gz (PyDTNN's --dataset_path), read in memory."""
    wanted = {f"cifar-10-batches-bin/{f}" for f in CIFAR_TRAIN + (CIFAR_TEST,)}
    try:
        with tarfile.open(archive) as tar:
            members = {m.name: m for m in tar.getmembers() if m.name in wanted and m.isfile()}
            if len(members) != len(wanted):
                raise DatasetError(f"{archive}: missing members "
                                   f"{sorted(wanted - set(members))}; it is not "
                                   "cifar-10-binary.tar.gz or it is truncated")
            return {name.rsplit("/", 1)[1]: tar.extractfile(m).read()
                    for name, m in members.items()}
    except (tarfile.TarError, EOFError, zlib.error, OSError) as exc:
        raise DatasetError(f"{archive}: cannot read the archive ({exc}); download "
                           "cifar-10-binary.tar.gz again") from exc


def read_cifar10(*, path=None, preprocess: Preprocess, seed: int = 0,
                 download: bool = True) -> Splits:
    """CIFAR-10 binary version: 50000 train / 10000 test, (3, 32, 32). ``path`` may also be
    the ``cifar-10-binary.tar.gz`` archive itself; a ``path`` holding the Python version
    (``cifar-10-batches-py``, ``cifar-10-python.tar.gz``) is read as that (cifar_python.py)."""
    from .cifar_python import is_python_version, read_cifar10_python
    if path is not None and is_python_version(path):
        return read_cifar10_python(path=path, preprocess=preprocess, download=False)
    if path is not None and Path(path).expanduser().is_file():
        archive = Path(path).expanduser()
        files = _cifar_archive(archive)
        parts = [read_cifar_bin(archive / f, files[f]) for f in CIFAR_TRAIN]
        x_test, y_test = read_cifar_bin(archive / CIFAR_TEST, files[CIFAR_TEST])
    else:
        folder = fetch.locate("cifar10", ALIASES["cifar10"], path, _cifar_folder,
                              _fetch_cifar if download else None, _how_to("cifar10"))
        parts = [read_cifar_bin(folder / f) for f in CIFAR_TRAIN]
        x_test, y_test = read_cifar_bin(folder / CIFAR_TEST)
    train = ArrayDataset(np.concatenate([p[0] for p in parts]),
                         np.concatenate([p[1] for p in parts]), 10, preprocess=preprocess)
    return Splits(train, None, ArrayDataset(x_test, y_test, 10, preprocess=preprocess))


def _h5_files(list_file: Path | tuple[Path, ...]) -> list[Path]:
    if isinstance(list_file, tuple):  # the files themselves (a model file's get_train())
        if not list_file:
            raise DatasetError("the list of HDF5 files is empty; give at least one file")
        return list(list_file)
    if not list_file.is_file():
        raise DatasetError(f"file list {list_file} does not exist; give train_list/val_list/"
                           f"test_list as a text file of HDF5 paths, one per line")
    files = [line.strip() for line in list_file.read_text().splitlines()]
    files = [list_file.parent / f for f in files if f and not f.startswith("#")]
    if not files:
        raise DatasetError(f"{list_file}: lists no HDF5 files")
    return files


def _h5_open(file: Path, list_file: Path, features_name: str, labels_name: str):
    import h5py

    try:
        h5 = h5py.File(file, "r")
    except OSError as exc:
        raise DatasetError(f"{file} (listed in {list_file}): cannot open as HDF5: "
                           f"{exc}") from exc
    for key in (features_name, labels_name):
        if key not in h5:
            keys = sorted(h5.keys())
            h5.close()
            raise DatasetError(f"{file}: no dataset {key!r}; it has {keys}. "
                               f"Pass features_name=/labels_name= to match")
    n_x, n_y = len(h5[features_name]), len(h5[labels_name])
    if n_x != n_y:
        h5.close()
        raise DatasetError(f"{file}: {n_x} samples in {features_name!r} but {n_y} "
                           f"labels in {labels_name!r}")
    return h5


def _h5_rows(file: Path, list_file: Path, features_name: str, labels_name: str,
             part: tuple[int | None, int] | None, layout: str = "nchw"):
    """(x, integer labels, one-hot width or None) of one file: all rows, or only rows
    ``np.array_split``-share ``part = (rank, size)`` of them (only those rows are read;
    none for rank None: the shapes only)."""
    with _h5_open(file, list_file, features_name, labels_name) as h5:
        lo, hi = 0, len(h5[labels_name])
        if part is not None:
            lo, hi = (0, 0) if part[0] is None else local_range(hi, *part)
        x, y = h5[features_name][lo:hi], h5[labels_name][lo:hi]
    if layout != "nhwc" and x.ndim == 4 and x.shape[-1] in (1, 3) and x.shape[1] not in (1, 3):
        # channels-last images (Keras' default, as NNLO's GetData writes them) -> NCHW
        x = np.ascontiguousarray(x.transpose(0, 3, 1, 2))
    elif layout == "nhwc" and x.ndim == 4 and x.shape[1] in (1, 3) \
            and x.shape[-1] not in (1, 3):  # channels-first images for an NHWC model
        x = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    width = None
    if y.ndim == 2:
        if not (np.all((y == 0) | (y == 1)) and np.all(y.sum(axis=1) == 1)):
            raise DatasetError(f"{file}: 2-d labels {labels_name!r} are not one-hot rows")
        width = y.shape[1]
        y = y.argmax(axis=1)
    elif y.ndim != 1 or (y.dtype.kind == "f" and np.any(y != np.round(y))):
        raise DatasetError(f"{file}: labels {labels_name!r} must be integers (N,) or "
                           f"one-hot (N, C), got {y.dtype} {y.shape}")
    y = y.astype(np.int64)
    if len(y) and y.min() < 0:
        raise DatasetError(f"{file}: label {int(y.min())} is negative")
    return x, y, width


def _read_h5_list(list_file: Path, features_name: str, labels_name: str,
                  rank: int | None = 0, size: int = 1, layout: str = "nchw"):
    """[(file, x, labels, one-hot width)] of part ``rank`` of ``size`` of the listed files:
    every file for one part; with several, whole files round-robin when there are at least
    as many files as parts, else this part's rows of every file; rank None: no rows (of
    the first file, for the shapes)."""
    files = _h5_files(list_file)
    if rank is None:
        chosen, part = files[:1], (None, size)
    elif size == 1:
        chosen, part = files, None
    elif len(files) >= size:
        chosen, part = files[rank::size], None
    else:
        chosen, part = files, (rank, size)
    where = "the list of files given" if isinstance(list_file, tuple) else list_file
    return [(f, *_h5_rows(f, where, features_name, labels_name, part, layout))
            for f in chosen]


def read_hdf5(*, path=None, preprocess: Preprocess, seed: int = 0, train_list=None,
              val_list=None, test_list=None, features_name: str = "features",
              labels_name: str = "labels", num_classes: int | None = None, rank: int = 0,
              size: int = 1, train_part: tuple[int | None, int] | None = None,
              data_layout: str = "auto") -> Splits:
    """NNLO-style HDF5: text files listing HDF5 paths (relative to the list or absolute).

    ``path`` is the train list file, or a folder that relative list names are resolved in.
    Images stored channels-last (N, H, W, 1|3), as Keras writes them, are read as NCHW
    (``data_layout`` "auto" or "nchw"); with "nhwc" they are kept so (and channels-first
    ones transposed to NHWC), for a model written for NHWC input.
    With ``size`` > 1 only the part of rank ``rank`` is read (whole files when the list has
    at least ``size`` of them, else its rows of each) into ``PartDataset``s, which the
    caller completes with the other parts' sizes (``PartDataset.set_parts``).
    ``train_part``: (part, parts) of the training files this rank reads when they are
    split otherwise than over the ``size`` ranks (the workers of a parameter-server rule
    share them; the master, part None, reads none).
    """
    base = Path(path).expanduser() if path is not None else Path.cwd()
    if base.is_file():
        if train_list is not None:
            raise ValueError(f"path={str(path)!r} is a file and train_list={train_list!r} is "
                             f"given too; pass the train list as one of them only")
        train_list, base = base.name, base.parent
    if train_list is None:
        raise ValueError("hdf5 needs train_list=<text file of HDF5 paths> (or path=<that file>)")
    if not 0 <= rank < size:
        raise ValueError(f"rank must be in [0, size={size}), got {rank}")
    lists = {"train": train_list, "val": val_list, "test": test_list}
    lists = {k: (tuple(base / Path(f).expanduser() for f in v)
                 if isinstance(v, (list, tuple)) else v) for k, v in lists.items()}
    parts_of = {"train": train_part or (rank, size)}
    if data_layout not in ("auto", "nchw", "nhwc"):
        raise ValueError(f"data_layout must be auto, nchw or nhwc, got {data_layout!r}")
    loaded = {k: _read_h5_list(v if isinstance(v, tuple) else base / v, features_name,
                               labels_name, *parts_of.get(k, (rank, size)), data_layout)
              for k, v in lists.items() if v is not None}
    widths = {w for parts in loaded.values() for *_, w in parts if w is not None}
    if num_classes is None and widths:
        num_classes = max(widths)
    out = {}
    for split, parts in loaded.items():
        x = np.concatenate([x for _, x, _, _ in parts])
        y = np.concatenate([y for _, _, y, _ in parts])
        if size > 1:
            part, n_parts = parts_of.get(split, (rank, size))
            out[split] = PartDataset(x, y, num_classes, rank=part, size=n_parts,
                                     preprocess=preprocess)
            continue
        top = num_classes
        if top is None:
            top = max((int(y.max()) + 1 for p in loaded.values() for _, _, y, _ in p
                       if len(y)), default=0)
        for file, _, labels, _ in parts:
            _check_labels(file, labels, top, len(labels))
        out[split] = ArrayDataset(x, y, top, preprocess=preprocess)
    return Splits(out["train"], out.get("val"), out.get("test"))


def read_digits(*, path=None, preprocess: Preprocess, seed: int = 0,
                test_fraction: float = 0.2) -> Splits:
    """scikit-learn's bundled 8x8 digits (1797 samples, offline) as (1, 8, 8), values 0..16.

    The samples are shuffled with ``seed`` and the last ``test_fraction`` is the test set.
    """
    from sklearn.datasets import load_digits

    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    digits = load_digits()
    order = np.random.default_rng(seed).permutation(len(digits.target))
    x = digits.images[order].astype(np.uint8)[:, None]
    y = digits.target[order].astype(np.int64)
    cut = len(y) - int(round(len(y) * test_fraction))
    kw = dict(value_range=16, preprocess=preprocess)
    return Splits(ArrayDataset(x[:cut], y[:cut], 10, **kw), None,
                  ArrayDataset(x[cut:], y[cut:], 10, **kw))


def read_synthetic(*, path=None, preprocess: Preprocess, seed: int = 0,
                   input_shape=(1, 28, 28), num_classes: int = 10, num_samples: int = 1024,
                   test_samples: int | None = None, noise: float = 1.0) -> Splits:
    """Gaussian classes around random class means: learnable, any shape, for benchmarks.

    Sample = mean[label] + noise * N(0, 1); means are N(0, 1) per feature, drawn from ``seed``.
    """
    shape = tuple(int(s) for s in input_shape)
    if not shape or min(shape) < 1 or num_classes < 1 or num_samples < 1:
        raise ValueError(f"synthetic needs positive input_shape, num_classes, num_samples; "
                         f"got {shape}, {num_classes}, {num_samples}")
    test_samples = num_samples // 4 if test_samples is None else test_samples
    dtype = preprocess.dtype
    means = np.random.default_rng([seed, 0]).standard_normal((num_classes, *shape), dtype=dtype)

    def make(stream: int, n: int) -> ArrayDataset:
        rng = np.random.default_rng([seed, stream])
        y = rng.integers(0, num_classes, n)
        x = rng.standard_normal((n, *shape), dtype=dtype)
        x *= dtype.type(noise)
        x += means[y]
        return ArrayDataset(x, y, num_classes, preprocess=preprocess)

    return Splits(make(1, num_samples), None, make(2, test_samples) if test_samples else None)
