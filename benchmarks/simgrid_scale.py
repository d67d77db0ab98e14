"""The analytic cost model against the SimGrid replay (distnn.costmodel.simulate) at 16 to
1,024 hosts: every rule and compression of ``DEFAULT_CONFIGS``, per link (the fabrics of
``simulate.FABRICS``: 1 Gbit/s and 10 Gbit/s Ethernet over TCP, 100 Gbit/s InfiniBand) and
per topology (a two-level full-bisection fat tree, a 2-D/3-D torus), one rank a host. A
platform is one replay process (all configurations, one after the other); rows are
appended to ``--json`` as they finish, so a cut run keeps what it has.

    python benchmarks/simgrid_scale.py --json results/simgrid.jsonl          # runs
    python benchmarks/simgrid_scale.py --report results/simgrid.jsonl \\
        --plot docs/simgrid_scale.png                                         # table + plot

    python benchmarks/simgrid_scale.py --emulated benchmarks/RESULTS.md    # table (a)

``--emulated`` reads the 2- and 4-host rows of the emulated cluster's throughput table in
RESULTS.md ("Across hosts on the emulated cluster", simplecnn, dense and each
compression) and puts the analytic model and the replay (a crossbar of the emulated
bridge's links, the link as shaped, 50 us a message, the one-process compute slowed N/2
times as N hosts share 2 cores) next to each measured step.

Needs SimGrid's Python bindings (``scripts/setup.sh --simgrid``).
"""
from __future__ import annotations

import argparse
import json
import time
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # cluster_opts

SHAPES = {"simplecnn": ((1, 28, 28), 10), "resnet20": ((3, 32, 32), 10),
          "vgg11bn": ((3, 32, 32), 10)}


def _cost(model: str, compute_s: float | None, batch: int):
    from distnn.cli.plan import measure
    from distnn.costmodel.predict import ModelCost
    from distnn.distributed.optimizer import parameter_tensors
    from distnn.models import get_model
    shape, classes = SHAPES[model]
    net = get_model(model, input_shape=shape, num_classes=classes)
    c = compute_s or measure(net, batch, 5)
    return ModelCost(c, parameter_tensors(net), batch=batch, segments=[
        (layer.name, lo, hi) for layer, lo, hi in net.layer_ranges()])


def run(args) -> None:
    from dataclasses import replace

    from distnn.costmodel.predict import DEFAULT_CONFIGS, predict
    from distnn.costmodel.simulate import FABRICS, simulate
    cost = _cost(args.model, args.compute_s, args.batch)
    print(f"{args.model}: {cost.size:,} parameters, compute {cost.compute_s * 1e3:.2f} ms "
          f"a step of {cost.batch}")
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    for hosts in args.hosts:  # small platforms first: a cut run has every fabric at them
        for topology in args.topologies:
            for gbits in args.links:
                fabric = FABRICS[float(gbits)]
                t = time.perf_counter()
                sims = simulate(DEFAULT_CONFIGS, cost, hosts, fabric.link,
                                topology=topology, hop_latency_s=fabric.hop_s)
                wall = time.perf_counter() - t
                link = replace(fabric.link, topology=topology, hop_s=fabric.hop_s)
                with out.open("a") as f:
                    for s in sims:
                        a = predict(s.config, cost, hosts, link)
                        f.write(json.dumps({
                            "model": args.model, "compute_s": cost.compute_s,
                            "topology": topology, "gbits": gbits, "fabric": fabric.name,
                            "alpha_s": fabric.alpha_s, "hop_s": fabric.hop_s,
                            "hosts": hosts, "config": s.config.label,
                            "analytic_s": a.step_s, "simulated_s": s.step_s,
                            "analytic_eff": a.efficiency, "simulated_eff": s.efficiency,
                            "wall_s": wall}) + "\n")
                print(f"{topology} {gbits:g} Gbit/s {hosts} hosts: {wall:.1f} s", flush=True)


COMPRESSIONS = ("none", "fp16", "topk:0.01", "powersgd:2")
RULE_ROWS = ("partial", "localsgd", "easgd", "downpour", "gossip")
SECTION = "## Across hosts on the emulated cluster"
RATES = ("1gbit", "10gbit")
HEADER = ("| hosts x ranks | configuration | compute ms | α us | shared memory ms | "
          + " | ".join(f"{r} measured ms (runs) | analytic ms (error) | simulated ms (error)"
                       for r in RATES) + " |")


def _configs() -> dict:
    from distnn.costmodel.predict import Config
    out = [Config("data", c) for c in COMPRESSIONS] + [Config(r) for r in RULE_ROWS]
    return {c.label: c for c in out}


