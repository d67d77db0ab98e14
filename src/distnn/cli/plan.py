"""``distnn plan``: the cost model's prediction (``distnn.costmodel.predict``) for the
user's own model: its compute per step measured here, one process, a few steps of the step
``distnn train`` takes; each rule and compression's step time and scaling efficiency on
``--hosts`` hosts x 1 rank joined by ``--link_gbits`` links; and the configuration it
would pick. A model, not a measurement: docs/costmodel.md says what it leaves out.
With ``--simulate`` each configuration's step is also replayed in SimGrid
(``distnn.costmodel.simulate``) on a generated fat tree, torus or crossbar, and printed
next to the model's with the simulator's pick (rule, compression, bucket size).
"""
from __future__ import annotations

import argparse
import json
import time

from ..run import RunError

__all__ = ["add_plan_parser", "run_plan", "parse_hosts"]

SHAPES = {"fashion_mnist": ((1, 28, 28), 10), "mnist": ((1, 28, 28), 10),
          "cifar10": ((3, 32, 32), 10), "cifar100": ((3, 32, 32), 100)}


def parse_hosts(text: str) -> list[int]:
    """'2,4,8' or '2-1024' (the powers of two from 2 to 1024) or a mix; sorted, unique."""
    out: set[int] = set()
    for part in [p.strip() for p in str(text).split(",") if p.strip()]:
        lo, _, hi = part.partition("-")
        if not (lo.isdigit() and (not hi or hi.isdigit())) or int(lo) < 1 or \
                (hi and int(hi) < int(lo)):
            raise RunError(f"--hosts: {part!r} is not a host count or a range A-B (A <= B, "
                           "both >= 1); e.g. --hosts 2,4,8 or --hosts 2-1024")
        if not hi:
            out.add(int(lo))
            continue
        n = 1
        while n <= int(hi):
            if n >= int(lo):
                out.add(n)
            n *= 2
        out.update({int(lo), int(hi)})
    if not out:
        raise RunError("--hosts: give at least one host count, e.g. --hosts 2-1024")
    return sorted(out)


def _floats(option: str, text: str) -> list[float]:
    try:
        values = [float(v) for v in str(text).split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or not all(v > 0 for v in values):
        raise RunError(f"{option}: give numbers > 0 separated by commas, got {text!r}")
    return values


def add_plan_parser(sub) -> argparse.ArgumentParser:
    """Add the ``plan`` subcommand to the ``distnn`` subparsers."""
    text = "predict step time and scaling of each rule and compression on N hosts"
    p = sub.add_parser("plan", help=text, allow_abbrev=False, description=text[0].upper() +
                       text[1:] + " from this model's compute, measured here, and a link rate "
                       "(a cost model, docs/costmodel.md; not a measurement).")
    p.add_argument("--model", default="simplecnn", help="Zoo name or model file, as for "
                   "train. Default: simplecnn.")
    p.add_argument("--dataset", default="fashion_mnist", choices=sorted(SHAPES),
                   help="Gives the input shape and classes. Default: fashion_mnist.")
    p.add_argument("--batch_size", "--batch-size", type=int, default=64, metavar="N",
                   help="Samples per rank per step. Default: 64.")
    p.add_argument("--hosts", default="2-1024", help="Host counts (1 rank each): '2,4,8' or "
                   "'2-1024' (powers of two). Default: 2-1024.")
    p.add_argument("--link_gbits", "--link-gbits", default="1,10,100", metavar="G,...",
                   help="Link rates in Gbit/s, one table each. Default: 1,10,100.")
    p.add_argument("--latency_us", "--latency-us", type=float, default=50.0, metavar="US",
                   help="Latency of one message on a link. Default: 50.")
    p.add_argument("--steps", type=int, default=5, metavar="N",
                   help="Timed steps (after 2 untimed) of the compute measurement; the "
                   "median is used. Default: 5.")
    p.add_argument("--compute_s", "--compute-s", type=float, default=None, metavar="S",
                   help="Compute per step in seconds, measured elsewhere (skips measuring).")
    p.add_argument("--efficiency", type=float, default=0.9, metavar="E",
                   help="The pick: the fastest exact configuration (data, fp16) when it "
                   "scales at least this well, else the fastest compressed one, else the "
                   "fastest of all. Default: 0.9.")
    p.add_argument("--cpu", action="store_true", help="Also count the CPU the exchange takes "
                   "on each host's core (the Reducer's compression, error feedback, casts and "
                   "sums, timed here on this model's tensors; TCP's per-message and per-byte "
                   "work, timed on 127.0.0.1): docs/costmodel.md. Adds a few seconds.")
    p.add_argument("--simulate", action="store_true", help="Also replay each configuration's "
                   "step in SimGrid (python3-simgrid) on a generated --topology of --hosts "
                   "hosts: its buckets, compressions and each collective as MPICH's algorithm "
                   "sends it, point to point; prints analytic and simulated step, the error, "
                   "and the rule, compression and bucket size it would pick.")
    p.add_argument("--topology", default="fat_tree", choices=("fat_tree", "torus", "flat"),
                   help="The simulated network (--simulate): a two-level full-bisection fat "
                   "tree, a 2-D/3-D torus, or one crossbar; the analytic step next to the "
                   "simulated one counts a torus's hops and shared links. Default: fat_tree.")
    p.add_argument("--hop_latency_us", "--hop-latency-us", type=float, default=0.5,
                   metavar="US", help="Latency of each link a simulated message crosses "
                   "(--simulate); --latency_us stays the end-to-end latency of two "
                   "neighbours. Default: 0.5.")
    p.add_argument("--json", default=None, metavar="FILE", help="Also write every prediction "
                   "here.")
    return p


def measure(model, batch: int, steps: int) -> float:
    """Median seconds of forward + loss + backward + SGD update of ``batch`` samples."""
    import numpy as np

    from ..nn.losses import CategoricalCrossEntropy
    from ..optim import SGD
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, *model.input_shape)).astype(model.dtype)
    y = rng.integers(0, model.output_shape[-1], batch)
    opt, loss = SGD(model, lr=0.01, momentum=0.9), CategoricalCrossEntropy()
    times = []
    for i in range(steps + 2):
        t = time.perf_counter()
        _, dy = loss(model.forward(x, training=True), y)
        model.backward(dy)
        opt.step()
        if i >= 2:
            times.append(time.perf_counter() - t)
    return float(np.median(times))


