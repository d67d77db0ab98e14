"""distnn across hosts, measured on the emulated cluster (network namespaces on this machine,
links shaped by tbf, MPI over TCP; see distnn.cluster.emulated). Needs root.

    python benchmarks/cluster.py                      # everything, 3 repetitions
    python benchmarks/cluster.py --part throughput --models simplecnn --reps 1

Part "throughput": samples/s of a training step (benchmarks/workers/distnn_worker.py:
forward, loss, backward, DistributedOptimizer over SGD, batch 64 per rank) for each model
on 1 host x 1 rank (the baseline: one emulated host), 2 hosts x 1 rank and, for simplecnn,
4 hosts x 1 rank, at each link rate. Every emulated host gets its own core (``cores=split``;
with 4 hosts on 2 cores, two hosts share each core, so 4-host scaling measures the
network and the protocol, not extra compute). Medians over repetitions, systems and
configurations alternated; bytes per step read off the qdisc counters of every link.
``--parallel RULE`` runs that rule through the Trainer instead of the optimizer loop
(one process: the data rule, the rule's compute alone; a master is not timed).

Part "accuracy" (benchmarks/cluster_accuracy.py): simplecnn on Fashion-MNIST (60000 train,
test split as validation, SGD lr 0.01 momentum 0.9, batch 64 per rank, benchmarks/rules.py's
worker) on 2 hosts x 1 rank (``--acc-hosts N``: N, links scaled with ``--scale-links``):
epochs and training time until the test accuracy first reaches 85%, for each row of
``--rules``: distnn's rules (data; data with fp16, top-k 1% or PowerSGD rank-2 gradients;
partial with 4 chunks; localsgd, easgd, downpour, gossip) and PyTorch DDP (gloo) without
and with its PowerSGD hook (rank 2, the same dense warm-up steps as distnn's), on the same
links (benchmarks/workers/ddp_main_job.py, one torchrun per host, c10d rendezvous on host
1's address).

    python benchmarks/cluster.py --part accuracy --rates 1gbit,10gbit --epochs 4 \
        --rules data,data+fp16,data+topk,data+powersgd,partial,localsgd,ddp,ddp+powersgd
    python benchmarks/cluster.py --part accuracy --smoke --rates 1gbit --rules partial,ddp

Options of issue 43 (benchmarks/cluster_opts.py): ``--eval-every K`` evaluates rank 0's
replica on a fixed held-out set (the first ``--eval-samples`` test images) every K steps, so
the time to target is located within K steps (column "time to target, every K steps");
every table starts with the network-free rows (the same ranks on one host, shared memory;
``--no-network-free`` drops them); ``--scale-links`` shapes the links of N hosts on C cores
to rate x C/N (8 hosts on 2 cores: "1gbit as 250mbit"), the compute-to-communication ratio
of one-core nodes; ``--hosts 2 4 8`` sets the throughput part's host counts.

``--ranks-per-host R`` (throughput part, default 1): R ranks on every emulated host (the
cores of a host are shared by its R ranks; 2 hosts x 2 ranks on 2 cores: 2 ranks a core), the
1-host row is 1 host x R ranks and the network-free row the same N x R ranks on one host.
Link scaling (``--scale-links``) still counts hosts, not ranks. The JSON file's
``meta["ranks_per_host"]`` (and every throughput record's ``"ranks_per_host"``) is R; the
keys stay ``model/hosts/rate``, so a row of key ``simplecnn/2/1gbit`` in a file with
``ranks_per_host`` 2 is 2 hosts x 2 ranks = 4 ranks. Files without the key are R = 1.

Every measurement checks that its data crossed the links (bytes sent >= what the
gradients alone need); a run that did not is reported as failed, never as a number.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

try:
    from benchmarks import cluster_opts as opts
    from benchmarks.cluster_accuracy import DDP_RUNS, ROWS, accuracy_part
except ImportError:  # run as a script: benchmarks/ is on sys.path
    import cluster_opts as opts
    from cluster_accuracy import DDP_RUNS, ROWS, accuracy_part

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MARKER = "BENCH_JSON "


def host_load() -> dict:
    """Steal and the load of other processes right now (the host is shared)."""
    with open("/proc/stat") as f:
        cpu = [int(v) for v in f.readline().split()[1:]]
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    return {"steal_ticks": cpu[7] if len(cpu) > 7 else 0, "total_ticks": sum(cpu),
            "loadavg": load}


def steal_share(a: dict, b: dict) -> float:
    total = b["total_ticks"] - a["total_ticks"]
    return (b["steal_ticks"] - a["steal_ticks"]) / total if total else 0.0


def run_throughput(model: str, hosts: int, rate: str | None, args) -> dict:
    rph = getattr(args, "ranks_per_host", 1)
    if rate == opts.NETWORK_FREE:
        rec = opts.run_throughput_local(model, hosts * rph, args)
        return rec if "error" in rec else dict(rec, ranks_per_host=rph)
    with opts.cluster(hosts, opts.link_rate(rate, hosts, args.scale_links)) as c:
        cmd = opts.throughput_worker(model, args, master=c.hosts[0].address)
        before = c.link_bytes()
        t0 = host_load()
        proc = subprocess.run(c.mpiexec(cmd, ranks_per_host=rph), env=c.env(),
                              capture_output=True, text=True, timeout=1800, cwd=ROOT)
        t1 = host_load()
        from distnn.cluster import total_sent
        sent = total_sent(before, c.link_bytes())
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith(MARKER)), None)
    if proc.returncode != 0 or line is None:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:]
        return {"error": f"exit {proc.returncode}: {tail}"}
    rec = json.loads(line[len(MARKER):])
    steps = args.warmup + args.windows * args.steps
    rec["bytes_per_step"] = sent / steps
    rec["steal"] = steal_share(t0, t1)
    rec["load"] = t1["loadavg"]
    rec["ranks_per_host"] = rph
    # bytes a parameter needs on the wire a step, at least (compressions: far fewer)
    if hosts > 1 and sent < steps * opts.PARAMS[model] * opts.least_bytes(
            args.compression, getattr(args, "parallel", None)):
        return {"error": f"only {sent} bytes crossed the links for {steps} steps: the "
                         "gradients did not travel over the network"}
    return rec


def med(values):
    return statistics.median(values) if values else float("nan")


def throughput_part(args) -> dict:
    configs = []
    for model in args.models:
        configs.append((model, 1, None))
        hosts = args.hosts or ([2, 4] if model == "simplecnn" and not args.no_four else [2])
        if args.network_free:
            configs += [(model, h, opts.NETWORK_FREE) for h in hosts]
        configs += [(model, h, rate) for rate in args.rates for h in hosts]
    runs: dict = {c: [] for c in configs}
    for rep in range(args.reps):
        for conf in configs:
            rec = run_throughput(*conf, args)
            runs[conf].append(rec)
            said = rec.get("error") or f"{med(rec['samples_per_s']):.0f} samples/s"
            print(f"  rep {rep + 1} {conf}: {said}", file=sys.stderr, flush=True)
    print("\n### Throughput on the emulated cluster (samples/s, medians over "
          f"{args.reps} repetitions of the median of {args.windows} windows)\n")
    print("| model | hosts x ranks | link | samples/s | IQR | scaling vs 1 host | "
          "comm wait ms/step | MB on the wire/step | steal |")
    print("|---|---|---|---|---|---|---|---|---|")
    for model in args.models:
        base = None
        for conf in [c for c in configs if c[0] == model]:
            ok = [r for r in runs[conf] if "error" not in r]
            if not ok:
                print(f"| {model} | {conf[1]} x {args.ranks_per_host} | {conf[2] or '-'} | failed: "
                      f"{runs[conf][0]['error']} | | | | | |")
                continue
            sps = [med(r["samples_per_s"]) for r in ok]
            m = med(sps)
            q = statistics.quantiles(sps, n=4) if len(sps) > 1 else [m, m, m]
            if conf[1] == 1:
                base = m
            scale = f"{m / base:.2f}x" if base else "-"
            wait = med([med(r["comm_wait_s"]) for r in ok]) * 1e3
            mb = med([r["bytes_per_step"] for r in ok]) / 1e6
            steal = max(r["steal"] for r in ok)
            link = opts.rate_label(conf[2], conf[1], args.scale_links)
            print(f"| {model} | {conf[1]} x {args.ranks_per_host} | {link} | {m:.0f} | "
                  f"{q[2] - q[0]:.0f} | {scale} | {wait:.1f} | {mb:.2f} | {steal:.1%} |")
    return {f"{k[0]}/{k[1]}/{k[2]}": v for k, v in runs.items()}


def listed(values: list[str], choices: list[str], option: str) -> list[str]:
    """Words given space- or comma-separated, each one of ``choices``."""
    out = [w for v in values for w in v.split(",") if w]
    bad = [w for w in out if w not in choices]
    if bad:
        sys.exit(f"benchmarks/cluster.py: {option}: unknown {bad}; choose from {choices}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=["all", "throughput", "accuracy"], default="all")
    ap.add_argument("--models", nargs="+", default=["simplecnn", "resnet20", "vgg11bn"],
                    choices=sorted(opts.PARAMS))
    ap.add_argument("--rates", nargs="+", default=["1gbit", "10gbit"])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--windows", type=int, default=5)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--target", type=float, default=0.85)
    ap.add_argument("--no-four", action="store_true", help="skip 4 hosts")
    ap.add_argument("--no-ddp", action="store_true", help="drop the PyTorch DDP rows")
    ap.add_argument("--rules", nargs="+", default=ROWS, metavar="ROW",
                    help=f"rows of the accuracy part (space or comma separated): {ROWS}")
    ap.add_argument("--steps-per-epoch", type=int, default=0,
                    help="accuracy part: train (and validate) at most this many steps an "
                         "epoch (0: all)")
    ap.add_argument("--smoke", action="store_true",
                    help="tiny run to check the harness: 1 epoch of 30 steps, 1 repetition, "
                         "2 windows of 3 steps")
    ap.add_argument("--prefix", default=opts.CLUSTER["prefix"], help="emulated cluster's name "
                    "prefix (its namespaces and links)")
    ap.add_argument("--net", type=int, default=opts.CLUSTER["net"], help="its addresses: "
                    "198.18.NET.0/24")
    ap.add_argument("--hosts", nargs="+", type=int, default=None, help="throughput part: "
                    "host counts (default 2, and 4 for simplecnn)")
    ap.add_argument("--ranks-per-host", type=int, default=1, metavar="R", help="throughput "
                    "part: R ranks on every emulated host (the network-free row: N x R "
                    "ranks on one host); recorded as meta['ranks_per_host']")
    ap.add_argument("--acc-hosts", type=int, default=2, help="accuracy part: hosts x 1 rank")
    ap.add_argument("--compression", default="none", help="throughput part: the workers' "
                    "--gradient_compression (none, fp16, topk:R, powersgd:R), or ddp: "
                    "PyTorch DDP (gloo) on the same hosts and links")
    ap.add_argument("--parallel", default=None, metavar="RULE", help="throughput part: "
                    "the training rule (distnn train's --parallel: data, localsgd, partial, "
                    "easgd, downpour, gossip, ...) run through the Trainer; default: the "
                    "data rule's optimizer loop (DistributedOptimizer)")
    ap.add_argument("--rule-options", default="{}", help="throughput part: the rule's "
                    "arguments, JSON (default: the rule's defaults)")
    ap.add_argument("--bucket-mb", type=float, default=4.0, help="throughput part: the "
                    "workers' bucket_size_mb (a model in one bucket cannot overlap backward)")
    ap.add_argument("--scale-links", action="store_true", help="shape N hosts' links on C "
                    "cores to rate x C/N (compute-to-communication of one-core nodes)")
    ap.add_argument("--no-network-free", dest="network_free", action="store_false",
                    help="drop the rows of the same ranks on one host (shared memory)")
    ap.add_argument("--eval-every", type=int, default=0, metavar="K", help="accuracy part: "
                    "evaluate on a fixed held-out set every K steps (0: at epoch ends only)")
    ap.add_argument("--eval-samples", type=int, default=2000, help="held-out test images "
                    "of --eval-every")
    ap.add_argument("--json", help="write every run's raw results here")
    args = ap.parse_args()
    args.rules = listed(args.rules, ROWS, "--rules")
    if args.no_ddp:
        args.rules = [r for r in args.rules if r not in dict(DDP_RUNS)]
    args.rates = [w for v in args.rates for w in v.split(",") if w]
    if args.ranks_per_host < 1:
        sys.exit("benchmarks/cluster.py: --ranks-per-host: at least 1")
    if args.smoke:
        args.epochs, args.steps_per_epoch = 1, args.steps_per_epoch or 30
        args.reps, args.warmup, args.windows, args.steps = 1, 1, 2, 3
    opts.CLUSTER.update(prefix=args.prefix, net=args.net)
    from distnn.cluster import unavailable_reason
    why = unavailable_reason()
    if why:
        sys.exit(f"benchmarks/cluster.py: {why}")
    print(f"emulated cluster: {os.cpu_count()} cores, cores split between hosts, MPI over "
          f"TCP (UCX_TLS=tcp); load before: {host_load()['loadavg']}")
    if args.scale_links:
        print(f"links scaled: N hosts on {opts.cores()} cores are shaped to rate x "
              f"{opts.cores()}/N (issue 43 item 2): 'RATE as SHAPED' in the tables")
    raw = {"meta": {"cores": opts.cores(), "scale_links": args.scale_links,
                    "acc_hosts": args.acc_hosts, "ranks_per_host": args.ranks_per_host,
                    "compression": args.compression, "bucket_mb": args.bucket_mb,
                    "parallel": args.parallel, "rule_options": args.rule_options}}
    if args.part in ("all", "throughput"):
        raw["throughput"] = throughput_part(args)
    if args.part in ("all", "accuracy"):
        raw["accuracy"] = accuracy_part(args)
    if args.json:
        Path(args.json).write_text(json.dumps(raw, indent=1, default=str))


if __name__ == "__main__":
    main()