def _med(values):
    import statistics
    return statistics.median(values) if values else None


def _shaped(rate: str, hosts: int) -> str:
    import cluster_opts as opts
    return opts.link_rate(rate, hosts, True, 2)


def pool_emulated(paths) -> dict:
    """The emulated rows and their inputs from benchmarks/cluster.py --part throughput
    --json files (one compression or --parallel rule each, repetitions pooled),
    benchmarks/cluster_probe.py --json files (α: the 4-byte all-reduce) and
    cluster_probe.py --compute --json files (the compute of N hosts)."""
    import statistics
    from distnn.costmodel.predict import Config
    runs, alphas, copies = {}, {}, {}
    for path in paths:
        raw = json.loads(Path(path).read_text())
        if "throughput" in raw:
            meta = raw.get("meta", {})
            rule = meta.get("parallel")
            cfg = (Config(rule) if rule not in (None, "data")
                   else Config("data", meta.get("compression", "none"))).label
            for key, recs in raw["throughput"].items():
                _, hosts, rate = key.split("/")
                for r in recs:
                    if "error" not in r:
                        runs.setdefault((cfg, int(hosts), rate), []).append(
                            statistics.median(r["step_s"]))
            continue
        for key, rec in raw.get("rows", {}).items():
            if "error" in rec:
                continue
            if key.startswith("compute/"):
                # the mean step of a copy: ranks of a synchronous step that share a core
                # start together and finish together (the core does both ranks' work), so
                # the slowest of N uncoupled copies, step by step (max_mean_s: copies out
                # of phase), overstates it (4 hosts on 2 cores: 12.1 against 9.7 ms, and
                # the shared-memory step, exchange included, 11.0 ms)
                copies.setdefault(int(key.split("/")[1]), []).append(
                    rec.get("mean_s", rec.get("max_mean_s")))
            else:
                hosts, rate = key.split("/")
                if rate != "shm" and int(hosts) > 1:
                    rounds = max(1, int(hosts).bit_length() - 1)  # recursive doubling
                    alphas.setdefault(int(hosts), []).append(
                        max(rec["allreduce_s"]["4"]) / rounds)
    rows = []
    for (cfg, hosts, rate), steps in sorted(runs.items(), key=lambda kv: (
            list(_configs()).index(kv[0][0]) if kv[0][0] in _configs() else 99,
            kv[0][2] == "10gbit", kv[0][1])):
        if hosts == 1 or rate in ("shm", "None"):
            continue
        one = _med(runs.get((cfg, 1, "None"), []))
        # the compute of N hosts sharing the cores (N copies at once, the slowest), in
        # proportion to this configuration's own one-process step
        c = _med(copies.get(hosts, [])) * one / _med(copies[1]) if one else None
        rows.append({"hosts": hosts, "link": f"{rate} as {_shaped(rate, hosts)}"
                     if _shaped(rate, hosts) != rate else rate, "config": cfg,
                     "measured_s": _med(steps), "runs": len(steps),
                     "shm_s": _med(runs.get((cfg, hosts, "shm"), [])), "compute_s": c,
                     "alpha_s": _med(alphas.get(hosts, []))})
    return {"rows": rows}


def parse_emulated(text: str) -> list[dict]:
    """The rows of the emulated table in RESULTS.md's section (the inputs of each row):
    a line a host count and configuration, a group of cells a link rate."""
    import cluster_opts as opts
    section = text.split(SECTION)[1].split("\n## ")[0]
    rows = []
    for ln in section.splitlines():
        cells = [c.strip() for c in ln.strip().strip("|").split("|")]
        if len(cells) != 5 + 3 * len(RATES) or not cells[0][:1].isdigit():
            continue
        hosts = int(cells[0].split()[0])
        for i, rate in enumerate(RATES):
            got = cells[5 + 3 * i]
            if got in ("-", "") or got.startswith("failed"):
                continue
            shaped = opts.link_rate(rate, hosts, True, 2)
            rows.append({"hosts": hosts, "config": cells[1],
                         "link": rate if shaped == rate else f"{rate} as {shaped}",
                         "compute_s": float(cells[2]) / 1e3, "alpha_s": float(cells[3]) / 1e6,
                         "shm_s": None if cells[4] == "-" else float(cells[4]) / 1e3,
                         "measured_s": float(got.split()[0]) / 1e3,
                         "runs": int(got.split("(")[1].rstrip(")"))})
    if not rows:
        raise SystemExit(f"benchmarks/simgrid_scale.py: no rows of the emulated table "
                         f"under {SECTION!r}")
    return rows


