"""Readers of in-memory datasets: MNIST idx, CIFAR-10 binary, digits, synthetic (HDF5
lists: hdf5.py).

Every reader is ``reader(*, path, preprocess, seed, **options) -> Splits`` and checks what
it reads: a wrong magic number, a truncated file, a count mismatch or a label out of range
raise ``DatasetError`` naming the file. Images are kept as stored (uint8) and scaled per batch.
"""
from __future__ import annotations

import contextlib
import hashlib
import math
import os
import shutil
import struct
import tarfile
import tempfile
import zlib
from pathlib import Path

import numpy as np

from . import fetch
from .base import ArrayDataset, DatasetError, Preprocess, Splits, batch_file_splits

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


# A gzip file this large (compressed) is decompressed once and the result kept in
# ``~/.cache/distnn/decompressed``: every rank of every run read Fashion-MNIST's 26 MB of
# gzip again (0.5 s a process). The entry is named by the file's path, size, inode and
# modification time, so a changed file is read anew; the bytes still pass read_idx's checks.
# At most CACHE_ENTRIES entries are kept (the least recently read go first).
CACHE_MIN_BYTES = 1 << 20
CACHE_ENTRIES = 8


def _cache_entry(path: Path) -> Path | None:
    try:
        st = path.stat()
    except OSError:
        return None
    if st.st_size < CACHE_MIN_BYTES:
        return None
    key = f"{path.resolve()}:{st.st_size}:{st.st_ino}:{st.st_mtime_ns}".encode()
    name = f"{path.name.removesuffix('.gz')}-{hashlib.sha1(key).hexdigest()[:16]}"
    return fetch.cache_root() / "decompressed" / name


def _decompressed(path: Path) -> bytes:
    entry = _cache_entry(path)
    if entry is not None and entry.is_file():
        try:
            raw = entry.read_bytes()
            os.utime(entry)  # the oldest entries are dropped first
            return raw
        except OSError:
            pass
    try:
        raw = zlib.decompress(path.read_bytes(), wbits=31)
    except zlib.error as exc:
        raise DatasetError(f"{path}: cannot decompress ({exc}); the file is truncated or not "
                           f"gzip. Delete it and download it again") from exc
    if entry is not None:
        _keep(entry, raw)
    return raw


def _keep(entry: Path, raw: bytes) -> None:
    """Write a cache entry atomically (several ranks may write the same one at once); a
    read-only or full home only loses the saving."""
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=entry.parent)
    except OSError:
        return
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(raw)
        os.replace(tmp, entry)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        return
    # Bounded: copies of a data set in other folders (tests make them) add entries.
    with contextlib.suppress(OSError):
        entries = sorted(entry.parent.iterdir(), key=lambda p: p.stat().st_mtime)
        for old in entries[:-CACHE_ENTRIES]:
            old.unlink()


def _read_bytes(path: Path) -> bytes:
    if path.suffix != ".gz":
        return path.read_bytes()
    return _decompressed(path)


def read_idx(path: str | os.PathLike, ndim: int, ubyte: bool = False) -> np.ndarray:
    """Read an idx file (plain or ``.gz``) holding an ``ndim``-dimensional array (of
    unsigned bytes only, with ``ubyte``: MNIST's images and labels)."""
    path = Path(path)
    raw = _read_bytes(path)
    magic = int.from_bytes(raw[:4], "big") if len(raw) >= 4 else None
    if magic is None or raw[:2] != b"\0\0" or raw[2] not in IDX_DTYPES or raw[3] != ndim \
            or (ubyte and raw[2] != 0x08):
        shown = "missing" if magic is None else f"0x{magic:08x}"
        raise DatasetError(f"{path}: bad magic number {shown}, expected 0x0000080{ndim} "
                           f"(idx, {ndim}-d ubyte); it is not this idx file or it is corrupt. "
                           f"Delete it and download it again")
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DatasetError(f"{path}: truncated idx header ({len(raw)} bytes); download it again")
    dims = struct.unpack(f">{ndim}I", raw[4:header])
    dtype = np.dtype(IDX_DTYPES[raw[2]])
    need = math.prod(dims) * dtype.itemsize
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
        images = read_idx(images_path, 3, ubyte=True)
        labels = _check_labels(labels_path, read_idx(labels_path, 1, ubyte=True), 10,
                               len(images))
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
        root = Path(path).expanduser()
        files = _cifar_archive(root)
    else:
        root, files = fetch.locate("cifar10", ALIASES["cifar10"], path, _cifar_folder,
                                   _fetch_cifar if download else None, _how_to("cifar10")), None
    return batch_file_splits(read_cifar_bin, root, files, CIFAR_TRAIN, CIFAR_TEST, preprocess)


def digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """(images (1797, 8, 8) float64, targets) of scikit-learn's bundled digits, as its
    ``load_digits()`` gives them. Read from the file sklearn ships (datasets/data/
    digits.csv.gz, found without importing sklearn: importing ``sklearn.datasets`` costs
    about 1.5 s of CPU in every rank that loads the digits); sklearn's loader if the file
    is not where that version keeps it."""
    import importlib.util

    spec = importlib.util.find_spec("sklearn")
    if spec is None:
        raise DatasetError("the digits dataset comes with scikit-learn: "
                           "pip install scikit-learn")
    csv = Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz"
    if csv.is_file():
        data = np.loadtxt(csv, delimiter=",")
        return data[:, :-1].reshape(-1, 8, 8), data[:, -1].astype(int)
    from sklearn.datasets import load_digits

    digits = load_digits()
    return digits.images, digits.target


def read_digits(*, path=None, preprocess: Preprocess, seed: int = 0,
                test_fraction: float = 0.2) -> Splits:
    """scikit-learn's bundled 8x8 digits (1797 samples, offline) as (1, 8, 8), values 0..16.

    The samples are shuffled with ``seed`` and the last ``test_fraction`` is the test set.
    """
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    images, target = digits_arrays()
    order = np.random.default_rng(seed).permutation(len(target))
    x = images[order].astype(np.uint8)[:, None]
    y = target[order].astype(np.int64)
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
    need = (num_samples + test_samples + num_classes) * math.prod(shape) * dtype.itemsize
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if need > memory:  # numpy's own error would name neither option
        raise ValueError(f"synthetic: num_samples={num_samples} (+{test_samples} test) of "
                         f"input_shape={shape} with num_classes={num_classes} need "
                         f"{need / 2**30:.3g} GiB, more than this machine's "
                         f"{memory / 2**30:.3g} GiB; choose smaller values")
    means = np.random.default_rng([seed, 0]).standard_normal((num_classes, *shape), dtype=dtype)

    def make(stream: int, n: int) -> ArrayDataset:
        rng = np.random.default_rng([seed, stream])
        y = rng.integers(0, num_classes, n)
        x = rng.standard_normal((n, *shape), dtype=dtype)
        x *= dtype.type(noise)
        x += means[y]
        return ArrayDataset(x, y, num_classes, preprocess=preprocess)

    return Splits(make(1, num_samples), None, make(2, test_samples) if test_samples else None)
