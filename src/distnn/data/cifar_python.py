"""CIFAR-10's Python version, the format Needle, torchvision and Keras read:
``cifar-10-python.tar.gz`` holding ``cifar-10-batches-py/`` with pickled batches
``data_batch_1`` .. ``data_batch_5`` and ``test_batch``. Each is a dict with ``b'data'``, a
uint8 (N, 3072) array (1024 red, then 1024 green, then 1024 blue values per row, row-major
32x32), and ``b'labels'``, a list of N ints in [0, 10).

A pickle can run code when it is loaded. These files are read with an unpickler that admits
only what a CIFAR batch holds (dicts, lists, strings, NumPy arrays and dtypes): a file that
names anything else is refused with ``DatasetError`` instead of being executed.
"""
from __future__ import annotations

import io
import os
import pickle
import shutil
import tarfile
import tempfile
import zlib
from pathlib import Path

import numpy as np

from . import fetch
from .base import DatasetError, Preprocess, Splits, batch_file_splits

FOLDER = "cifar-10-batches-py"
TRAIN = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST = "test_batch"
# The published MD5 sum (the CIFAR-10 page), as for the binary version (readers.REMOTES).
REMOTES = [fetch.Remote("https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
                        ("md5", "c58f30108f718f92721af3b95e74349a"))]
ALIASES = ("cifar10_python", "cifar10", "cifar-10")
HOW_TO = (f"Put {FOLDER}/ (from cifar-10-python.tar.gz) in one of these folders, set "
          f"${fetch.ENV_VAR} to a folder holding cifar10_python/, or pass path=<folder>.")
_ALLOWED = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
            ("numpy", "ndarray"), ("numpy", "dtype"), ("numpy.core.numeric", "_frombuffer"),
            ("numpy._core.numeric", "_frombuffer"),
            ("_codecs", "encode")}  # bytes in protocol-2 pickles written by Python 3


class _BatchUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"it refers to {module}.{name}, which a CIFAR-10 batch "
                                     "never holds")


def read_cifar_pickle(path: str | os.PathLike,
                      data: bytes | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Read one pickled CIFAR-10 batch: (N, 3, 32, 32) uint8 images and int64 labels
    (from ``data`` when given, ``path`` then only names it)."""
    path = Path(path)
    raw = data if data is not None else path.read_bytes()
    try:
        batch = _BatchUnpickler(io.BytesIO(raw), encoding="latin1").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as exc:
        # the error may quote the file's bytes: printable escapes keep the message one line
        reason = "".join(c if c.isprintable() else ascii(c)[1:-1] for c in str(exc)[:200])
        raise DatasetError(f"{path}: not a pickled CIFAR-10 batch ({reason}); the file is "
                           "truncated or of another kind. Download cifar-10-python.tar.gz "
                           "again") from exc
    if not isinstance(batch, dict):
        raise DatasetError(f"{path}: holds a {type(batch).__name__}, expected the dict of a "
                           "CIFAR-10 batch (b'data', b'labels')")
    batch = {k.decode("latin1") if isinstance(k, bytes) else k: v for k, v in batch.items()}
    missing = [k for k in ("data", "labels") if k not in batch]
    if missing:
        raise DatasetError(f"{path}: the batch has no {missing} entry (keys: "
                           f"{sorted(map(str, batch))}); it is not a CIFAR-10 batch (CIFAR-100 "
                           "has 'fine_labels')")
    x = np.asarray(batch["data"])
    if x.dtype != np.uint8 or x.ndim != 2 or x.shape[1] != 3 * 32 * 32:
        raise DatasetError(f"{path}: b'data' is {x.dtype} {x.shape}, expected uint8 (N, 3072) "
                           "rows of 32x32 RGB images; the file is corrupt")
    labels = np.asarray(batch["labels"])
    if labels.ndim != 1 or len(labels) != len(x) or labels.dtype.kind not in "iu":
        raise DatasetError(f"{path}: b'labels' holds {labels.dtype} {labels.shape} for "
                           f"{len(x)} images, expected one integer per image; the file is "
                           "corrupt")
    if len(labels) and (labels.min() < 0 or labels.max() >= 10):
        bad = int(labels.max() if labels.max() >= 10 else labels.min())
        raise DatasetError(f"{path}: label {bad} out of range [0, 10); the file is corrupt "
                           "or of another dataset")
    return np.ascontiguousarray(x).reshape(-1, 3, 32, 32), labels.astype(np.int64)


def _folder(folder: Path) -> Path | None:
    for candidate in (folder, folder / FOLDER):
        if all((candidate / f).is_file() for f in TRAIN + (TEST,)):
            return candidate
    return None


def _members(tar: tarfile.TarFile, archive: Path) -> dict[str, tarfile.TarInfo]:
    wanted = {f"{FOLDER}/{f}" for f in TRAIN + (TEST,)}
    members = {m.name: m for m in tar.getmembers() if m.name in wanted and m.isfile()}
    if len(members) != len(wanted):
        raise DatasetError(f"{archive}: missing members {sorted(wanted - set(members))}; it "
                           "is not cifar-10-python.tar.gz or it is truncated")
    return members


def _fetch(folder: Path) -> None:
    remote = REMOTES[0]
    archive = fetch.download(remote, folder / remote.filename)
    staging = Path(tempfile.mkdtemp(dir=folder, prefix=".extract."))
    try:
        with tarfile.open(archive) as tar:
            tar.extractall(staging, members=list(_members(tar, archive).values()),
                           filter="data")
        os.replace(staging / FOLDER, folder / FOLDER)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    archive.unlink()


def _archive(archive: Path) -> dict[str, bytes]:
    try:
        with tarfile.open(archive) as tar:
            return {name.rsplit("/", 1)[1]: tar.extractfile(m).read()
                    for name, m in _members(tar, archive).items()}
    except (tarfile.TarError, EOFError, zlib.error, OSError) as exc:
        raise DatasetError(f"{archive}: cannot read the archive ({exc}); download "
                           "cifar-10-python.tar.gz again") from exc


def is_python_version(path: str | os.PathLike) -> bool:
    """Whether ``path`` (a folder, or an archive) holds CIFAR-10's Python version."""
    path = Path(path).expanduser()
    if path.is_dir():
        return _folder(path) is not None
    if not path.is_file() or not tarfile.is_tarfile(path):
        return False
    with tarfile.open(path) as tar:  # the first member names the folder: cheap to read
        first = tar.next()
    return first is not None and first.name.split("/", 1)[0] == FOLDER


def read_cifar10_python(*, path=None, preprocess: Preprocess, seed: int = 0,
                        download: bool = True) -> Splits:
    """CIFAR-10 Python version: 50000 train / 10000 test, (3, 32, 32). ``path`` is the
    ``cifar-10-batches-py`` folder, a folder holding it, or ``cifar-10-python.tar.gz``."""
    if path is not None and Path(path).expanduser().is_file():
        root = Path(path).expanduser()
        files = _archive(root)
    else:
        root, files = fetch.locate("cifar10_python", ALIASES, path, _folder,
                                   _fetch if download else None, HOW_TO), None
    return batch_file_splits(read_cifar_pickle, root, files, TRAIN, TEST, preprocess)