def sleep_overshoot(request_s: float = 1e-4, count: int = 200) -> float:
    """How much longer than asked a short ``time.sleep`` takes here (the median), the
    timer's share of a master rule's polls (predict's ``sleep_overshoot_s``)."""
    import statistics
    import time
    took = []
    for _ in range(count):
        t0 = time.perf_counter()
        time.sleep(request_s)
        took.append(time.perf_counter() - t0 - request_s)
    return max(0.0, statistics.median(took))


def emulated_check(rows: list[dict], simulate_too: bool = True, cpu=None) -> list[dict]:
    """Each row's analytic (with the exchange's CPU, calibrated here unless given, and the
    shaped links' token bucket) and simulated step, and their errors."""
    from dataclasses import replace

    from distnn.cluster.emulated import tbf_burst_bytes
    from distnn.costmodel.predict import Link, predict
    from distnn.costmodel.simulate import simulate
    configs = _configs()
    base = _cost("simplecnn", 0.01, 64)
    if cpu is None:
        from distnn.costmodel.cpu import calibrate_cpu
        cpu = calibrate_cpu(base.tensors, base.segments, specs=COMPRESSIONS,
                            hosts=sorted({r["hosts"] for r in rows}))
    overshoot = sleep_overshoot()
    out = []
    for r in rows:
        cfg, hosts = configs[r["config"]], r["hosts"]
        shaped = r["link"].split(" as ")[-1].strip()
        link = Link(_rate_gbits(shaped), r["alpha_s"], burst_bytes=tbf_burst_bytes(shaped))
        cost = replace(base, compute_s=r["compute_s"], cpu=cpu, slowdown=max(1.0, hosts / 2),
                       sleep_overshoot_s=overshoot)
        a = predict(cfg, cost, hosts, link).step_s
        sim = None
        if simulate_too:
            [res] = simulate([cfg], replace(base, compute_s=r["compute_s"]), hosts,
                             Link(link.gbits, link.latency_s), topology="flat",
                             hop_latency_s=0.0)
            sim = res.step_s
        out.append({**r, "analytic_s": a, "simulated_s": sim})
    return out


def print_emulated(rows: list[dict]) -> None:
    print(HEADER)
    print("|---|---|---|---|---|" + "---|---|---|" * len(RATES))
    within = {"analytic_s": 0, "simulated_s": 0}
    lines: dict = {}
    for r in rows:
        errs = {}
        for k in within:
            if r.get(k):
                errs[k] = r[k] / r["measured_s"] - 1
                within[k] += abs(errs[k]) <= 0.15
        key = (r["hosts"], r["config"])
        line = lines.setdefault(key, {"first": r, "cells": {}})
        sim = (f"{r['simulated_s'] * 1e3:.2f} ({errs['simulated_s']:+.1%})"
               if "simulated_s" in errs else "-")
        line["cells"][r["link"].split(" as ")[0]] = (
            f"{r['measured_s'] * 1e3:.2f} ({r['runs']}) | {r['analytic_s'] * 1e3:.2f} "
            f"({errs['analytic_s']:+.1%}) | {sim}")
    for (hosts, cfg), line in lines.items():
        r = line["first"]
        shm = f"{r['shm_s'] * 1e3:.2f}" if r.get("shm_s") else "-"
        cells = " | ".join(line["cells"].get(rate, "- | - | -") for rate in RATES)
        print(f"| {hosts} x 1 | {cfg} | {r['compute_s'] * 1e3:.2f} | "
              f"{r['alpha_s'] * 1e6:.1f} | {shm} | {cells} |")
    print(f"\nwithin ±15%: analytic {within['analytic_s']} of {len(rows)}, simulated "
          f"{within['simulated_s']} of {len(rows)}")


def _rate_gbits(text: str) -> float:
    shaped = text.split(" as ")[-1].strip()
    return float(shaped[:-4]) if shaped.endswith("gbit") else float(shaped[:-4]) / 1000


def emulated(args) -> None:
    if args.emulated.endswith(".md"):
        rows = parse_emulated(Path(args.emulated).read_text())
    else:
        rows = pool_emulated([args.emulated, *args.more])["rows"]
    print_emulated(emulated_check(rows, not args.no_simulate))


