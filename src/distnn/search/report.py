"""What a search shows and writes: the live line of each finished trial, the ranked table,
``trials.json``, the best configuration as TOML, and the objective-vs-trial PNG.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Mapping

from ..fileio import atomic_open

__all__ = ["TrialRecord", "records_from_study", "live_line", "ranked", "ranked_table",
           "write_trials_json", "write_toml", "toml_value", "plot_objective"]

STATES = ("complete", "pruned", "fail", "running", "waiting")


@dataclass
class TrialRecord:
    """One trial as the reports show it.

    Attributes:
        number: optuna's trial number.
        state: "complete", "pruned", "fail", "running" or "waiting".
        params: the searched options' values.
        value: the objective (the mean over folds); for a pruned trial its last reported
            value (optuna's convention); None for failed and unfinished ones.
        folds: the objective of each fold (one entry without k-fold).
        block: the block that trained it (None if it never ran).
        start, end: wall-clock times (``time.time()``) of the block's start and end.
        seconds: end - start.
        message: why a trial failed or was pruned.
    """

    number: int
    state: str
    params: dict[str, Any]
    value: float | None = None
    folds: list[float] = field(default_factory=list)
    block: int | None = None
    start: float | None = None
    end: float | None = None
    seconds: float | None = None
    message: str | None = None


def records_from_study(study) -> list[TrialRecord]:
    """A ``TrialRecord`` per trial of an optuna study, in trial-number order."""
    out = []
    for t in study.get_trials(deepcopy=False):
        u = t.user_attrs
        state = t.state.name.lower()
        out.append(TrialRecord(
            number=t.number, state=state,
            params=dict(t.params) or dict(t.system_attrs.get("fixed_params", {})),
            value=t.value if state in ("complete", "pruned") else None,
            folds=list(u.get("folds", [])),
            block=u.get("block"), start=u.get("start"), end=u.get("end"),
            seconds=u.get("seconds"), message=u.get("message")))
    return out


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def live_line(record: TrialRecord, objective: str) -> str:
    """``trial 3  block 1  learning_rate=0.0123 optimizer=adam  val_loss=0.5123  4.2 s``"""
    params = " ".join(f"{k}={_fmt(v)}" for k, v in record.params.items())
    if record.state == "complete":
        result = f"{objective}={record.value:.6g}"
        if len(record.folds) > 1:
            result += " (folds " + ", ".join(f"{v:.6g}" for v in record.folds) + ")"
    elif record.state == "pruned":
        result = f"PRUNED: {record.message}"
    else:
        result = f"FAILED: {record.message}"
    seconds = f"{record.seconds:.1f} s" if record.seconds is not None else "-"
    return f"trial {record.number:>3}  block {record.block}  {params}  {result}  {seconds}"


def ranked(records: Iterable[TrialRecord], direction: str) -> list[TrialRecord]:
    """Completed trials best first, then pruned, failed and unfinished ones by number."""
    sign = 1.0 if direction == "minimize" else -1.0
    order = {s: i for i, s in enumerate(STATES)}
    return sorted(records, key=lambda r: (order.get(r.state, len(STATES)),
                                          sign * r.value if r.state == "complete" else 0.0,
                                          r.number))


def ranked_table(records: Iterable[TrialRecord], objective: str, direction: str,
                 n_fold: int = 1) -> str:
    """The final table: rank, trial, block, parameters, objective, folds, time, state."""
    rows = ranked(records, direction)
    names: list[str] = []
    for r in rows:
        names += [k for k in r.params if k not in names]
    head = ["rank", "trial", "block", *names, objective]
    if n_fold > 1:
        head += [f"fold{i + 1}" for i in range(n_fold)]
    head += ["time_s", "state"]
    body = []
    for i, r in enumerate(rows):
        folds = [f"{v:.6g}" for v in r.folds] + ["-"] * (n_fold - len(r.folds))
        state = r.state if not r.message else f"{r.state}: {r.message}"
        body.append([str(i + 1) if r.state == "complete" else "-", str(r.number),
                     "-" if r.block is None else str(r.block),
                     *[_fmt(r.params[k]) if k in r.params else "-" for k in names],
                     f"{r.value:.6g}" if r.value is not None else "-",
                     *(folds if n_fold > 1 else []),
                     f"{r.seconds:.1f}" if r.seconds is not None else "-", state])
    widths = [max(len(row[c]) for row in [head, *body]) for c in range(len(head) - 1)]
    lines = []
    for row in [head, *body]:
        cells = [cell.ljust(w) for cell, w in zip(row[:-1], widths)]
        lines.append("  ".join(cells + [row[-1]]).rstrip())
    return "\n".join(lines)


def write_trials_json(path: str, records: Iterable[TrialRecord],
                      summary: Mapping[str, Any]) -> None:
    """``{"summary": {...}, "trials": [TrialRecord as dict, ...]}`` (atomic write)."""
    data = {"summary": dict(summary), "trials": [asdict(r) for r in records]}
    with atomic_open(path, "w") as f:
        json.dump(data, f, indent=1, default=str)
        f.write("\n")


def toml_value(value: Any) -> str:
    """A Python value as a TOML value (str, bool, int, float, or a list of those)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise ValueError(f"cannot write {value!r} ({type(value).__name__}) as a TOML value")


def write_toml(path: str, tables: Mapping[str, Mapping[str, Any]], comment: str = "") -> None:
    """Write ``{table: {key: value}}`` as a TOML file (atomic), with a leading comment."""
    lines = [f"# {line}".rstrip() for line in comment.splitlines()]
    for name, items in tables.items():
        if not items:
            continue
        lines += ["", f"[{name}]"]
        lines += [f"{key} = {toml_value(value)}" for key, value in items.items()]
    with atomic_open(path, "w") as f:
        f.write("\n".join(lines).lstrip("\n") + "\n")


def plot_objective(path: str, records: Iterable[TrialRecord], objective: str,
                   direction: str) -> None:
    """PNG of the objective of every trial against its number, with the best so far;
    pruned trials are drawn at their last reported value, failed ones along the bottom."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = sorted(records, key=lambda r: r.number)
    done = [r for r in records if r.state == "complete"]
    failed = [r for r in records if r.state == "fail"]
    pruned = [r for r in records if r.state == "pruned" and r.value is not None]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    try:
        if done:
            ax.plot([r.number for r in done], [r.value for r in done], "o", color="tab:blue",
                    label="trial")
            best, steps_x, steps_y = None, [], []
            for r in done:
                better = best is None or (r.value < best if direction == "minimize"
                                          else r.value > best)
                best = r.value if better else best
                steps_x.append(r.number)
                steps_y.append(best)
            ax.step(steps_x, steps_y, where="post", color="tab:orange", label="best so far")
        low = min((r.value for r in done), default=0.0)
        if pruned:
            ax.plot([r.number for r in pruned], [r.value for r in pruned], "v",
                    color="tab:gray", label="pruned")
        if failed:
            ax.plot([r.number for r in failed], [low] * len(failed), "x", color="tab:red",
                    label="failed")
        ax.set_xlabel("trial")
        ax.set_ylabel(objective)
        ax.set_title(f"{objective} per trial ({direction})")
        ax.grid(True, alpha=0.3)
        if records:
            ax.legend(loc="best")
        folder = os.path.dirname(os.path.abspath(path))
        os.makedirs(folder, exist_ok=True)
        with atomic_open(path, "wb") as f:
            fig.savefig(f, format="png")
    finally:
        plt.close(fig)
