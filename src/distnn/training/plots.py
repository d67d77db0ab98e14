"""Training curves as a PNG: the loss and every metric per epoch, training and validation,
one panel each (``plot_history``), for one run or several to compare (``run_labels`` names
each run by the options in which it differs from the others). matplotlib, Agg backend: no
display needed.

Example:
    plot_history("curves.png", [History.load("a/history.json"), History.load("b/h.json")])
"""
from __future__ import annotations

import os
from typing import Any, Sequence

from .history import History

__all__ = ["plot_history", "run_labels", "curve_keys", "MATPLOTLIB"]

MATPLOTLIB = "drawing curves needs matplotlib: pip install 'distnn[tensorboard]' (or matplotlib)"
# Keys that are not curves of the model's quality.
_NOT_CURVES = ("epoch", "lr", "time", "samples_per_s")


def matplotlib_missing() -> str | None:
    """Why curves cannot be drawn here (matplotlib is missing), or None."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return MATPLOTLIB
    return None


def curve_keys(histories: Sequence[History]) -> list[str]:
    """The training keys to draw (loss first), each with its ``val_`` twin if logged."""
    keys: list[str] = []
    for h in histories:
        for key in h.history:
            base = key[4:] if key.startswith("val_") else key
            if base not in _NOT_CURVES and base not in keys:
                keys.append(base)
    return sorted(keys, key=lambda k: (k != "loss", keys.index(k)))


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    return str(value)


def run_labels(runs: Sequence[dict[str, Any]], names: Sequence[str]) -> list[str]:
    """A legend label per run: the options whose values differ between ``runs`` ("parallel
    =localsgd ranks=4"); ``names`` (e.g. file names) for runs that record no options (older
    history files, CSV) or where the options tell nothing apart."""
    known = [run for run in runs if run]
    keys: list[str] = []
    for run in known:
        keys += [k for k in run if k not in keys]
    differ = [k for k in keys if len({repr(run.get(k)) for run in known}) > 1]
    if len(known) < 2 or not differ:
        differ = [k for k in ("model", "parallel", "ranks") if k in keys]
    labels = [" ".join(f"{k}={_short(run.get(k, '-'))}" for k in differ) if run else name
              for run, name in zip(runs, names)]
    if len(set(labels)) < len(labels):
        labels = [label if label == name else f"{name}: {label}"
                  for name, label in zip(names, labels)]
    return labels


def plot_history(path: str | os.PathLike, histories: Sequence[History] | History,
                 labels: Sequence[str] | None = None, title: str | None = None,
                 dpi: int = 80) -> str:
    """Draw the curves of ``histories`` into the PNG ``path``: one panel per key (loss,
    then each metric), per run a solid line for training and a dashed one for validation,
    over the epochs. Returns ``path``.

    Raises:
        ImportError: matplotlib is missing (the message says what to install).
        ValueError: no run has a finished epoch.
    """
    if isinstance(histories, History):
        histories = [histories]
    if matplotlib_missing():
        raise ImportError(MATPLOTLIB)
    import matplotlib
    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator
    histories = list(histories)
    if not any(len(h) for h in histories):
        raise ValueError("no finished epoch to draw (the history is empty)")
    if labels is None:
        labels = run_labels([h.run for h in histories], [f"run {i + 1}"
                                                        for i in range(len(histories))])
    keys = curve_keys(histories)
    cols = min(len(keys), 3)
    rows = -(-len(keys) // cols)
    fig = Figure(figsize=(4.2 * cols, 3.2 * rows + 0.4), dpi=dpi)
    axes = fig.subplots(rows, cols, squeeze=False)
    colors = [f"C{i % 10}" for i in range(len(histories))]
    for ax, key in zip(axes.flat, keys):
        for h, label, color in zip(histories, labels, colors):
            hist = h.history
            epochs = hist.get("epoch") or list(range(1, len(h) + 1))
            for name, style, suffix in ((key, "-", "train"), (f"val_{key}", "--", "val")):
                values = hist.get(name)
                if not values or all(v is None for v in values):
                    continue
                points = [(e, v) for e, v in zip(epochs, values) if v is not None]
                ax.plot([e for e, _ in points], [v for _, v in points], style, color=color,
                        marker="o", markersize=3, label=f"{label} ({suffix})")
        ax.set_title(key)
        ax.set_xlabel("epoch")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(True, alpha=0.3)
    for ax in list(axes.flat)[len(keys):]:
        ax.set_visible(False)
    handles, names = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=min(len(names), 4), fontsize=8,
               frameon=False)
    if title:
        fig.suptitle(title)
    legend_rows = -(-len(names) // 4)
    fig.tight_layout(rect=(0, 0.05 + 0.04 * legend_rows, 1, 1))
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    from ..fileio import atomic_open
    with atomic_open(path) as f:
        fig.savefig(f, format="png")
    return path