def report(args) -> None:
    rows = [json.loads(line) for line in Path(args.report).read_text().splitlines() if line]
    print("| topology | link | configuration | hosts | analytic ms | simulated ms | error "
          "| analytic eff | simulated eff |")
    print("|---|---|---|---|---|---|---|---|---|")
    within = 0
    for r in rows:
        err = r["analytic_s"] / r["simulated_s"] - 1
        within += abs(err) <= 0.10
        print(f"| {r['topology']} | {r['gbits']:g} | {r['config']} | {r['hosts']} | "
              f"{r['analytic_s'] * 1e3:.2f} | {r['simulated_s'] * 1e3:.2f} | {err:+.1%} | "
              f"{r['analytic_eff']:.0%} | {r['simulated_eff']:.0%} |")
    print(f"\n{within} of {len(rows)} rows within ±10%.")
    hosts = sorted({r["hosts"] for r in rows})
    print("\nCompact: simulated efficiency (analytic error against the replay) per host count\n")
    print("| topology | link Gbit/s | configuration | " + " | ".join(f"{h}" for h in hosts)
          + " |")
    print("|---|---|---|" + "---|" * len(hosts))
    keys = dict.fromkeys((r["topology"], r["gbits"], r["config"]) for r in rows)
    for topo, g, cfg in keys:
        cells = []
        for h in hosts:
            got = [r for r in rows if (r["topology"], r["gbits"], r["config"], r["hosts"])
                   == (topo, g, cfg, h)]
            cells.append(f"{got[0]['simulated_eff']:.0%} "
                         f"({got[0]['analytic_s'] / got[0]['simulated_s'] - 1:+.1%})"
                         if got else "-")
        print(f"| {topo} | {g:g} | {cfg} | " + " | ".join(cells) + " |")
    walls = {(r["topology"], r["gbits"], r["hosts"]): r["wall_s"] for r in rows}
    print("\nreplay wall seconds (all configurations of a platform, this machine):")
    for key, wall in sorted(walls.items()):
        print(f"  {key[0]} {key[1]:g} Gbit/s {key[2]} hosts: {wall:.1f}")
    if args.plot:
        _plot(rows, args.plot)


def _plot(rows, path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    topologies = sorted({r["topology"] for r in rows})
    links = sorted({r["gbits"] for r in rows})
    fig, axes = plt.subplots(len(topologies), len(links), figsize=(4.2 * len(links),
                             3.4 * len(topologies)), squeeze=False, sharey=True)
    for i, topo in enumerate(topologies):
        for j, g in enumerate(links):
            ax = axes[i][j]
            sub = [r for r in rows if r["topology"] == topo and r["gbits"] == g]
            for k, cfg in enumerate(dict.fromkeys(r["config"] for r in sub)):
                pts = sorted((r["hosts"], r) for r in sub if r["config"] == cfg)
                hs = [h for h, _ in pts]
                line, = ax.plot(hs, [r["simulated_eff"] for _, r in pts], marker="o",
                                label=cfg, color=f"C{k}")
                ax.plot(hs, [r["analytic_eff"] for _, r in pts], ls="--", color=f"C{k}")
            ax.set_xscale("log", base=2)
            ax.set_title(f"{topo.replace('_', ' ')}, {g:g} Gbit/s", fontsize=9)
            ax.set_xlabel("hosts")
            ax.grid(alpha=0.3)
        axes[i][0].set_ylabel("scaling efficiency")
    axes[0][-1].legend(fontsize=6, loc="lower left")
    fig.suptitle(f"{rows[0]['model']}: simulated (solid) vs analytic (dashed)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="simplecnn", choices=sorted(SHAPES))
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--compute_s", type=float, default=None,
                   help="compute per step (default: measured here)")
    p.add_argument("--hosts", type=int, nargs="+", default=[16, 64, 256, 1024])
    p.add_argument("--links", type=float, nargs="+", default=[1.0, 10.0, 100.0])
    p.add_argument("--topologies", nargs="+", default=["fat_tree", "torus"])
    p.add_argument("--json", default="results/simgrid.jsonl")
    p.add_argument("--report", default=None, help="print the table of this file instead")
    p.add_argument("--plot", default=None)
    p.add_argument("--emulated", default=None, metavar="RESULTS.md",
                   help="table (a): the emulated cluster's rows in this file's section "
                        "(or, a .json, the runs of benchmarks/cluster.py and "
                        "cluster_probe.py: that file and the others given)")
    p.add_argument("more", nargs="*", help="--emulated: more .json files")
    p.add_argument("--no-simulate", action="store_true",
                   help="--emulated: the analytic model only (no SimGrid)")
    args = p.parse_args()
    if args.emulated:
        emulated(args)
    else:
        report(args) if args.report else run(args)


if __name__ == "__main__":
    main()