def _model(args):
    shape, classes = SHAPES[args.dataset]
    from ..models import get_model
    from ..models.files import ModelFileError
    from ..run.build import model_from_spec
    spec = args.model
    try:
        if any(spec.endswith(e) for e in (".py", ".onnx", ".json", ".keras")) or ":" in spec:
            return model_from_spec(spec, input_shape=shape, num_classes=classes)
        return get_model(spec, input_shape=shape, num_classes=classes)
    except (ModelFileError, ValueError, KeyError) as exc:
        raise RunError(f"--model {spec!r}: {exc}".replace("\n", " ")) from None


def run_plan(args: argparse.Namespace) -> int:
    from ..costmodel.predict import DEFAULT_CONFIGS, Link, ModelCost, pick, table
    from ..distributed.optimizer import parameter_tensors
    hosts = parse_hosts(args.hosts)
    rates = _floats("--link_gbits", args.link_gbits)
    if not args.latency_us >= 0:
        raise RunError(f"--latency_us: must be >= 0, got {args.latency_us}")
    for option, value in (("--batch_size", args.batch_size), ("--steps", args.steps)):
        if value < 1:
            raise RunError(f"{option}: must be an integer >= 1, got {value}")
    if not 0 < args.efficiency <= 1:
        raise RunError(f"--efficiency: must be in (0, 1], got {args.efficiency}")
    if args.compute_s is not None and not args.compute_s > 0:
        raise RunError(f"--compute_s: must be > 0 seconds, got {args.compute_s}")
    if args.simulate:
        from ..costmodel.simulate import MAX_HOSTS, simgrid_python
        if max(hosts) > MAX_HOSTS:
            raise RunError(f"--hosts: the simulator holds at most {MAX_HOSTS} hosts (a "
                           f"thread each), got {max(hosts)}; drop --simulate beyond it")
        if not 0 <= 2 * args.hop_latency_us <= args.latency_us:
            raise RunError(f"--hop_latency_us: must be in [0, --latency_us/2] = [0, "
                           f"{args.latency_us / 2:g}], got {args.hop_latency_us:g}")
        args.simgrid_python = simgrid_python()
        if args.simgrid_python is None:
            raise RunError("--simulate: SimGrid's Python bindings are not installed "
                           "(apt-get install python3-simgrid, or scripts/setup.sh --simgrid; "
                           "another Python with them: DISTNN_SIMGRID_PYTHON)")
    model = _model(args)
    compute = args.compute_s or measure(model, args.batch_size, args.steps)
    how = "given" if args.compute_s else f"measured here, median of {args.steps} steps"
    cost = ModelCost(compute, parameter_tensors(model), batch=args.batch_size,
                     segments=[(layer.name, lo, hi) for layer, lo, hi in model.layer_ranges()])
    if args.cpu:
        from dataclasses import replace

        from ..costmodel.cpu import calibrate_cpu
        specs = sorted({c.compression for c in DEFAULT_CONFIGS if c.rule == "data"})
        cost = replace(cost, cpu=calibrate_cpu(cost.tensors, cost.segments, specs=specs,
                                               hosts=[h for h in hosts if h > 1] or [2],
                                               steps=3))
    print(f"distnn plan: {args.model} on {args.dataset}, batch {args.batch_size} per rank, "
          f"{cost.size:,} parameters ({cost.size * cost.itemsize / 1e6:.2f} MB of gradients), "
          f"compute {compute * 1e3:.2f} ms a step ({how}); {args.latency_us:g} us a message. "
          "Predicted by the cost model (docs/costmodel.md), not measured.")
    if cost.cpu is not None:
        print("With the exchange's CPU on each host's core, calibrated here (ms a step, "
              "compressing + the rest):\n" + cost.cpu.describe())
    rows, picks = [], []
    for gbits in rates:
        link = Link(gbits, args.latency_us * 1e-6)
        preds = table(DEFAULT_CONFIGS, cost, hosts, link)
        rows += [(gbits, p) for p in preds]
        print(f"\n### {gbits:g} Gbit/s links: step ms (scaling efficiency)\n")
        print("| configuration | " + " | ".join(f"{h} hosts" for h in hosts) + " |")
        print("|---|" + "---|" * len(hosts))
        for cfg in DEFAULT_CONFIGS:
            cells = [p for p in preds if p.config == cfg]
            print(f"| {cfg.label} | " + " | ".join(
                f"{p.step_s * 1e3:.2f} ({p.efficiency:.0%})" for p in cells) + " |")
        best = [pick([p for p in preds if p.hosts == h], args.efficiency) for h in hosts]
        print("| **pick** | " + " | ".join(b.config.label for b in best) + " |")
        picks.append((gbits, best[-1]))
    print()
    for gbits, b in picks:
        print(f"pick at {b.hosts} hosts on {gbits:g} Gbit/s: {b.config.label} "
              f"({b.step_s * 1e3:.2f} ms a step, {b.samples_per_s:,.0f} samples/s, "
              f"efficiency {b.efficiency:.0%})")
    print(f"The pick: exact updates (data, fp16) when they reach {args.efficiency:.0%} "
          "efficiency, else compressed gradients (topk, powersgd), else the fastest rule "
          "whose replicas drift (partial, localsgd, easgd, downpour, gossip). The model "
          "counts step time only: check accuracy per epoch on your data before switching.")
    simulated = _simulate(args, cost, hosts, rates) if args.simulate else []
    if args.json:
        with open(args.json, "w") as f:
            cpu = cost.cpu and {"tcp_message_s": cost.cpu.tcp_message_s,
                                "tcp_byte_s": cost.cpu.tcp_byte_s, "steps": cost.cpu.steps}
            json.dump({"compute_s": compute, "batch": args.batch_size, "params": cost.size,
                       "cpu": cpu,
                       "latency_s": args.latency_us * 1e-6, "rows": [
                           {"gbits": g, "config": p.config.label, "rule": p.config.rule,
                            "compression": p.config.compression, "hosts": p.hosts,
                            "step_s": p.step_s, "efficiency": p.efficiency,
                            "samples_per_s": p.samples_per_s,
                            "bytes_per_step": p.bytes_per_step} for g, p in rows],
                       "picks": [{"gbits": g, "hosts": b.hosts, "config": b.config.label}
                                 for g, b in picks],
                       "simulated": simulated}, f, indent=1)
    return 0


