"""Pool repeated runs of benchmarks/cluster.py's accuracy part into one table of medians
(issue 43: medians of >= 3 runs per row), with each row's time to target against the
network-free row's (the same ranks through shared memory on one host).

    for i in 1 2 3; do
        python benchmarks/cluster.py --part accuracy --rates 1gbit --eval-every 20 \\
            --rules data data+fp16 data+topk data+powersgd partial localsgd ddp --json a$i.json
    done
    python benchmarks/cluster_pool.py a1.json a2.json a3.json

The time to target is the training time (evaluations excluded) at the first evaluation,
every K steps on the fixed held-out set, that reaches the target; a run that does not
reach it counts as missing, and a row whose runs mostly miss says so.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

try:
    from benchmarks import cluster_opts as opts
    from benchmarks.cluster import LABELS
except ImportError:  # run as a script: benchmarks/ is on sys.path
    import cluster_opts as opts
    from cluster import LABELS


def pool(runs: list[dict]) -> list[dict]:
    """One row per key ("rule/rate") in the order of the first run: the medians over the
    runs that have it, and how many reached the target."""
    keys = list(dict.fromkeys(k for run in runs for k in run))
    rows = []
    for key in keys:
        recs = [run[key] for run in runs if key in run and "error" not in run[key]]
        errors = [run[key]["error"] for run in runs if key in run and "error" in run[key]]
        times = [r["time_to_target_steps"] for r in recs if r.get("time_to_target_steps")]
        steps = [r["step_to_target"] for r in recs if r.get("step_to_target")]
        rows.append({
            "key": key, "runs": len(recs), "reached": len(times), "errors": errors,
            "time": statistics.median(times) if len(times) * 2 > len(recs) else None,
            "times": times,
            "step": statistics.median(steps) if steps else None,
            "final_acc": statistics.median([r["final_acc"] for r in recs]) if recs else None,
            "kb_step": statistics.median([r["bytes_per_step"] for r in recs]) / 1e3
            if recs else None})
    return rows


def table(rows: list[dict], reference: str) -> str:
    ref = next((r["time"] for r in rows if r["key"] == reference), None)
    out = ["| system | link | runs (reached) | time to target s, median | each run s | "
           "step of the crossing | vs network-free | final acc | kB on the wire/step |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        name, rate = r["key"].split("/")
        link = opts.rate_label(rate, 2, False)
        if not r["runs"]:
            out.append(f"| {LABELS.get(name, name)} | {link} | 0 | failed: "
                       f"{r['errors'][0] if r['errors'] else '?'} | | | | | |")
            continue
        t = f"{r['time']:.1f}" if r["time"] else "not reached"
        vs = f"{r['time'] / ref - 1:+.0%}" if r["time"] and ref else "-"
        each = ", ".join(f"{x:.1f}" for x in r["times"])
        out.append(f"| {LABELS.get(name, name)} | {link} | {r['runs']} ({r['reached']}) | "
                   f"{t} | {each} | {r['step'] or '-'} | {vs} | {r['final_acc']:.4f} | "
                   f"{r['kb_step']:.1f} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("json", nargs="+", help="--json files of cluster.py's accuracy part")
    ap.add_argument("--reference", default=f"data/{opts.NETWORK_FREE}",
                    help="the row the others are compared with")
    args = ap.parse_args()
    runs = [json.loads(Path(p).read_text())["accuracy"] for p in args.json]
    print(table(pool(runs), args.reference))


if __name__ == "__main__":
    main()
