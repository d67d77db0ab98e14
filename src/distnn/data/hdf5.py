"""Reader of NNLO's HDF5 file lists: a text file naming one HDF5 file per line (or the
files themselves), each holding a features and a labels dataset; a rank of a sharded job
opens only the files of its own part.

Like every reader (readers.py) it checks what it reads and raises ``DatasetError`` naming
the file.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .base import ArrayDataset, DatasetError, Preprocess, Splits, local_range
from .partition import PartDataset
from .readers import _check_labels

MAX_CLASSES = 1 << 20  # inferred from the largest label: beyond, the labels are corrupt

def _h5_files(list_file: Path | tuple[Path, ...]) -> list[Path]:
    if isinstance(list_file, tuple):  # the files themselves (a model file's get_train())
        if not list_file:
            raise DatasetError("the list of HDF5 files is empty; give at least one file")
        return list(list_file)
    if not list_file.is_file():
        raise DatasetError(f"file list {list_file} does not exist; give train_list/val_list/"
                           f"test_list as a text file of HDF5 paths, one per line")
    try:
        text = list_file.read_text()
    except UnicodeDecodeError:
        raise DatasetError(f"{list_file}: not a text file; give train_list/val_list/"
                           "test_list as a text file of HDF5 paths, one per line") from None
    files = [line.strip() for line in text.splitlines()]
    files = [list_file.parent / f for f in files if f and not f.startswith("#")]
    if not files:
        raise DatasetError(f"{list_file}: lists no HDF5 files")
    return files


def _h5_open(file: Path, list_file: Path, features_name: str, labels_name: str):
    import h5py

    if not file.is_file():
        what = "a folder" if file.is_dir() else "missing"
        raise DatasetError(f"{file} (listed in {list_file}) is {what}; list HDF5 files, "
                           "one per line")
    try:
        h5 = h5py.File(file, "r")
    except OSError as exc:
        reason = " ".join(str(exc).split())[:160]  # h5py's message spans lines
        raise DatasetError(f"{file} (listed in {list_file}): cannot open as HDF5: "
                           f"{reason}") from None
    for key in (features_name, labels_name):
        if key not in h5 or not isinstance(h5[key], h5py.Dataset) or not h5[key].shape:
            keys = sorted(h5.keys())
            h5.close()
            what = "" if key not in keys else " of samples (one row per sample)"
            raise DatasetError(f"{file}: no dataset {key!r}{what}; it has {keys}. "
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
    if x.ndim < 2 or x.dtype.kind not in "biuf":
        raise DatasetError(f"{file}: features {features_name!r} are {x.dtype} {x.shape}; "
                           "they must be real numbers, one row or image per sample (N, ...)")
    if x.dtype.kind == "f" and not np.all(np.isfinite(x)):
        raise DatasetError(f"{file}: features {features_name!r} hold NaN or inf; the file "
                           "is corrupt")
    if y.dtype.kind not in "biuf":
        raise DatasetError(f"{file}: labels {labels_name!r} are {y.dtype}; they must be "
                           "integers (N,) or one-hot (N, C)")
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
    return [(f, *_h5_rows_checked(f, where, features_name, labels_name, part, layout))
            for f in chosen]


def _h5_rows_checked(file: Path, *args):
    """``_h5_rows``, where h5py's errors on a corrupt file (KeyError, OSError... raised
    when an object header or a chunk cannot be read) name the file."""
    try:
        return _h5_rows(file, *args)
    except DatasetError:
        raise
    except (KeyError, OSError, RuntimeError, ValueError, TypeError) as exc:
        reason = " ".join(str(exc).split())[:160]
        raise DatasetError(f"{file}: cannot read it as HDF5 ({reason}); the file is "
                           "corrupt") from None


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
            if top > MAX_CLASSES:  # labels that large are a corrupt file, not classes
                file = next(f for p in loaded.values() for f, _, y, _ in p
                            if len(y) and int(y.max()) == top - 1)
                raise DatasetError(f"{file}: label {top - 1} would make {top} classes; the "
                                   "labels are corrupt, or pass num_classes")
        for file, _, labels, _ in parts:
            _check_labels(file, labels, top, len(labels))
        out[split] = ArrayDataset(x, y, top, preprocess=preprocess)
    return Splits(out["train"], out.get("val"), out.get("test"))
