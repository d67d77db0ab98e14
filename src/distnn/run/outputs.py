"""Files a run writes besides checkpoints and histories: ``distnn predict``'s predictions."""
from __future__ import annotations

import os

import numpy as np

__all__ = ["write_predictions"]


def write_predictions(path: str, logits: np.ndarray, labels: np.ndarray) -> None:
    """Write predictions: .npy logits, .npz (logits, predicted, labels) or .csv rows."""
    from ..training import atomic_write_text
    predicted = logits.argmax(axis=1)
    true = labels.argmax(axis=1) if labels.ndim == 2 else labels
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    low = path.lower()
    if low.endswith(".csv"):
        def write(f):
            f.write("index,predicted,label\n")
            for i, (p, t) in enumerate(zip(predicted, true)):
                f.write(f"{i},{p},{t}\n")
        atomic_write_text(path, write)
    elif low.endswith(".npz"):
        from ..fileio import atomic_open
        with atomic_open(path) as f:
            np.savez(f, logits=logits, predicted=predicted, labels=true)
    elif low.endswith(".npy"):
        from ..fileio import atomic_open
        with atomic_open(path) as f:
            np.save(f, logits)
    else:
        raise ValueError(f"must end in .npy, .npz or .csv, got {path!r}")