BUCKET_SIZES_MB = (0.25, 1.0, 4.0, 16.0, 64.0)


def _bucket_variants(cost, configs) -> list:
    """The data configurations again at the other bucket sizes that change the buckets."""
    from dataclasses import replace

    from ..costmodel.predict import bucket_ranges
    out = []
    for cfg in [c for c in configs if c.rule == "data"]:
        seen = [bucket_ranges(cfg, cost)]
        for mb in BUCKET_SIZES_MB:
            alt = replace(cfg, bucket_size_mb=mb)
            if bucket_ranges(alt, cost) not in seen:
                seen.append(bucket_ranges(alt, cost))
                out.append(alt)
    return out


def _simulate(args, cost, hosts, rates) -> list[dict]:
    """``--simulate``: the SimGrid replay of every configuration (and of the data rule at
    the bucket sizes that make other buckets) next to the analytic model; prints a table
    per link rate and the simulator's pick; returns the rows for --json."""
    from dataclasses import replace

    from ..costmodel.predict import DEFAULT_CONFIGS, Link, pick, predict
    from ..costmodel.simulate import SimulatorError, not_replayed, simulate
    configs = DEFAULT_CONFIGS + _bucket_variants(cost, DEFAULT_CONFIGS)
    label = {c: c.label + ("" if c.bucket_size_mb == 4.0 else
                           f", buckets {c.bucket_size_mb:g} MB") for c in configs}
    rows = []
    hop = args.hop_latency_us * 1e-6
    print(f"\nSimulated in SimGrid: {args.topology.replace('_', ' ')}, hosts 1 rank each, "
          f"{args.latency_us:g} us end to end between neighbours, {args.hop_latency_us:g} us "
          "a link crossed; one step (a period for the periodic rules) per configuration.")
    for gbits in rates:
        link = Link(gbits, args.latency_us * 1e-6)
        # the analytic side on the same network: a torus's hops and shared links
        on_topology = replace(link, topology=args.topology, hop_s=hop)
        sims, skipped = {}, []
        for h in [h for h in hosts if h > 1]:
            t = time.perf_counter()
            why = {c: not_replayed(c, cost, h, link) for c in configs}
            skipped += [f"{label[c]} at {h} hosts: not simulated ({w})"
                        for c, w in why.items() if w]
            try:
                got = simulate([c for c in configs if not why[c]], cost, h, link,
                               topology=args.topology, hop_latency_s=hop,
                               python=args.simgrid_python)
            except SimulatorError as exc:
                raise RunError(str(exc)) from None
            sims[h] = ({s.config: s for s in got}, time.perf_counter() - t)
        print(f"\n### {gbits:g} Gbit/s, simulated: step ms analytic / simulated "
              "(simulated efficiency, error of the analytic)\n")
        print("| configuration | " + " | ".join(f"{h} hosts" for h in sims) + " |")
        print("|---|" + "---|" * len(sims))
        for cfg in configs:
            cells = []
            for h, (got, wall) in sims.items():
                a, s = predict(cfg, cost, h, on_topology), got.get(cfg)
                if s is None:
                    cells.append(f"{a.step_s * 1e3:.2f} / -")
                    continue
                err = a.step_s / s.step_s - 1
                cells.append(f"{a.step_s * 1e3:.2f} / {s.step_s * 1e3:.2f} "
                             f"({s.efficiency:.0%}, {err:+.0%})")
                rows.append({"gbits": gbits, "hosts": h, "topology": args.topology,
                             "config": label[cfg], "rule": cfg.rule,
                             "compression": cfg.compression,
                             "bucket_size_mb": cfg.bucket_size_mb,
                             "analytic_step_s": a.step_s, "simulated_step_s": s.step_s,
                             "analytic_efficiency": a.efficiency,
                             "simulated_efficiency": s.efficiency, "error": err,
                             "simulator_wall_s": wall})
            print(f"| {label[cfg]} | " + " | ".join(cells) + " |")
        print("| simulator wall s | " + " | ".join(f"{w:.1f}" for _, w in sims.values())
              + " |")
        for line in skipped:
            print(line)
        for h, (got, _) in sims.items():
            best = pick(list(got.values()), args.efficiency)  # Simulated has pick's fields
            if h == max(sims):
                print(f"\nsimulated pick at {h} hosts on {gbits:g} Gbit/s "
                      f"({args.topology}): {label[best.config]} "
                      f"(rule {best.config.rule}, compression {best.config.compression}, "
                      f"buckets of {best.config.bucket_size_mb:g} MB; "
                      f"{best.step_s * 1e3:.2f} ms a step, efficiency {best.efficiency:.0%})")
    return rows
