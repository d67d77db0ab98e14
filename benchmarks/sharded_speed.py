"""Speed of the big-model modes (issue 56): dense ``data``, ZeRO ``--shard 1|2|3`` and
pipeline stages (GPipe, 1F1B) against PyTorch's DDP, FSDP2 (``fully_shard``),
``ZeroRedundancyOptimizer`` and ``torch.distributed.pipelining`` (ScheduleGPipe,
Schedule1F1B) on gloo, for the same network, on one host and on 2 emulated hosts.

The network, data and per-run measure are benchmarks/pipeline.py's (its workers run
here): an MLP 784-1024-1024-1024-1024-10 float32 (3.9 M weights), SGD with momentum,
global batch 128 over 2 ranks x 1 thread; a run trains ``--epochs`` epochs of ``--steps``
steps and its figure is the global batch over the median step of the slowest rank in
the epochs after the first. Every kind runs once per round, the kinds in a rotated order
each round, and a row is the median of its rounds (alternated runs: a burst of the shared
host's other work lands on a different kind each time). The load average is printed per
row (its mean over the row's runs). ``--places hosts``: 2 emulated hosts (network
namespaces, one core each, 1 Gbit/s shaped links: ``distnn.cluster.EmulatedCluster``;
MPI over TCP, gloo on the link), torch's rendezvous through ``distnn.torch.init_process_group``.

    python benchmarks/sharded_speed.py --rounds 3                  # one host and 2 hosts
    python benchmarks/sharded_speed.py --places local --kinds data,shard3,torch-fsdp2
    DISTNN_BENCH_CLUSTER=dsb,88 python benchmarks/sharded_speed.py  # the cluster's names
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve()
WORKER = HERE.parent / "pipeline.py"
KINDS = ("data", "shard1", "shard2", "shard3", "gpipe", "1f1b", "torch-ddp", "torch-fsdp2",
         "torch-zero", "torch-gpipe", "torch-1f1b")
PIPED = ("gpipe", "1f1b", "torch-gpipe", "torch-1f1b")
LABELS = {"data": "distnn data (dense)", "shard1": "distnn --shard 1",
          "shard2": "distnn --shard 2", "shard3": "distnn --shard 3",
          "gpipe": "distnn pipeline GPipe", "1f1b": "distnn pipeline 1F1B",
          "torch-ddp": "torch DDP", "torch-fsdp2": "torch FSDP2 (fully_shard)",
          "torch-zero": "torch DDP + ZeroRedundancyOptimizer",
          "torch-gpipe": "torch ScheduleGPipe", "torch-1f1b": "torch Schedule1F1B"}


def _env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
            "DISTNN_KERNELS": os.environ.get("DISTNN_KERNELS", "numpy")}


def run_one(cfg: dict, cluster, out: Path, timeout: float) -> dict:
    argv = [sys.executable, str(WORKER), "--worker", json.dumps(cfg), "--out", str(out)]
    if cluster is None:
        cmd, env = [str(Path(sys.executable).parent / "mpiexec"), "-n", "2", *argv], _env()
    else:
        cmd, env = cluster.mpiexec(argv, 1), cluster.env(_env())
    out.unlink(missing_ok=True)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if not out.exists():
        raise RuntimeError(f"{cfg} failed: exit {proc.returncode}\n"
                           f"{(proc.stdout + proc.stderr)[-3000:]}")
    if proc.returncode != 0:  # gloo's threads abort at teardown now and then, after the result
        print(f"{cfg['mode']}: exit {proc.returncode} after writing its result (kept)",
              file=sys.stderr, flush=True)
    return json.loads(out.read_text())


def configs(kinds, micro, buckets) -> list[dict]:
    out = []
    for kind in kinds:
        for m in (micro if kind in PIPED else [1]):
            for b in (buckets if kind.startswith("shard") else [4.0]):
                out.append({"mode": kind, "micro": m, "bucket_mb": b})
    return out


def measure(place: str, cluster, todo: list[dict], args, tmp: Path) -> dict:
    common = {"batch": args.batch, "steps": args.steps, "epochs": args.epochs}
    runs: dict[tuple, list] = {}
    cut = None
    for r in range(args.rounds):
        k = r % len(todo)
        for cfg in todo[k:] + todo[:k]:
            cfg = {**common, **cfg}
            if cfg["mode"].startswith("torch-") and cfg["mode"] in PIPED:
                if cut is None:  # distnn's cut by parameter counts (the same every time)
                    cut = run_one({**common, "mode": "gpipe", "micro": 1, "steps": 1,
                                   "epochs": 2}, cluster, tmp / "cut.json",
                                  args.timeout)["starts"][1]
                cfg["cut"] = cut
            load = os.getloadavg()[0]
            res = run_one(cfg, cluster, tmp / "result.json", args.timeout)
            runs.setdefault((cfg["mode"], cfg["micro"], cfg["bucket_mb"]),
                            []).append({**res, "load": load})
            print(f"{place} round {r + 1}: {cfg['mode']} M={cfg['micro']}: "
                  f"{res['samples_per_s']:,.0f} samples/s (load {load:.1f})",
                  file=sys.stderr, flush=True)
    return runs


def table(place: str, runs: dict, args) -> str:
    dense = runs.get(("data", 1, 4.0))
    dense_v = statistics.median(r["samples_per_s"] for r in dense) if dense else None
    lines = [f"\n{place}: 2 ranks x 1 thread, global batch {args.batch}, median of "
             f"{args.rounds} alternated runs (each: median step of epochs 2..{args.epochs}, "
             f"{args.steps} steps each)\n",
             "| run | M | samples/s (median) | runs | vs distnn dense | bubble measured | "
             "bubble ideal (S-1)/(M+S-1) | load |",
             "|---|---|---:|---|---:|---:|---:|---:|"]
    for kind in KINDS:
        for (mode, m, bucket), rows in sorted(runs.items(), key=lambda kv: kv[0][1:]):
            if mode != kind:
                continue
            label = LABELS[mode] + (f" (units >= {bucket:g} MiB)" if len(args.bucket_mb) > 1
                                    and mode.startswith("shard") else "")
            values = [r["samples_per_s"] for r in rows]
            med = statistics.median(values)
            bubbles = [r["bubble"] for r in rows if r["bubble"] == r["bubble"]]
            piped = mode in PIPED
            lines.append(
                f"| {label} | {m if piped else '-'} | {med:,.0f} | "
                f"{', '.join(f'{v:,.0f}' for v in values)} | "
                f"{'' if dense_v is None else f'{med / dense_v:.2f}x'} | "
                f"{f'{statistics.median(bubbles):.2f}' if bubbles else '-'} | "
                f"{f'{1 / (m + 1):.2f}' if piped else '-'} | "
                f"{statistics.mean(r['load'] for r in rows):.1f} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--micro", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--places", default="local,hosts", help="local, hosts or both")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--bucket_mb", type=float, nargs="+", default=[4.0],
                    help="--shard 2/3: the least size of a unit of layers per collective "
                         "(several: a row each; 0: layer by layer)")
    ap.add_argument("--batch", type=int, default=128, help="global batch")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--rate", default="1gbit", help="the emulated hosts' links")
    ap.add_argument("--timeout", type=float, default=600)
    args = ap.parse_args(argv)
    kinds = args.kinds.split(",")
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        ap.error(f"--kinds: unknown {unknown}; choose from {','.join(KINDS)}")
    todo = configs(kinds, args.micro, args.bucket_mb)
    print(f"load average at the start: {os.getloadavg()[0]:.1f}", file=sys.stderr)
    with tempfile.TemporaryDirectory() as tmp:
        for place in args.places.split(","):
            if place == "local":
                print(table("one host (shared memory)", measure(place, None, todo, args,
                                                                Path(tmp)), args), flush=True)
                continue
            from distnn.cluster import EmulatedCluster
            prefix, net = os.environ.get("DISTNN_BENCH_CLUSTER", "dsb,88").split(",")
            with EmulatedCluster(2, rate=args.rate, prefix=prefix, net=int(net)) as cluster:
                runs = measure(place, cluster, todo, args, Path(tmp))
            print(table(f"2 emulated hosts at {args.rate} (1 rank and 1 core each)", runs,
                        args), flush=True)


if __name__ == "__main__":
    main()
