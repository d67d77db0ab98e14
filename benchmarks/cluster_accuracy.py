"""The accuracy part of benchmarks/cluster.py: simplecnn on Fashion-MNIST (60000 train,
SGD lr 0.01 momentum 0.9, batch 64 per rank, benchmarks/rules.py's worker) on
``--acc-hosts`` emulated hosts x 1 rank (default 2): epochs and training time until the
held-out accuracy first reaches the target, for each row of ``--rules``: distnn's rules and
PyTorch DDP (gloo) without and with its PowerSGD hook on the same links
(benchmarks/workers/ddp_main_job.py, one torchrun per host). With ``--scale-links`` the
links of N hosts on C cores are shaped to rate x C/N, as in the throughput part.
"""
from __future__ import annotations

import json
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
POWERSGD_WARMUP = 10  # dense steps before PowerSGD, in distnn and in DDP's hook
# The rows of the accuracy part: (name, --parallel rule, the rule's options).
RULE_RUNS = [("data", "data", {}),
             ("data+buckets", "data", {"bucket_size_mb": 0.25}),
             ("data+autotune", "data", {"autotune": True}),
             ("data+fp16", "data", {"compression": "fp16"}),
             ("data+topk", "data", {"compression": "topk:0.01"}),
             ("data+powersgd", "data", {"compression": "powersgd:2",
                                        "compression_warmup_steps": POWERSGD_WARMUP}),
             ("partial", "partial", {"chunks": 4}),
             ("localsgd", "localsgd", {}), ("easgd", "easgd", {}),
             ("downpour", "downpour", {}), ("gossip", "gossip", {})]
# PyTorch DDP rows: (name, extra arguments of ddp_main_job.py).
DDP_RUNS = [("ddp", []),
            ("ddp+powersgd", ["--powersgd", "2", "--powersgd-start", str(POWERSGD_WARMUP)])]
LABELS = {"data+buckets": "data (0.25 MiB buckets)", "data+autotune": "data (--autotune)",
          "data+topk": "data+topk:0.01", "data+powersgd": "data+powersgd:2",
          "partial": "partial (4 chunks)", "ddp": "DDP (gloo)",
          "ddp+powersgd": "DDP (gloo) + PowerSGD hook rank 2"}
ROWS = [r[0] for r in RULE_RUNS] + [r[0] for r in DDP_RUNS]


def run_rule(name: str, rule: str, options: dict, rate: str, args, tmp: Path) -> dict:
    link = opts.link_rate(rate, args.acc_hosts, args.scale_links)
    from distnn.rules import get_rule
    try:  # before a cluster comes up: can this checkout build the row's rule at all?
        get_rule(rule, **options)
    except (TypeError, ValueError) as exc:
        return {"error": f"this distnn cannot build --parallel {rule} {options}: {exc}"}
    out = tmp / f"{name}_{rate}.json"
    cmd = [sys.executable, str(HERE / "rules.py"), "--run", rule, "--out", str(out),
           "--epochs", str(args.epochs), "--batch", str(opts.BATCH), "--lr", "0.01",
           "--options", json.dumps(options), "--steps-per-epoch", str(args.steps_per_epoch),
           *opts.eval_args(args)]
    with opts.cluster(args.acc_hosts, link) as c:
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
    # Every byte a rank counts as sent goes to a rank on another host; at least half of
    # what the busiest rank counted must be on the wire, and 1 kB a step.
    counted = max(st.get("bytes", 0) for st in res["stats"])
    steps = res.get("steps") or opts.steps_run(args, args.acc_hosts)
    failed = opts.crossed(sent, max(0.5 * counted, 1000 * steps),
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
    hosts = args.acc_hosts
    with opts.cluster(hosts, opts.link_rate(rate, hosts, args.scale_links)) as c:
        before = c.link_bytes()
        master = c.hosts[0].address
        env = c.env()
        env.update(OMP_NUM_THREADS="1")
        procs = []
        t = time.perf_counter()
        for i, h in enumerate(c.hosts):
            argv = [str(torchrun), "--nnodes", str(hosts), "--nproc_per_node", "1",
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
    steps = opts.steps_run(args, hosts)
    if extra:  # PowerSGD: at least the P and Q factors of Linear(1152, 128) after warm-up
        least = (steps - POWERSGD_WARMUP) * 2 * (1152 + 128) * 4
    else:  # the whole gradient every step
        least = steps * opts.PARAMS["simplecnn"] * 4
    failed = opts.crossed(sent, least, f"{steps} steps")
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


def accuracy_part(args) -> dict:
    results: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        if args.network_free:  # the reference: the same 2 ranks on one host, no network
            results[f"data/{opts.NETWORK_FREE}"] = opts.run_rule_local(
                args.acc_hosts, "data", {}, args, Path(tmp) / "data_shm.json")
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
    print(f"\n### simplecnn on Fashion-MNIST, {args.acc_hosts} hosts x 1 rank: time to "
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
        print(f"| {name} | {opts.rate_label(rate, args.acc_hosts, args.scale_links)} | "
              f"{r['epochs_to_target'] or '-'} | {tt} | {r['final_acc']:.4f} | "
              f"{r['wall']:.1f} | {r['bytes_per_epoch'] / 1e6:.0f} | "
              f"{r['bytes_per_step'] / 1e3:.1f} | {fine} |")
    return results
