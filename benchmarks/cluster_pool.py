"""Pool repeated runs of benchmarks/cluster.py's accuracy part into one table of medians
(issue 43: medians of >= 3 runs per row), with each row's time to target against the
network-free row's (the same ranks through shared memory on one host).

    for i in 1 2 3; do
        python benchmarks/cluster.py --part accuracy --rates 1gbit --eval-every 20 \\
            --rules data data+fp16 data+topk data+powersgd partial localsgd ddp --json a$i.json
    done
    python benchmarks/cluster_pool.py a1.json a2.json a3.json

Files of the throughput part (``--part throughput``, one ``--compression`` each, as many
repetitions as files) pool into one table of samples/s per model, host count, link and
compression: the median over the files of each run's median window, the step time against
dense's on the same row, and the network-free rows first.

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
    from benchmarks.cluster_accuracy import LABELS
except ImportError:  # run as a script: benchmarks/ is on sys.path
    import cluster_opts as opts
    from cluster_accuracy import LABELS


def pool(runs: list[dict]) -> list[dict]:
    """One row per key ("rule/rate") in the order of the first run: the medians over the
    runs that have it, and how many reached the target."""
    keys = list(dict.fromkeys(k for run in runs for k in run))
    rows = []
    for key in keys:
        recs = [run[key] for run in runs if key in run and "error" not in run[key]]
        errors = [run[key]["error"] for run in runs if key in run and "error" in run[key]]
        # a row evaluated only at epoch ends (PyTorch DDP's) has its epoch-end time
        fine = all("step_to_target" in r for r in recs)
        field = "time_to_target_steps" if fine else "time_to_target"
        times = [r[field] for r in recs if r.get(field)]
        steps = [r["step_to_target"] for r in recs if r.get("step_to_target")]
        rows.append({
            "key": key, "runs": len(recs), "reached": len(times), "errors": errors,
            "epoch_ends": not fine,
            "time": statistics.median(times) if len(times) * 2 > len(recs) else None,
            "times": times,
            "step": statistics.median(steps) if steps else None,
            "epoch_time": statistics.median(
                [r["time_to_target"] for r in recs if r.get("time_to_target")] or [0]),
            "final_acc": statistics.median([r["final_acc"] for r in recs]) if recs else None,
            "kb_step": statistics.median([r["bytes_per_step"] for r in recs]) / 1e3
            if recs else None})
    return rows


def table(rows: list[dict], reference: str, hosts: int = 2, scale: bool = False) -> str:
    ref = next((r["time"] for r in rows if r["key"] == reference), None)
    out = ["| system | link | runs (reached) | time to target s, median | each run s | "
           "step of the crossing | vs network-free | at epoch ends s | final acc | "
           "kB on the wire/step |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        name, rate = r["key"].split("/")
        link = opts.rate_label(rate, hosts, scale)
        if not r["runs"]:
            out.append(f"| {LABELS.get(name, name)} | {link} | 0 | failed: "
                       f"{r['errors'][0] if r['errors'] else '?'} | | | | | | |")
            continue
        t = f"{r['time']:.1f}" if r["time"] else "not reached"
        if r["epoch_ends"] and r["time"]:
            t += " (at an epoch end)"
        vs = f"{r['time'] / ref - 1:+.0%}" if r["time"] and ref and not r["epoch_ends"] else "-"
        each = ", ".join(f"{x:.1f}" for x in r["times"])
        out.append(f"| {LABELS.get(name, name)} | {link} | {r['runs']} ({r['reached']}) | "
                   f"{t} | {each} | {f'{s:.0f}' if (s := r['step']) else '-'} | {vs} | "
                   f"{f'{ep:.1f}' if (ep := r['epoch_time']) else 'not reached'} | "
                   f"{r['final_acc']:.4f} | "
                   f"{r['kb_step']:.1f} |")
    return "\n".join(out)


def pool_throughput(files: list[dict]) -> dict:
    """{(model, hosts, rate, compression): [each run's median samples/s, step s]}."""
    out: dict = {}
    for raw in files:
        comp = raw.get("meta", {}).get("compression", "none")
        for key, recs in raw["throughput"].items():
            model, hosts, rate = key.split("/")
            ok = [r for r in recs if "error" not in r]
            row = out.setdefault((model, int(hosts), rate, comp), [])
            row += [(statistics.median(r["samples_per_s"]), statistics.median(r["step_s"]))
                    for r in ok]
    return out


def throughput_table(pooled: dict, scale: bool) -> str:
    comps = list(dict.fromkeys(k[3] for k in pooled))
    out = ["| model | hosts x ranks | link | " + " | ".join(
        f"{c} samples/s (runs)" for c in comps) + " | " + " | ".join(
        f"{c} step / dense step" for c in comps if c != "none") + " |",
        "|---" * (3 + len(comps) + len([c for c in comps if c != "none"])) + "|"]
    rows = list(dict.fromkeys(k[:3] for k in pooled))
    local = ("None", opts.NETWORK_FREE)
    rows.sort(key=lambda r: (r[0], r[2] not in local, r[2] != "None",
                             0 if r[2] in local else opts.parse_rate(r[2]), r[1]))
    for model, hosts, rate in rows:
        med = {c: pooled.get((model, hosts, rate, c)) for c in comps}
        sps = [f"{statistics.median(x for x, _ in v):.0f} ({len(v)})" if v else "-"
               for v in med.values()]
        dense = med.get("none")
        ratio = []
        for c in comps:
            if c == "none":
                continue
            v = med[c]
            if v and dense and rate not in ("None", opts.NETWORK_FREE):
                step = statistics.median(t for _, t in v)
                ratio.append(f"{step / statistics.median(t for _, t in dense):.2f}")
            else:
                ratio.append("-")
        link = opts.rate_label(None if rate == "None" else rate, hosts, scale)
        out.append(f"| {model} | {hosts} x 1 | {link} | " + " | ".join(sps) + " | "
                   + " | ".join(ratio) + " |")
    return "\n".join(out)


def throughput_plot(pooled: dict, path: str) -> None:
    """samples/s against hosts, one panel per link, one line per compression (medians),
    the network-free rows dashed; written to ``path`` (matplotlib, no display)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rates = sorted({k[2] for k in pooled if k[2] not in ("None", opts.NETWORK_FREE)},
                   key=opts.parse_rate)
    fig, axes = plt.subplots(1, len(rates), figsize=(5 * len(rates), 3.6), squeeze=False)
    for ax, rate in zip(axes[0], rates):
        for comp in dict.fromkeys(k[3] for k in pooled):
            for link, style in ((rate, "-o"), (opts.NETWORK_FREE, ":")):
                pts = sorted((k[1], statistics.median(x for x, _ in v))
                             for k, v in pooled.items()
                             if k[2] == link and k[3] == comp and v)
                if pts and (link == rate or comp == "none"):
                    label = ("dense" if comp == "none" else comp) if link == rate else \
                        "dense, one host (shared memory)"
                    ax.plot(*zip(*pts), style, label=label)
        ax.set_title(f"{rate} links, scaled to one-core nodes")
        ax.set_xlabel("hosts x 1 rank")
        ax.set_xscale("log", base=2)
        ax.set_ylabel("samples/s")
        ax.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def curves_plot(runs: list[dict], target: float, path: str, hosts: int = 2,
                scale: bool = False) -> None:
    """Held-out accuracy against training time, one colour per row, every run drawn (the
    evaluations every K steps), the target dashed; written to ``path``."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    keys = [k for k in dict.fromkeys(k for run in runs for k in run)
            if any(run.get(k, {}).get("curve") for run in runs)]
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, key in enumerate(keys):
        name, rate = key.split("/")
        label = f"{LABELS.get(name, name)}, {opts.rate_label(rate, hosts, scale)}"
        for j, run in enumerate(r for r in runs if r.get(key, {}).get("curve")):
            t, acc = zip(*run[key]["curve"])
            ax.plot(t, acc, "-", color=colours[i % len(colours)], lw=1, alpha=0.75,
                    label=label if j == 0 else None)
    ax.axhline(target, ls="--", color="grey", lw=0.8)
    ax.set_xlabel("training time s (evaluations excluded)")
    ax.set_ylabel("held-out accuracy")
    ax.set_ylim(max(0.5, target - 0.2), min(1.0, target + 0.06))
    ax.legend(fontsize=7, loc="lower right")
    ax.set_title(f"simplecnn, {hosts} hosts x 1 rank: every run")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("json", nargs="+", help="--json files of cluster.py's accuracy part")
    ap.add_argument("--reference", default=f"data/{opts.NETWORK_FREE}",
                    help="the row the others are compared with")
    ap.add_argument("--plot", help="also draw to this PNG: samples/s against hosts "
                    "(throughput files), accuracy against training time (accuracy files)")
    ap.add_argument("--target", type=float, default=0.85, help="the accuracy target drawn")
    args = ap.parse_args()
    raws = [json.loads(Path(p).read_text()) for p in args.json]
    if all("throughput" in r for r in raws):
        scale = any(r.get("meta", {}).get("scale_links") for r in raws)
        pooled = pool_throughput(raws)
        print(throughput_table(pooled, scale))
        if args.plot:
            throughput_plot(pooled, args.plot)
    else:
        runs = [r["accuracy"] for r in raws]
        meta = raws[0].get("meta", {})
        print(table(pool(runs), args.reference, meta.get("acc_hosts", 2),
                    bool(meta.get("scale_links"))))
        if args.plot:
            curves_plot(runs, args.target, args.plot, meta.get("acc_hosts", 2),
                        bool(meta.get("scale_links")))


if __name__ == "__main__":
    main()
