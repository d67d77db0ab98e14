"""Finding dataset folders on disk, and downloading them with checksum verification.

Without an explicit ``path``, a dataset ``name`` is looked for in ``$DISTNN_DATA/<name>``,
``~/.cache/distnn/<name>`` and ``/usr/share/datasets/<name>`` (each under every alias,
e.g. ``fashion_mnist`` and Debian's ``fashion-mnist``), and downloaded into
``$DISTNN_DATA/<name>`` (or ``~/.cache/distnn/<name>`` when unset) when found nowhere.
An explicit ``path`` is the only place looked at: a typo must not silently load a
different copy; missing files are downloaded into it.
"""
from __future__ import annotations

import hashlib
import os
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from ..fileio import atomic_open
from .base import DatasetError

SYSTEM_ROOT = Path("/usr/share/datasets")
ENV_VAR = "DISTNN_DATA"
CHUNK = 1 << 20


@dataclass(frozen=True)
class Remote:
    """A file to download: its URL and the checksum the publisher gives for it.

    Attributes:
        url: http(s) or file URL.
        checksum: ``(algorithm, hexdigest)`` for ``hashlib.new``, e.g. ``("sha256", "...")``;
            None only where no published checksum is known (then the reader's format
            checks are all that guards the file).
    """

    url: str
    checksum: tuple[str, str] | None

    @property
    def filename(self) -> str:
        return self.url.rstrip("/").rsplit("/", 1)[-1]


def cache_root() -> Path:
    return Path.home() / ".cache" / "distnn"


def search_folders(aliases: Sequence[str]) -> list[Path]:
    """Candidate folders for a dataset, in search order."""
    roots = []
    if os.environ.get(ENV_VAR):
        roots.append(Path(os.environ[ENV_VAR]).expanduser())
    roots += [cache_root(), SYSTEM_ROOT]
    return [root / alias for root in roots for alias in aliases]


def download_folder(name: str) -> Path:
    root = os.environ.get(ENV_VAR)
    return (Path(root).expanduser() if root else cache_root()) / name


def locate(name: str, aliases: Sequence[str], path: str | os.PathLike | None,
           find: Callable[[Path], Path | None],
           fetch: Callable[[Path], None] | None, how_to: str) -> Path:
    """Return the folder holding dataset ``name``'s files, downloading them if needed.

    Args:
        find: folder -> the folder to read (it may be a subfolder), or None if incomplete.
        fetch: downloads the files into a folder (raises ``DatasetError``); None disables it.
        how_to: how a user gets the data by hand, quoted when everything fails.
    """
    folders = [Path(path).expanduser()] if path is not None else search_folders(aliases)
    for folder in folders:
        found = find(folder) if folder.is_dir() else None
        if found is not None:
            return found
    looked = ", ".join(str(f) for f in folders)  # one line: the command prints one
    if fetch is None:
        raise DatasetError(f"dataset {name!r} not found; looked in: {looked}. "
                           f"Automatic download is disabled. {how_to}")
    target = folders[0] if path is not None else download_folder(name)
    try:
        fetch(target)
    except (OSError, urllib.error.URLError, DatasetError) as exc:
        raise DatasetError(f"dataset {name!r} not found; looked in: {looked}; and "
                           f"downloading into {target} failed: {exc}. {how_to}") from exc
    found = find(target)
    if found is None:
        raise DatasetError(f"downloaded dataset {name!r} into {target} but its files are still "
                           f"incomplete; delete {target} and retry. {how_to}")
    return found


def download(remote: Remote, dest: str | os.PathLike, *, timeout: float = 60.0) -> Path:
    """Fetch ``remote`` to ``dest``: stream to a temp file beside it, verify, rename atomically.

    Raises ``DatasetError`` on a checksum mismatch (the temp file is removed, ``dest`` is
    left untouched) and lets network errors (``URLError``/``OSError``) through.
    """
    dest = Path(dest)
    digest = hashlib.new(remote.checksum[0], usedforsecurity=False) if remote.checksum else None
    with atomic_open(dest) as out, urllib.request.urlopen(remote.url,
                                                          timeout=timeout) as response:
        while chunk := response.read(CHUNK):
            out.write(chunk)
            if digest is not None:
                digest.update(chunk)
        if digest is not None and digest.hexdigest() != remote.checksum[1].lower():
            raise DatasetError(
                f"{remote.url}: {remote.checksum[0]} of the download is {digest.hexdigest()}, "
                f"expected {remote.checksum[1]}; the transfer was corrupted or the mirror "
                f"serves a different file. Retry, or fetch the file by hand into {dest.parent}")
    return dest
