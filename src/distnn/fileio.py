"""Atomic file writes: readers never see a half-written file, and a failed write leaves
the previous file (a checkpoint, weights, a download) untouched."""
from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from typing import IO, Iterator


@contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "wb", *, fsync: bool = False,
                newline: str | None = None) -> Iterator[IO]:
    """Open a temporary file in ``path``'s folder (created if missing); when the block ends
    without an exception it is flushed (and fsync'ed if asked) and renamed over ``path``
    with ``os.replace``; on an exception it is removed and the exception propagates.

    Example:
        with atomic_open("weights.npz") as f:
            np.savez(f, **arrays)
    """
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.", suffix=".part")
    try:
        with os.fdopen(fd, mode, newline=newline) as f:
            yield f
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
