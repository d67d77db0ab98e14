"""The cost model (distnn.costmodel.predict) against the throughput part of
benchmarks/cluster.py: for every N-host row of its --json file, the step time the model
predicts for what was emulated (the compute of the 1-host row, slowed N/C times when N
hosts share C cores; the link as shaped, scaled when the run had --scale-links) next to
the measured one, and the error.

    python benchmarks/cluster.py --part throughput --hosts 2 4 8 --scale-links --json c.json
    python benchmarks/costmodel_check.py c.json [--latency-us 50]

A run with ``--compression SPEC`` (the workers' --gradient_compression) is checked against
the model of that compression (its JSON records which).

Each row is predicted twice: without the exchange's own CPU (the model as before) and
with it (``distnn.costmodel.cpu``: the Reducer's work per step measured here, in this
run, on the model's tensors over a phantom communicator of N ranks, and TCP's CPU per
message and byte measured on 127.0.0.1; printed), both slowed N/C times as the compute.
``--no-cpu`` skips the calibration.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import replace
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


def _net(model: str):
    from distnn.models import get_model
    return get_model(model, input_shape=SHAPES[model], num_classes=10)


def calibrate(raw: dict, compression: str, overlap_link: bool = True) -> dict:
    """{model: CpuCost} for the models and host counts of ``raw``'s rows."""
    from distnn.costmodel.cpu import calibrate_cpu
    from distnn.distributed.optimizer import parameter_tensors
    hosts: dict = {}
    for key in raw["throughput"]:
        model, n, _ = key.split("/")
        if int(n) > 1:
            hosts.setdefault(model, set()).add(int(n))
    out = {}
    for model, counts in sorted(hosts.items()):
        net = _net(model)
        out[model] = calibrate_cpu(parameter_tensors(net),
                                   [(ly.name, lo, hi) for ly, lo, hi in net.layer_ranges()],
                                   specs=[compression], hosts=sorted(counts),
                                   overlap_link=overlap_link)
    return out


def check(raw: dict, latency_s: float, cores: int, scale: bool,
          compression: str = "none", cpu: dict | None = None) -> list[dict]:
    """One row per measured N-host row of ``raw["throughput"]``: measured and predicted
    step seconds and the relative error (predicted / measured - 1); with ``cpu``
    ({model: CpuCost}) also ``predicted_cpu_s``, ``rel_error_cpu`` (with the term)."""
    from distnn.costmodel.predict import Config, Link, ModelCost, predict
    from distnn.distributed.optimizer import parameter_tensors
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
        net = _net(model)
        batch = recs[0].get("batch_per_rank", 64)
        slow = max(1.0, hosts / cores)
        cost = ModelCost(base * slow, parameter_tensors(net), batch=batch,
                         segments=[(ly.name, lo, hi) for ly, lo, hi in net.layer_ranges()])
        shaped = opts.link_rate(rate, hosts, scale, cores)
        link = Link(opts.parse_rate(shaped) / 1e9, latency_s)
        pred = predict(Config("data", compression), cost, hosts, link).step_s
        row = {"row": key, "link": shaped, "compute_s": cost.compute_s,
               "measured_s": measured, "predicted_s": pred, "rel_error": pred / measured - 1}
        if cpu is not None:
            with_cpu = replace(cost, cpu=cpu[model], slowdown=slow)
            p = predict(Config("data", compression), with_cpu, hosts, link).step_s
            row.update(predicted_cpu_s=p, rel_error_cpu=p / measured - 1)
        out.append(row)
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
    ap.add_argument("--no-cpu", action="store_true", help="skip the exchange's CPU term "
                    "(no calibration)")
    ap.add_argument("--cpu-additive", action="store_true", help="add a transfer's TCP CPU "
                    "to its time on the link instead of taking the longer of the two")
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
    cpu = None if args.no_cpu else calibrate(raw, compression, not args.cpu_additive)
    rows = check(raw, args.latency_us * 1e-6, cores, scale, compression, cpu)
    print(f"cost model vs measured, --parallel data, compression {compression}, {cores} "
          f"cores, links {'scaled' if scale else 'as named'}, latency {args.latency_us:g} us\n")
    for model, cost in sorted((cpu or {}).items()):
        print(f"the exchange's CPU, calibrated here ({model}; ms a step on one core, "
              f"before + after the last bucket starts):\n{cost.describe()}\n")
    extra = " with CPU ms | error |" if cpu else ""
    print("| row | link shaped | compute ms | measured ms | predicted ms | error |" + extra)
    print("|---|---|---|---|---|---|" + ("---|---|" if cpu else ""))
    for r in rows:
        if "error" in r:
            print(f"| {r['row']} | failed: {r['error']} | | | | |" + (" | |" if cpu else ""))
            continue
        more = (f" {r['predicted_cpu_s'] * 1e3:.2f} | {r['rel_error_cpu']:+.1%} |"
                if cpu else "")
        print(f"| {r['row']} | {r['link']} | {r['compute_s'] * 1e3:.2f} | "
              f"{r['measured_s'] * 1e3:.2f} | {r['predicted_s'] * 1e3:.2f} | "
              f"{r['rel_error']:+.1%} |" + more)
    for key, what in (("rel_error", "without the CPU term"), ("rel_error_cpu", "with it")):
        errs = [abs(r[key]) for r in rows if key in r]
        if errs:
            print(f"\n{what}: {sum(e <= 0.15 for e in errs)} of {len(errs)} rows within "
                  f"±15%; largest |error| {max(errs):.1%}")


if __name__ == "__main__":
    main()
