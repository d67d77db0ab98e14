"""The figures of the chaos run (benchmarks/chaos.py): per fault, from the job's lines and
progress (times in seconds from the start), what the user saw, whether and when the job
was detected, restarted and training again; the table per fault kind.

``python -m benchmarks.chaos --table result.json`` re-reads a saved run.
"""
from __future__ import annotations

import re

from benchmarks.chaos_faults import GOES_ON, KINDS

# what a user reads first (hydra's own "demux engine error" lines are noise)
TELLS = re.compile(r"distnn launch: .*(restart|spent|fewer than)|stall|\] lost|Trace"
                   r"back|rror: |did not load|could not|No space")
RESTART = re.compile(r"restart (\d+)/\d+: (.*)$")
STEP = re.compile(r"global step (\d+)")
REDO = re.compile(r"redoing (.*)$")
BAR = re.compile(r"\r|Epoch \d+/\d+: .*?\]")  # a progress bar a message was glued to
GAVE_UP = re.compile(r"distnn launch: .*(not restarting|spent|fewer than)")


def pieces(lines):
    """(t, text) for every part of a line (a progress bar's carriage returns split)."""
    for t, s in lines:
        for part in BAR.sub("\n", s).split("\n"):
            if part.strip():
                yield t, part.strip()


def analyse(result: dict) -> list[dict]:
    """The per-fault rows of ``result`` (a run's JSON), filled in."""
    lines = list(pieces(result["lines"]))
    progress = result.get("progress")
    relaunches = [t for t, s in lines if GAVE_UP.search(s)]  # then the user relaunched
    finish = next((t for t, s in lines if "distnn launch: finished" in s), float("inf"))
    faults = sorted((f for f in result["faults"] if f["at_s"] < finish),
                    key=lambda f: f["at_s"])
    for i, f in enumerate(faults):
        at = f["at_s"]
        ended = f.get("ended_s") or at + f["duration_s"]
        nxt = faults[i + 1]["at_s"] if i + 1 < len(faults) else float("inf")
        # a fault that lets the job go on is judged until it is undone (+ 5 s); the
        # others until the next fault
        stop = min(ended + 5, nxt) if f["kind"] in GOES_ON else max(nxt, ended)
        window = [(t, s) for t, s in lines if at <= t < stop]
        tell = next(((t, s) for t, s in window if TELLS.search(s)), None)
        f["message"] = tell[1][:200] if tell else ""
        f["detected_s"] = round(tell[0] - at, 1) if tell else None
        restart = next(((t, RESTART.search(s)) for t, s in window if RESTART.search(s)),
                       None)
        f["restart"] = restart[1].group(1) if restart else None
        redo = REDO.search(restart[1].group(2)) if restart else None
        f["redone"] = redo.group(1) if redo else None
        gave_up = any(at <= t < stop for t in relaunches)
        if progress is not None:
            after = restart[0] if restart else (ended if f["kind"] in GOES_ON else at)
            base = max([st for t, st in progress if t <= after] or [0])
            step = STEP.search(restart[1].group(2)) if restart else None
            if step:
                base = int(step.group(1))
            back = next((t for t, st in progress if t > after and st > base), None)
            f["recover_s"] = None if back is None else round(back - at, 1)
        went_on = f["kind"] not in GOES_ON or restart is None
        f["reached"] = not any(n.startswith("not reached") or n.endswith(": 0 processes")
                               or n.endswith(" pids []") for n in f.get("notes", []))
        f["survived"] = (f["reached"] and f.get("recover_s") is not None and not gave_up
                         and went_on)
    return faults


def table(result: dict) -> str:
    rows = analyse(result)
    out = ["| fault | injected | reached the job | survived | recover s (mean, max) | "
           "what the user saw first |", "|---|---|---|---|---|---|"]
    for kind in KINDS:
        mine = [r for r in rows if r["kind"] == kind]
        if kind == "host_back":  # a restart line that takes a dropped host again
            back = [s for _, s in pieces(result["lines"]) if "distnn launch: restart" in s
                    and " back;" in s]
            out.append(f"| host_back | {len(back)} | {len(back)} | {len(back)} | - | `"
                       f"{back[0][14:134] if back else 'not exercised'}` |")
            continue
        if not mine:
            out.append(f"| {kind} | 0 | - | - | - | not exercised |")
            continue
        rec = [r["recover_s"] for r in mine if r["reached"] and r.get("recover_s") is not None]
        seen = next((r["message"] for r in mine if r["message"]), "nothing (job went on)")
        seen = seen.replace("|", "/")[:120]
        times = f"{sum(rec) / len(rec):.0f}, {max(rec):.0f}" if rec else "-"
        out.append(f"| {kind} | {len(mine)} | {sum(r['reached'] for r in mine)} | "
                   f"{sum(bool(r['survived']) for r in mine)} | "
                   f"{times} | `{seen}` |")
    return "\n".join(out)
