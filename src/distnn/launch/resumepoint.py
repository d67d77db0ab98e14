"""Where a restart of ``distnn launch`` resumes: the checkpoint it loads (or the previous
one beside it, or the newest node-local copy), how far the failed job got (the progress
file its rank 0 kept) and so how many steps and samples the restart redoes.

Example:
    resume, where, redo = resume_point("ck.npz", train_argv, read_progress(path))
"""
from __future__ import annotations

import os
from typing import Sequence

__all__ = ["resume_point", "describe_checkpoint", "read_progress"]


def describe_checkpoint(checkpoint: str) -> str:
    """'ck.npz (epoch 2 step 40, global step 140)', or why there is none."""
    from ..training.checkpoint import load_latest
    try:
        state = load_latest(checkpoint)
    except (OSError, ValueError):
        return f"none ({checkpoint} missing or unreadable)"
    return f"{state.path} ({state.where()}, global step {state.meta['global_step']})"


def resume_point(checkpoint: str, train_argv: Sequence[str],
                 reached: tuple[int, ...] | None):
    """(resume?, 'resuming from ...', 'redoing N samples') or (None, reason, '')."""
    from ..training.checkpoint import load_latest, previous_path
    if not os.path.exists(checkpoint) and not os.path.exists(previous_path(checkpoint)):
        done = f"{reached[0] * reached[3]} samples" if reached else "what was done"
        return False, "no checkpoint yet: starting over", f"redoing {done}"
    try:
        state = load_latest(checkpoint)
    except (OSError, ValueError) as exc:
        if node_local(train_argv):  # the ranks take the newest copy any loads
            return True, f"this host's copy will not load ({exc}); resuming from the " \
                         "newest node-local copy a rank loads", "redoing the steps after it"
        return None, f"the checkpoint will not load: {exc}", ""
    step = int(state.meta["global_step"])
    gbs = int(state.meta.get("global_batch_size") or 0)
    if reached is not None and reached[0] >= step:
        n = reached[0] - step
        redo = f"redoing {n} step{'s' * (n != 1)} ({n * gbs} samples)"
    else:
        redo = "redoing the steps after it"
    where = f"resuming from {state.where()} (global step {step}) of {state.path}"
    if state.bad_newest is not None:
        where = f"{checkpoint} {state.bad_newest}: {where}, the previous one"
    return True, where, redo


def node_local(argv: Sequence[str]) -> bool:
    """Whether the train command keeps a checkpoint per node (--every_rank_writes, or
    PyDTNN's --shared_storage false)."""
    words = [w.replace("-", "_").lstrip("_") for w in argv]
    for i, w in enumerate(words):
        value = words[i + 1].lower() if i + 1 < len(words) else ""
        if w.startswith("every_rank_writes"):
            return not (w.endswith("=false") or value in ("false", "0", "no"))
        if w.startswith("shared_storage"):
            return w.endswith("=false") or value in ("false", "0", "no")
    return False


def read_progress(path: str) -> tuple[int, ...] | None:
    """(global_step, epoch, epoch_step, global_batch) the last job wrote, or None."""
    try:
        with open(path) as f:
            values = tuple(int(v) for v in f.read().split())
    except (OSError, ValueError):
        return None
    return values if len(values) == 4 else None  # empty: read while being rewritten
