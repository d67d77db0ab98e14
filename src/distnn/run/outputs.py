"""Files a run writes besides checkpoints and histories: ``distnn predict``'s predictions."""
from __future__ import annotations

import os

import numpy as np

__all__ = ["write_predictions", "per_rank_path"]


def per_rank_path(path: str, rank: int) -> str:
    """Rank ``rank``'s file of ``--predictions_per_rank``: '{rank}' in ``path`` replaced,
    else ``.rank<r>`` before the extension (preds.npz -> preds.rank1.npz)."""
    if "{rank}" in path:
        return path.replace("{rank}", str(rank))
    stem, ext = os.path.splitext(path)
    return f"{stem}.rank{rank}{ext}"


def write_predictions(path: str, logits: np.ndarray, labels: np.ndarray,
                      index: np.ndarray | None = None) -> None:
    """Write predictions: .npy logits, .npz (logits, predicted, labels, and ``index``
    when given) or .csv rows (index, predicted, label; ``index``: the rows' dataset
    indices, default 0, 1, ...)."""
    from ..training import atomic_write_text
    predicted = logits.argmax(axis=1)
    true = labels.argmax(axis=1) if labels.ndim == 2 else labels
    rows = np.arange(len(predicted)) if index is None else index
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    low = path.lower()
    if low.endswith(".csv"):
        def write(f):
            f.write("index,predicted,label\n")
            for i, p, t in zip(rows, predicted, true):
                f.write(f"{i},{p},{t}\n")
        atomic_write_text(path, write)
    elif low.endswith(".npz"):
        from ..fileio import atomic_open
        with atomic_open(path) as f:
            extra = {} if index is None else {"index": index}
            np.savez(f, logits=logits, predicted=predicted, labels=true, **extra)
    elif low.endswith(".npy"):
        from ..fileio import atomic_open
        with atomic_open(path) as f:
            np.save(f, logits)
    else:
        raise ValueError(f"must end in .npy, .npz or .csv, got {path!r}")
