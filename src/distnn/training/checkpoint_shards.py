"""The per-rank files of a checkpoint of sharded training state (``--shard``,
``distributed.ShardedOptimizer``): nothing is gathered on one rank.

Layout, for a checkpoint ``ck.npz`` written at global step G by N ranks::

    ck.npz                    rank 0: the metadata, callbacks, history, the model's
                              buffers (batch-norm statistics: the same on every rank) and
                              the optimizer's scalars; meta["sharded"] says what follows
    ck.shard<r>of<N>.step<G>.npz
                              rank r: "params" (its slice [lo, hi) of the flat parameter
                              buffer), "state/<key>" (its slice of each optimizer state
                              array) and "bounds" ([lo, hi])

``meta["sharded"]`` = {"stage", "ranks", "total", "bounds", "files"} (file names relative
to the checkpoint's folder). Every rank writes its file atomically before rank 0 writes
the main one, so a main file only ever names whole shard files; the step in their names
keeps those of the previous checkpoint (``ck.prev.npz``) until a newer one replaces it.
A resume on any number of ranks reads, on each rank, the parts of the files that overlap
what it needs (its slice of the state; the whole parameter buffer, or at stage 3 its
slice) and re-slices them.
"""
from __future__ import annotations

import glob
import json
import os
import re
from typing import Any

import numpy as np

from ..distributed.coordination import on_ranks
from ..fileio import WriteError, atomic_open, guarded_write

__all__ = ["shard_file", "save_shards", "load_shards", "remove_stale", "is_sharded"]


def is_sharded(optimizer) -> bool:
    """Whether ``optimizer`` (a trainer's) keeps sharded state (``ShardedOptimizer``)."""
    return hasattr(optimizer, "shard_arrays") and hasattr(optimizer, "load_shard_arrays")


def shard_file(path: str, rank: int, size: int, step: int) -> str:
    """``ck.npz`` -> ``ck.shard<rank>of<size>.step<step>.npz``."""
    root, ext = os.path.splitext(os.fspath(path))
    return f"{root}.shard{rank}of{size}.step{step}{ext}"


def save_shards(path: str, trainer) -> dict[str, Any]:
    """Every rank writes its shard file (collective; a write error is raised on every
    rank); returns the ``meta["sharded"]`` entry of the main file."""
    comm, opt = trainer.comm, trainer.optimizer
    mine = shard_file(path, comm.rank, comm.size, trainer.global_step)
    arrays = dict(opt.shard_arrays())
    arrays["bounds"] = np.array([opt.lo, opt.hi], dtype=np.int64)

    def write():
        def savez():
            with atomic_open(mine, fsync=True) as f:
                np.savez(f, **arrays)
        guarded_write(mine, savez, "checkpoint shard")

    on_ranks(comm, write, catch=WriteError)
    return {"stage": opt.stage, "ranks": comm.size, "total": opt.total,
            "bounds": [list(b) for b in opt.bounds],
            "files": [os.path.basename(shard_file(path, r, comm.size, trainer.global_step))
                      for r in range(comm.size)]}


def load_shards(checkpoint, optimizer, error: type[Exception] = ValueError) -> None:
    """Fill ``optimizer`` (a ``ShardedOptimizer``) from the shard files of ``checkpoint``
    (a loaded ``Checkpoint`` whose meta has "sharded"), on any number of ranks; a file
    that does not fit raises ``error`` (``checkpoint.CheckpointError``) naming it."""
    CheckpointError = error
    info = checkpoint.meta["sharded"]
    if int(info["total"]) != optimizer.total:
        raise CheckpointError(f"checkpoint {checkpoint.path!r} holds {info['total']} "
                              f"parameters, this model has {optimizer.total}; use the same "
                              "--model as the run that wrote it")
    folder = os.path.dirname(os.path.abspath(checkpoint.path))
    files = {}

    def reader(name):
        def read(key):
            if name not in files:
                full = os.path.join(folder, name)
                try:
                    files[name] = np.load(full, allow_pickle=False)
                except (OSError, ValueError) as exc:
                    raise CheckpointError(f"checkpoint {checkpoint.path!r}: its shard file "
                                          f"{full!r} cannot be read ({exc}); the shard files "
                                          "of a sharded checkpoint stay beside it") from None
            try:
                return files[name][key]
            except KeyError:
                raise CheckpointError(f"checkpoint {checkpoint.path!r}: shard file {name!r} "
                                      f"lacks {key!r}; it was written by another run") from None
        return read

    pieces = [(int(lo), int(hi), reader(name))
              for (lo, hi), name in zip(info["bounds"], info["files"])]
    try:
        optimizer.load_shard_arrays(pieces)
    finally:
        for f in files.values():
            f.close()


_STEP = re.compile(r"\.shard\d+of\d+\.step(\d+)")


def remove_stale(path: str, meta: dict[str, Any]) -> None:
    """Remove the shard files beside ``path`` that neither it (``meta``) nor its previous
    checkpoint names (rank 0, after the main file is written)."""
    from .checkpoint_files import previous_path
    keep = set(meta.get("sharded", {}).get("files", []))
    prev = previous_path(path)
    try:
        with np.load(prev, allow_pickle=False) as z:
            keep |= set(json.loads(str(z["__meta__"])).get("sharded", {}).get("files", []))
    except (OSError, ValueError, KeyError):
        pass
    root, ext = os.path.splitext(os.fspath(path))
    for name in glob.glob(f"{glob.escape(root)}.shard*of*.step*{ext}"):
        if _STEP.search(name) and os.path.basename(name) not in keep:
            try:
                os.unlink(name)
            except OSError:
                pass
