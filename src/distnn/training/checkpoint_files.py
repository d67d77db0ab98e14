"""The files of a checkpoint: the newest (``ck.npz``) and the previous one kept beside it
(``ck.prev.npz``), so that a truncated or corrupt newest is survived (``load_latest``).

Each file is whole at every moment: the newest is written to a temporary file and renamed
(``fileio.atomic_open``); just before that rename the file it replaces becomes the previous
one (``keep_previous``: a hard link, so the newest name never disappears).
"""
from __future__ import annotations

import os
from typing import Any, Callable

from ..fileio import npz_kind

__all__ = ["previous_path", "keep_previous", "load_latest"]


def previous_path(path: str | os.PathLike) -> str:
    """Where the checkpoint before ``path``'s newest is kept: ``ck.npz`` -> ``ck.prev.npz``."""
    root, ext = os.path.splitext(os.fspath(path))
    return f"{root}.prev{ext}"


def keep_previous(path: str) -> None:
    """The checkpoint at ``path`` (about to be replaced) becomes the previous one, if it is
    whole (a corrupt newest is replaced, and the good previous one kept). A hard link, so
    ``path`` itself never disappears; a rename where links are not supported."""
    try:
        if npz_kind(path) != "checkpoint":
            return
    except (OSError, ValueError):
        return  # missing, truncated or corrupt: not worth keeping
    prev = previous_path(path)
    link = prev + ".link.part"
    try:
        if os.path.lexists(link):
            os.unlink(link)
        os.link(path, link)
        os.replace(link, prev)
    except OSError:
        os.replace(path, prev)


def load_latest(path: str | os.PathLike, load: Callable[[str], Any]) -> Any:
    """``load(path)`` (``checkpoint.load_checkpoint``), or, when that file is missing,
    truncated or corrupt, ``load`` of the previous checkpoint kept beside it
    (``previous_path``) with ``bad_newest`` saying why (``fallback_note`` is the line to
    show); ``checkpoint.load_latest`` is this with its loader.

    Raises:
        FileNotFoundError / CheckpointError of ``path`` when neither loads.
    """
    path = os.fspath(path)
    try:
        return load(path)
    except (OSError, ValueError) as exc:
        prev = previous_path(path)
        if not os.path.exists(prev):
            raise
        try:
            state = load(prev)
        except (OSError, ValueError):
            raise exc from None
        reason = str(exc).split("; ")[0]
        state.bad_newest = reason.replace(f"checkpoint {path!r} ", "").replace(
            f"{path!r} ", "") or type(exc).__name__
        return state
