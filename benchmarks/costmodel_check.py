"""The cost model (distnn.cluster.costmodel) against the throughput part of
benchmarks/cluster.py: for every N-host row of its --json file, the step time the model
predicts for what was emulated (the compute of the 1-host row, slowed N/C times when N
hosts share C cores; the link as shaped, scaled when the run had --scale-links) next to
the measured one, and the error.

    python benchmarks/cluster.py --part throughput --hosts 2 4 8 --scale-links --json c.json
    python benchmarks/costmodel_check.py c.json [--latency-us 50]

A run with ``--compression SPEC`` (the workers' --gradient_compression) is checked against
the model of that compression (its JSON records which).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

try:
    from benchmarks import cluster_opts as opts
except ImportError:  # run as a script: benchmarks/ is on sys.path
    import cluster_opts as opts

SHAPES = {"simplecnn": (1, 28, 28), "lenet": (1, 28, 28), "resnet20": (3, 32, 32),
          "vgg11bn": (3, 32, 32)}


def _step(recs: list[dict]) -> float | None:
    ok = [statistics.median(r["step_s"]) for r in recs if "error" not in r]
    return statistics.median(ok) if ok else None


def check(raw: dict, latency_s: float, cores: int, scale: bool,
          compression: str = "none") -> list[dict]:
    """One row per measured N-host row of ``raw["throughput"]``: measured and predicted
    step seconds and the relative error (predicted / measured - 1)."""
    from distnn.cluster.costmodel import Config, Link, ModelCost, predict
    from distnn.distributed.optimizer import parameter_tensors
    from distnn.models import get_model
    runs = raw["throughput"]
    out = []
    for key, recs in runs.items():
        model, hosts, rate = key.split("/")
        hosts = int(hosts)
        if hosts == 1 or rate in ("None", opts.NETWORK_FREE):
            continue
        base, measured = _step(runs.get(f"{model}/1/None", [])), _step(recs)
        if base is None or measured is None:
            out.append({"row": key, "error": "no measurement (1-host or this row failed)"})
            continue
        net = get_model(model, input_shape=SHAPES[model], num_classes=10)
        batch = recs[0].get("batch_per_rank", 64)
        cost = ModelCost(base * max(1.0, hosts / cores), parameter_tensors(net), batch=batch,
                         segments=[(ly.name, lo, hi) for ly, lo, hi in net.layer_ranges()])
        shaped = opts.link_rate(rate, hosts, scale, cores)
        link = Link(opts.parse_rate(shaped) / 1e9, latency_s)
        pred = predict(Config("data", compression), cost, hosts, link).step_s
        out.append({"row": key, "link": shaped, "compute_s": cost.compute_s,
                    "measured_s": measured, "predicted_s": pred,
                    "rel_error": pred / measured - 1})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json", nargs="+", help="benchmarks/cluster.py --json output "
                    "(throughput part); several files of one compression are repetitions "
                    "(each row's runs pooled)")
    ap.add_argument("--latency-us", type=float, default=50.0, help="one message's latency "
                    "on the emulated links (measure it: a 4-byte all-reduce on 2 hosts)")
    ap.add_argument("--cores", type=int, default=None, help="cores of the run (default: "
                    "what its JSON says, else this machine's)")
    ap.add_argument("--scale-links", action="store_true", default=None,
                    help="the run had --scale-links (default: what its JSON says)")
    args = ap.parse_args()
    raws = [json.loads(Path(p).read_text()) for p in args.json]
    for path, one in zip(args.json, raws):
        if "throughput" not in one:
            sys.exit(f"benchmarks/costmodel_check.py: {path} has no throughput part; run "
                     "benchmarks/cluster.py --part throughput --json FILE")
    if len({one.get("meta", {}).get("compression", "none") for one in raws}) > 1:
        sys.exit("benchmarks/costmodel_check.py: the files are runs of different "
                 "--compression; check each compression's files on their own")
    raw = {"meta": raws[0].get("meta", {}), "throughput": {}}
    for one in raws:
        for key, recs in one["throughput"].items():
            raw["throughput"].setdefault(key, []).extend(recs)
    meta = raw["meta"]
    cores = args.cores or meta.get("cores") or opts.cores()
    scale = bool(meta.get("scale_links")) if args.scale_links is None else True
    compression = meta.get("compression", "none")
    rows = check(raw, args.latency_us * 1e-6, cores, scale, compression)
    print(f"cost model vs measured, --parallel data, compression {compression}, {cores} "
          f"cores, links {'scaled' if scale else 'as named'}, latency {args.latency_us:g} us\n")
    print("| row | link shaped | compute ms | measured ms | predicted ms | error |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['row']} | failed: {r['error']} | | | | |")
            continue
        print(f"| {r['row']} | {r['link']} | {r['compute_s'] * 1e3:.2f} | "
              f"{r['measured_s'] * 1e3:.2f} | {r['predicted_s'] * 1e3:.2f} | "
              f"{r['rel_error']:+.1%} |")
    errs = [abs(r["rel_error"]) for r in rows if "rel_error" in r]
    if errs:
        print(f"\n{sum(e <= 0.15 for e in errs)} of {len(errs)} rows within ±15%; "
              f"largest |error| {max(errs):.1%}")


if __name__ == "__main__":
    main()
