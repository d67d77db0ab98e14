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
from pathlib import Path

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


def _rate_gbits(text: str) -> float:
    shaped = text.split(" as ")[-1].strip()
    return float(shaped[:-4]) if shaped.endswith("gbit") else float(shaped[:-4]) / 1000


def emulated(args) -> None:
    from dataclasses import replace

    from distnn.costmodel.predict import Config, Link, predict
    from distnn.costmodel.simulate import simulate
    text = Path(args.emulated).read_text()
    section = text.split("## Across hosts on the emulated cluster")[1].split("\n## ")[0]
    rows = [[c.strip() for c in ln.strip().strip("|").split("|")]
            for ln in section.splitlines() if ln.startswith("| simplecnn | ")]
    one = next(r for r in rows if r[1] == "1 x 1")
    compute = {c: 64 / float(one[3 + i].split()[0]) for i, c in enumerate(COMPRESSIONS)}
    base = _cost("simplecnn", 0.01, 64)
    print("| hosts | link (as shaped) | compression | measured ms | analytic ms | error "
          "| simulated ms | error |")
    print("|---|---|---|---|---|---|---|---|")
    within = {"analytic": 0, "simulated": 0}
    count = 0
    for r in rows:
        hosts = int(r[1].split()[0])
        if hosts not in (2, 4) or "one host" in r[2]:
            continue
        link = Link(_rate_gbits(r[2]), 50e-6)
        for i, comp in enumerate(COMPRESSIONS):
            measured = hosts * 64 / float(r[3 + i].split()[0])
            cost = replace(base, compute_s=compute[comp] * max(1.0, hosts / 2))
            cfg = Config("data", comp)
            a = predict(cfg, cost, hosts, link).step_s
            [sim] = simulate([cfg], cost, hosts, link, topology="flat", hop_latency_s=0.0)
            ea, es = a / measured - 1, sim.step_s / measured - 1
            within["analytic"] += abs(ea) <= 0.15
            within["simulated"] += abs(es) <= 0.15
            count += 1
            print(f"| {hosts} | {r[2]} | {comp} | {measured * 1e3:.2f} | {a * 1e3:.2f} | "
                  f"{ea:+.1%} | {sim.step_s * 1e3:.2f} | {es:+.1%} |")
    print(f"\nwithin ±15%: analytic {within['analytic']} of {count}, simulated "
          f"{within['simulated']} of {count}")


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
                   help="table (a): the emulated cluster's measured rows in this file")
    args = p.parse_args()
    if args.emulated:
        emulated(args)
    else:
        report(args) if args.report else run(args)


if __name__ == "__main__":
    main()
