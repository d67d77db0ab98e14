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

Part "accuracy": simplecnn on Fashion-MNIST (60000 train, test split as validation, SGD lr
0.01 momentum 0.9, batch 64 per rank, benchmarks/rules.py's worker) on 2 hosts x 1 rank:
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
import tempfile
import time
from pathlib import Path

try:
    from benchmarks import cluster_opts as opts
except ImportError:  # run as a script: benchmarks/ is on sys.path
    import cluster_opts as opts

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
BIN = Path(sys.executable).parent
MARKER = "BENCH_JSON "
PARAMS = {"simplecnn": 149_210, "resnet20": 272_474, "vgg11bn": 9_753_674}
POWERSGD_WARMUP = 10  # dense steps before PowerSGD, in distnn and in DDP's hook
# The rows of the accuracy part: (name, --parallel rule, the rule's options).
RULE_RUNS = [("data", "data", {}), ("data+fp16", "data", {"compression": "fp16"}),
             ("data+topk", "data", {"compression": "topk:0.01"}),
             ("data+powersgd", "data", {"compression": "powersgd:2",
                                        "compression_warmup_steps": POWERSGD_WARMUP}),
             ("partial", "partial", {"chunks": 4}),
             ("localsgd", "localsgd", {}), ("easgd", "easgd", {}),
             ("downpour", "downpour", {}), ("gossip", "gossip", {})]
# PyTorch DDP rows: (name, extra arguments of ddp_main_job.py).
DDP_RUNS = [("ddp", []),
            ("ddp+powersgd", ["--powersgd", "2", "--powersgd-start", str(POWERSGD_WARMUP)])]
LABELS = {"data+topk": "data+topk:0.01", "data+powersgd": "data+powersgd:2",
          "partial": "partial (4 chunks)", "ddp": "DDP (gloo)",
          "ddp+powersgd": "DDP (gloo) + PowerSGD hook rank 2"}
ROWS = [r[0] for r in RULE_RUNS] + [r[0] for r in DDP_RUNS]
FMNIST_TRAIN, BATCH = 60_000, 64


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


CLUSTER = {"prefix": "bc", "net": 66}  # --prefix/--net move it (two benchmarks at once)


def cluster(hosts: int, rate: str | None):
    from distnn.cluster import EmulatedCluster
    return EmulatedCluster(hosts, rate=rate, cores="split", **CLUSTER)


def steps_run(args, hosts: int = 2) -> int:
    """Training steps of one accuracy run (every rank takes each)."""
    per_epoch = -(-FMNIST_TRAIN // (BATCH * hosts))
    if args.steps_per_epoch:
        per_epoch = min(per_epoch, args.steps_per_epoch)
    return per_epoch * args.epochs


def crossed(sent: int, least: float, what: str) -> str | None:
    """None when ``sent`` bytes crossed the links, at least ``least``; else the failure."""
    if sent >= least and sent > 0:
        return None
    return (f"only {sent} bytes crossed the links, {what} need at least {least:.0f}: the "
            "run did not train over the network")


def run_throughput(model: str, hosts: int, rate: str | None, args) -> dict:
    if rate == opts.NETWORK_FREE:
        return opts.run_throughput_local(model, hosts, args)
    cmd = opts.throughput_worker(model, args)
    with cluster(hosts, opts.link_rate(rate, hosts, args.scale_links)) as c:
        before = c.link_bytes()
        t0 = host_load()
        proc = subprocess.run(c.mpiexec(cmd), env=c.env(), capture_output=True, text=True,
                              timeout=1800, cwd=ROOT)
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
    # bytes a parameter needs on the wire a step, at least (compressions: far fewer)
    if hosts > 1 and sent < steps * PARAMS[model] * opts.least_bytes(args.compression):
        return {"error": f"only {sent} bytes crossed the links for {steps} steps: the "
                         "gradients did not travel over the network"}
    return rec


def run_rule(name: str, rule: str, options: dict, rate: str, args, tmp: Path) -> dict:
    from distnn.rules import get_rule
    try:  # before a cluster comes up: can this checkout build the row's rule at all?
        get_rule(rule, **options)
    except (TypeError, ValueError) as exc:
        return {"error": f"this distnn cannot build --parallel {rule} {options}: {exc}"}
    out = tmp / f"{name}_{rate}.json"
    cmd = [sys.executable, str(HERE / "rules.py"), "--run", rule, "--out", str(out),
           "--epochs", str(args.epochs), "--batch", str(BATCH), "--lr", "0.01",
           "--options", json.dumps(options), "--steps-per-epoch", str(args.steps_per_epoch),
           *opts.eval_args(args)]
    with cluster(2, rate) as c:
        before = c.link_bytes()
        t = time.perf_counter()
        env = c.env()
        env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
        proc = subprocess.run(c.mpiexec(cmd), env=env, capture_output=True, text=True,
                              timeout=3600, cwd=ROOT)
        wall = time.perf_counter() - t
        from distnn.cluster import total_sent
        sent = total_sent(before, c.link_bytes())
    if proc.returncode != 0 or not out.exists():
        return {"error": (proc.stderr or proc.stdout).strip().splitlines()[-1:]}
    res = json.loads(out.read_text())
    hist = res["history"]
    # Every byte a rank counts as sent goes to the rank on the other host; at least half
    # of what the busiest rank counted must be on the wire, and 1 kB a step.
    counted = max(st.get("bytes", 0) for st in res["stats"])
    steps = res.get("steps") or steps_run(args)
    failed = crossed(sent, max(0.5 * counted, 1000 * steps),
                     f"the {counted:.0f} bytes the ranks' counters say were sent")
    if failed:
        return {"error": failed}
    reach = next((h for h in hist if h["val_accuracy"] >= args.target), None)
    return {"epochs_to_target": reach and reach["epoch"],
            "time_to_target": reach and sum(h["time"] for h in hist
                                            if h["epoch"] <= reach["epoch"]),
            "final_acc": hist[-1]["val_accuracy"], "wall": wall, "epochs": len(hist),
            "bytes_per_epoch": sent / len(hist), "bytes_per_step": sent / steps,
            "counted_per_epoch": counted / len(hist),
            **opts.time_to_target(res.get("step_evals", []), args.target)}


def run_ddp(name: str, extra: list[str], rate: str, args, tmp: Path) -> dict:
    torchrun = BIN / "torchrun"
    out = tmp / f"{name}_{rate}.json"
    with cluster(2, rate) as c:
        before = c.link_bytes()
        master = c.hosts[0].address
        env = c.env()
        env.update(OMP_NUM_THREADS="1")
        procs = []
        t = time.perf_counter()
        for i, h in enumerate(c.hosts):
            argv = [str(torchrun), "--nnodes", "2", "--nproc_per_node", "1",
                    "--node_rank", str(i), "--master_addr", master, "--master_port", "29577",
                    str(HERE / "workers" / "ddp_main_job.py"), str(out), "--epochs",
                    str(args.epochs), "--test-as-validation", "--steps-per-epoch",
                    str(args.steps_per_epoch), *extra]
            procs.append(subprocess.Popen(c.exec_argv(h.name, argv), env=env, cwd=ROOT,
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          text=True))
        outs = [p.communicate(timeout=3600)[0] for p in procs]
        wall = time.perf_counter() - t
        from distnn.cluster import total_sent
        sent = total_sent(before, c.link_bytes())
    if any(p.returncode for p in procs) or not out.exists():
        return {"error": [o.strip().splitlines()[-1:] for o in outs]}
    steps = steps_run(args)
    if extra:  # PowerSGD: at least the P and Q factors of Linear(1152, 128) after warm-up
        least = (steps - POWERSGD_WARMUP) * 2 * (1152 + 128) * 4
    else:  # the whole gradient every step
        least = steps * PARAMS["simplecnn"] * 4
    failed = crossed(sent, least, f"{steps} steps")
    if failed:
        return {"error": failed}
    st = json.loads(out.read_text())
    acc = st["val_accuracy"]
    k = next((i for i, a in enumerate(acc) if a >= args.target), None)
    return {"epochs_to_target": None if k is None else k + 1,
            # training time only (as distnn's history 'time'), validation excluded
            "time_to_target": None if k is None else sum(
                st["epoch_train_end"][e] - st["epoch_start"][e] for e in range(k + 1)),
            "final_acc": acc[-1], "wall": wall, "epochs": len(acc),
            "bytes_per_epoch": sent / len(acc), "bytes_per_step": sent / steps}


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
                print(f"| {model} | {conf[1]} x 1 | {conf[2] or '-'} | failed: "
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
            print(f"| {model} | {conf[1]} x 1 | {link} | {m:.0f} | "
                  f"{q[2] - q[0]:.0f} | {scale} | {wait:.1f} | {mb:.2f} | {steal:.1%} |")
    return {f"{k[0]}/{k[1]}/{k[2]}": v for k, v in runs.items()}


def accuracy_part(args) -> dict:
    results: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        if args.network_free:  # the reference: the same 2 ranks on one host, no network
            results[f"data/{opts.NETWORK_FREE}"] = opts.run_rule_local(
                2, "data", {}, args, Path(tmp) / "data_shm.json")
        for rate in args.rates:
            for name, rule, options in [r for r in RULE_RUNS if r[0] in args.rules]:
                results[f"{name}/{rate}"] = run_rule(name, rule, options, rate, args, Path(tmp))
                print(f"  {name} {rate}: {results[f'{name}/{rate}']}", file=sys.stderr,
                      flush=True)
            for name, extra in [r for r in DDP_RUNS if r[0] in args.rules]:
                results[f"{name}/{rate}"] = run_ddp(name, extra, rate, args, Path(tmp))
                print(f"  {name} {rate}: {results[f'{name}/{rate}']}", file=sys.stderr,
                      flush=True)
    steps = (f", at most {args.steps_per_epoch} steps an epoch (smoke test)"
             if args.steps_per_epoch else "")
    print(f"\n### simplecnn on Fashion-MNIST, 2 hosts x 1 rank: time to "
          f"{args.target:.0%} test accuracy{steps}\n")
    print("| system | link | epochs to target | training time to target s | final acc "
          f"({args.epochs} epochs) | wall s (launch to exit) | MB on the wire/epoch | "
          f"kB on the wire/step | time to target, every {args.eval_every} steps s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for key, r in results.items():
        name, rate = key.split("/")
        name = LABELS.get(name, name)
        if "error" in r:
            print(f"| {name} | {rate} | failed: {r['error']} | | | | | | |")
            continue
        tt = f"{r['time_to_target']:.1f}" if r["time_to_target"] else "not reached"
        fine = r.get("time_to_target_steps")
        fine = (f"{fine:.1f} (step {r['step_to_target']})" if fine else
                "not reached" if r.get("evals") else "-")
        print(f"| {name} | {opts.rate_label(rate, 2, False)} | "
              f"{r['epochs_to_target'] or '-'} | {tt} | {r['final_acc']:.4f} | "
              f"{r['wall']:.1f} | {r['bytes_per_epoch'] / 1e6:.0f} | "
              f"{r['bytes_per_step'] / 1e3:.1f} | {fine} |")
    return results


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
                    choices=sorted(PARAMS))
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
    ap.add_argument("--prefix", default=CLUSTER["prefix"], help="emulated cluster's name "
                    "prefix (its namespaces and links)")
    ap.add_argument("--net", type=int, default=CLUSTER["net"], help="its addresses: "
                    "198.18.NET.0/24")
    ap.add_argument("--hosts", nargs="+", type=int, default=None, help="throughput part: "
                    "host counts (default 2, and 4 for simplecnn)")
    ap.add_argument("--compression", default="none", help="throughput part: the workers' "
                    "--gradient_compression (none, fp16, topk:R, powersgd:R)")
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
    if args.smoke:
        args.epochs, args.steps_per_epoch = 1, args.steps_per_epoch or 30
        args.reps, args.warmup, args.windows, args.steps = 1, 1, 2, 3
    CLUSTER.update(prefix=args.prefix, net=args.net)
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
                    "compression": args.compression, "bucket_mb": args.bucket_mb}}
    if args.part in ("all", "throughput"):
        raw["throughput"] = throughput_part(args)
    if args.part in ("all", "accuracy"):
        raw["accuracy"] = accuracy_part(args)
    if args.json:
        Path(args.json).write_text(json.dumps(raw, indent=1, default=str))


if __name__ == "__main__":
    main()
