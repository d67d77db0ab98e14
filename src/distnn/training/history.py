"""What a run records and shows: the per-epoch ``History`` (saved atomically as JSON or
CSV) and the ``Reporter`` that writes a trainer's rank-0 output (epoch lines, tqdm bars).
"""
from __future__ import annotations

import csv
import json
import os
import sys
from typing import Any, Callable, Iterable, TextIO

from ..distributed.coordination import on_ranks
from ..fileio import WriteError, atomic_open, guarded_write


class History:
    """Per-epoch logs of a run, like Keras's ``History``.

    Attributes:
        records: one dict per finished epoch: "epoch" (1-based), "loss", metrics,
            "val_*", "lr", "time" (s) and "samples_per_s".
        history: the same as {key: [value per epoch]}.
        run: the run's settings (option: value, ranks), saved in the JSON file under "run"
            (``distnn plot`` labels runs with them).
    """

    def __init__(self, records: Iterable[dict[str, Any]] = (), run: dict | None = None):
        self.records: list[dict[str, Any]] = [dict(r) for r in records]
        self.stop_reason: str | None = None
        self.run: dict[str, Any] = dict(run or {})

    def append(self, record: dict[str, Any]) -> None:
        self.records.append(dict(record))

    def __len__(self) -> int:
        return len(self.records)

    @property
    def history(self) -> dict[str, list]:
        keys: list[str] = []
        for r in self.records:
            keys += [k for k in r if k not in keys]
        return {k: [r.get(k) for r in self.records] for k in keys}

    def save(self, path: str | os.PathLike) -> None:
        """Write to ``path``: CSV when it ends in .csv (one row per epoch), else JSON
        ({key: [values]}, and "run": {option: value} when ``run`` is set). The write is
        atomic."""
        path = os.fspath(path)

        def write(f):
            if path.lower().endswith(".csv"):
                hist = self.history
                w = csv.writer(f)
                w.writerow(list(hist))
                for row in zip(*hist.values()):
                    w.writerow(["" if v is None else v for v in row])
            else:
                data = dict(self.history)
                if self.run:
                    data["run"] = self.run
                json.dump(data, f, indent=1)
                f.write("\n")

        atomic_write_text(path, write)

    def save_on_root(self, path: str | os.PathLike, comm) -> None:
        """``save`` on rank 0 of ``comm``; a failure raises ``fileio.WriteError`` on every
        rank (collective)."""
        on_ranks(comm, lambda: guarded_write(os.fspath(path), lambda: self.save(path), "history"),
                 root=0, catch=WriteError)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "History":
        path = os.fspath(path)
        with open(path, newline="") as f:
            if path.lower().endswith(".csv"):
                rows = list(csv.DictReader(f))
                return cls([{k: _number(v) for k, v in r.items()} for r in rows])
            hist = json.load(f)
        if not isinstance(hist, dict):
            raise ValueError(f"{path!r} is not a history file (a JSON object of lists)")
        run = hist.pop("run", None)
        hist = {k: v for k, v in hist.items() if isinstance(v, list)}
        n = max((len(v) for v in hist.values()), default=0)
        return cls([{k: v[i] for k, v in hist.items() if i < len(v)} for i in range(n)],
                   run=run if isinstance(run, dict) else None)

    def __repr__(self) -> str:
        return f"History({len(self)} epochs, keys={list(self.history)})"


def _number(text: str):
    if text == "":
        return None
    try:
        value = float(text)
    except ValueError:
        return text
    return int(value) if value.is_integer() and "." not in text and "e" not in text else value


def atomic_write_text(path: str, write: Callable[[TextIO], None]) -> None:
    """Write a text file through a temporary file in the same folder and ``os.replace``,
    so readers never see a half-written file."""
    with atomic_open(path, "w", newline="") as f:
        write(f)


def _fmt(value: float) -> str:
    if value is None:
        return "-"
    if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e5):
        return f"{value:.3e}"
    return f"{value:.4f}"


class Reporter:
    """A run's output on rank 0: summary lines and one progress bar per epoch.

    Args:
        root: whether this rank writes (only rank 0 does).
        progress: draw a tqdm bar per epoch (stderr).
        verbose: print summary lines (stdout, or ``out``).
        out: where summary lines go.
    """

    def __init__(self, root: bool, *, progress: bool = True, verbose: bool = True,
                 out: TextIO | None = None):
        self.root = bool(root)
        self.progress = bool(progress)
        self.verbose = bool(verbose)
        self.out = out if out is not None else sys.stdout
        self.bar = None

    def print(self, message: str, force: bool = False) -> None:
        """Print a line on rank 0 (through tqdm while a bar is drawn); only when verbose,
        unless ``force`` (output the user asked for, like profiles)."""
        if not (self.root and (self.verbose or force)):
            return
        if self.bar is not None:
            from tqdm import tqdm
            tqdm.write(message, file=sys.stderr)
        else:
            print(message, file=self.out, flush=True)

    def open_bar(self, total: int, desc: str):
        """Start the epoch's bar (None when this rank draws none)."""
        self.bar = None
        if not (self.progress and self.root):
            return None
        from tqdm import tqdm
        # Under mpiexec a rank's stderr is a pipe, not a terminal: still redraw every
        # second, so an epoch of a few seconds shows its progress.
        tty = sys.stderr.isatty()
        self.bar = tqdm(total=total, desc=desc, unit="sample", unit_scale=True,
                        file=sys.stderr, leave=True, dynamic_ncols=True,
                        mininterval=self.redraw_interval(tty), smoothing=0.1)
        return self.bar

    @staticmethod
    def redraw_interval(tty: bool) -> float:
        """Seconds between redraws of the bar: 0.2 on a terminal, 1 on a pipe or file."""
        return 0.2 if tty else 1.0

    @staticmethod
    def postfix(logs: dict[str, float]) -> str:
        return " ".join(f"{k}={_fmt(v)}" for k, v in logs.items()
                        if k not in ("time", "samples_per_s", "lr"))

    def epoch_line(self, record: dict[str, Any], num_epochs: int) -> None:
        """Close the epoch's bar with its final logs, or print them as one line."""
        bar, self.bar = self.bar, None
        if bar is not None:
            bar.set_postfix_str(self.postfix({k: v for k, v in record.items()
                                              if k != "epoch"}), refresh=False)
            bar.close()
            return
        parts = [f"{k}={_fmt(v)}" for k, v in record.items()
                 if k not in ("epoch", "time", "samples_per_s")]
        self.print(f"Epoch {record['epoch']}/{num_epochs}: {' '.join(parts)} "
                   f"({record['time']:.1f} s, {record['samples_per_s']:,.0f} samples/s)")
