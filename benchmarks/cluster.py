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
epochs and training time until the test accuracy first reaches 85%, for each rule
(data, data + fp16 compression, localsgd, easgd, downpour, gossip) and for PyTorch DDP
(gloo) on the same links (benchmarks/workers/ddp_main_job.py, one torchrun per host,
c10d rendezvous on host 1's address).

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

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
BIN = Path(sys.executable).parent
MARKER = "BENCH_JSON "
PARAMS = {"simplecnn": 149_210, "resnet20": 272_474, "vgg11bn": 9_753_674}
RULE_RUNS = [("data", "data", {}), ("data+fp16", "data", {"compression": "fp16"}),
             ("localsgd", "localsgd", {}), ("easgd", "easgd", {}),
             ("downpour", "downpour", {}), ("gossip", "gossip", {})]


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


def cluster(hosts: int, rate: str | None):
    from distnn.cluster import EmulatedCluster
    return EmulatedCluster(hosts, rate=rate, prefix="bc", net=66, cores="split")


def run_throughput(model: str, hosts: int, rate: str | None, args) -> dict:
    cmd = [sys.executable, str(HERE / "workers" / "distnn_worker.py"), "--model", model,
           "--threads", "1", "--warmup", str(args.warmup), "--windows", str(args.windows),
           "--steps", str(args.steps)]
    with cluster(hosts, rate) as c:
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
    if hosts > 1 and sent < steps * PARAMS[model] * 4:
        return {"error": f"only {sent} bytes crossed the links for {steps} steps: the "
                         "gradients did not travel over the network"}
    return rec


def run_rule(name: str, rule: str, options: dict, rate: str, args, tmp: Path) -> dict:
    out = tmp / f"{name}_{rate}.json"
    cmd = [sys.executable, str(HERE / "rules.py"), "--run", rule, "--out", str(out),
           "--epochs", str(args.epochs), "--batch", "64", "--lr", "0.01",
           "--options", json.dumps(options)]
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
    reach = next((h for h in hist if h["val_accuracy"] >= args.target), None)
    return {"epochs_to_target": reach and reach["epoch"],
            "time_to_target": reach and sum(h["time"] for h in hist
                                            if h["epoch"] <= reach["epoch"]),
            "final_acc": hist[-1]["val_accuracy"], "wall": wall, "epochs": len(hist),
            "bytes_per_epoch": sent / len(hist)}


def run_ddp(rate: str, args, tmp: Path) -> dict:
    torchrun = BIN / "torchrun"
    out = tmp / f"ddp_{rate}.json"
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
                    str(args.epochs), "--test-as-validation"]
            procs.append(subprocess.Popen(c.exec_argv(h.name, argv), env=env, cwd=ROOT,
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          text=True))
        outs = [p.communicate(timeout=3600)[0] for p in procs]
        wall = time.perf_counter() - t
        from distnn.cluster import total_sent
        sent = total_sent(before, c.link_bytes())
    if any(p.returncode for p in procs) or not out.exists():
        return {"error": [o.strip().splitlines()[-1:] for o in outs]}
    st = json.loads(out.read_text())
    acc = st["val_accuracy"]
    k = next((i for i, a in enumerate(acc) if a >= args.target), None)
    return {"epochs_to_target": None if k is None else k + 1,
            # training time only (as distnn's history 'time'), validation excluded
            "time_to_target": None if k is None else sum(
                st["epoch_train_end"][e] - st["epoch_start"][e] for e in range(k + 1)),
            "final_acc": acc[-1], "wall": wall, "epochs": len(acc),
            "bytes_per_epoch": sent / len(acc)}


def med(values):
    return statistics.median(values) if values else float("nan")


def throughput_part(args) -> dict:
    configs = []
    for model in args.models:
        configs.append((model, 1, None))
        for rate in args.rates:
            configs.append((model, 2, rate))
            if model == "simplecnn" and not args.no_four:
                configs.append((model, 4, rate))
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
            print(f"| {model} | {conf[1]} x 1 | {conf[2] or 'one host'} | {m:.0f} | "
                  f"{q[2] - q[0]:.0f} | {scale} | {wait:.1f} | {mb:.2f} | {steal:.1%} |")
    return {f"{k[0]}/{k[1]}/{k[2]}": v for k, v in runs.items()}


def accuracy_part(args) -> dict:
    results: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        for rate in args.rates:
            for name, rule, options in [r for r in RULE_RUNS if r[0] in args.rules]:
                results[f"{name}/{rate}"] = run_rule(name, rule, options, rate, args, Path(tmp))
                print(f"  {name} {rate}: {results[f'{name}/{rate}']}", file=sys.stderr,
                      flush=True)
            if not args.no_ddp:
                results[f"DDP (gloo)/{rate}"] = run_ddp(rate, args, Path(tmp))
                print(f"  DDP {rate}: {results[f'DDP (gloo)/{rate}']}", file=sys.stderr,
                      flush=True)
    print(f"\n### simplecnn on Fashion-MNIST, 2 hosts x 1 rank: time to "
          f"{args.target:.0%} test accuracy\n")
    print("| system | link | epochs to target | training time to target s | final acc "
          f"({args.epochs} epochs) | wall s (launch to exit) | MB on the wire/epoch |")
    print("|---|---|---|---|---|---|---|")
    for key, r in results.items():
        name, rate = key.split("/")
        if "error" in r:
            print(f"| {name} | {rate} | failed: {r['error']} | | | | |")
            continue
        tt = f"{r['time_to_target']:.1f}" if r["time_to_target"] else "not reached"
        print(f"| {name} | {rate} | {r['epochs_to_target'] or '-'} | {tt} | "
              f"{r['final_acc']:.4f} | {r['wall']:.1f} | {r['bytes_per_epoch'] / 1e6:.0f} |")
    return results


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
    ap.add_argument("--no-ddp", action="store_true")
    ap.add_argument("--rules", nargs="+", default=[r[0] for r in RULE_RUNS],
                    choices=[r[0] for r in RULE_RUNS])
    ap.add_argument("--json", help="write every run's raw results here")
    args = ap.parse_args()
    from distnn.cluster import unavailable_reason
    why = unavailable_reason()
    if why:
        sys.exit(f"benchmarks/cluster.py: {why}")
    print(f"emulated cluster: {os.cpu_count()} cores, cores split between hosts, MPI over "
          f"TCP (UCX_TLS=tcp); load before: {host_load()['loadavg']}")
    raw = {}
    if args.part in ("all", "throughput"):
        raw["throughput"] = throughput_part(args)
    if args.part in ("all", "accuracy"):
        raw["accuracy"] = accuracy_part(args)
    if args.json:
        Path(args.json).write_text(json.dumps(raw, indent=1, default=str))


if __name__ == "__main__":
    main()
