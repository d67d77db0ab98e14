"""The compressed exchanges overlapped with backward against the blocking ones, paired in
one job on the emulated cluster (issue 43 item 3; needs root).

    python benchmarks/compressed_overlap.py --compression topk:0.01 powersgd:2 \
        --rates 1gbit 10gbit --bucket-mb 0.25

Two replicas of the same model train side by side in one 2-host x 1-rank job (SGD lr 0.01
momentum 0.9, batch 64 per rank, float32, op "sum"): "overlapped" is the default
``DistributedOptimizer`` (non_blocking: each bucket compressed and its exchange started
during backward, ``compressed_buckets.py``), "blocking" is ``non_blocking=False`` (the
whole buffer compressed and exchanged after backward: the only path before). Their timed
windows alternate A B B A ..., so both see the same load of a shared machine; each takes
the same batches, so their weights end equal bit for bit (checked, column "same
weights"). A step's time is the slowest rank's; medians over windows. A model in one
bucket (simplecnn in the default 4 MiB) cannot overlap: ``--bucket-mb 0.25`` cuts simplecnn
into 3 buckets (dense_1 | dense_0 | both convolutions).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "workers"))
MARKER = "OVERLAP_JSON "
ARMS = (("overlapped", True), ("blocking", False))


def worker(args) -> None:
    """One rank of the paired job (under the cluster's mpiexec)."""
    import _common as C
    C.pin_threads(1)
    import numpy as np

    from distnn import distributed as dist
    from distnn.models import get_model
    from distnn.nn.losses import CategoricalCrossEntropy
    from distnn.optim import SGD

    comm = dist.init()
    x, y = C.rank_shard(args.model, comm.rank, comm.size, 0)
    lossfn = CategoricalCrossEntropy()
    arms = {}
    for name, non_blocking in ARMS:
        model = get_model(args.model, input_shape=C.INPUT_SHAPES[args.model], num_classes=10,
                          dtype=np.float32, rng=0)
        dist.broadcast_parameters(model, comm=comm)
        opt = dist.DistributedOptimizer(
            SGD(model, lr=0.01, momentum=0.9), model, comm=comm, op="sum",
            non_blocking=non_blocking, compression=args.compression,
            bucket_size_mb=args.bucket_mb)
        arms[name] = (model, opt, C.batches(x, y, 64))

    def window(name: str, steps: int) -> tuple[float, float]:
        model, opt, data = arms[name]
        comm.barrier()
        c0, t0 = opt.comm_wait_time, time.perf_counter()
        for _ in range(steps):
            xb, yb = next(data)
            _, dy = lossfn(model.forward(xb, training=True), yb, denom=64 * comm.size)
            model.backward(dy)
            opt.step()
        return time.perf_counter() - t0, opt.comm_wait_time - c0

    for name, _ in ARMS:
        window(name, args.warmup)
    times: dict = {name: [] for name, _ in ARMS}
    for w in range(args.windows):
        order = [n for n, _ in ARMS] if w % 2 == 0 else [n for n, _ in reversed(ARMS)]
        for name in order:
            times[name].append(window(name, args.steps))
    same = bool(np.array_equal(arms["overlapped"][0].parameters_flat(),
                               arms["blocking"][0].parameters_flat()))
    rec = {"times": times, "same": same,
           "overlap": arms["overlapped"][1]._reducer.overlap is not None,
           "buckets": len(arms["overlapped"][1].buckets)}
    records = comm.allgather_obj(rec)
    if comm.rank == 0:
        out = {"same": all(r["same"] for r in records), "overlap": records[0]["overlap"],
               "buckets": records[0]["buckets"]}
        for name, _ in ARMS:  # per window, the slowest rank
            walls = [max(r["times"][name][w][0] for r in records) for w in range(args.windows)]
            waits = [max(r["times"][name][w][1] for r in records) for w in range(args.windows)]
            out[name] = {"ms_per_step": 1e3 * statistics.median(walls) / args.steps,
                         "wait_ms_per_step": 1e3 * statistics.median(waits) / args.steps,
                         "windows_ms": [1e3 * t / args.steps for t in walls]}
        print(MARKER + json.dumps(out), flush=True)


def run(args, compression: str, rate: str) -> dict:
    import cluster_opts as opts
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--model", args.model,
           "--compression", compression, "--bucket-mb", str(args.bucket_mb), "--warmup",
           str(args.warmup), "--windows", str(args.windows), "--steps", str(args.steps)]
    with opts.cluster(2, rate) as c:
        before = c.link_bytes()
        proc = subprocess.run(c.mpiexec(cmd), env=c.env(), capture_output=True, text=True,
                              timeout=1800, cwd=HERE.parent)
        from distnn.cluster import total_sent
        sent = total_sent(before, c.link_bytes())
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith(MARKER)), None)
    if proc.returncode != 0 or line is None:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return {"error": f"exit {proc.returncode}: {tail}"}
    out = json.loads(line[len(MARKER):])
    out["bytes_crossed"] = sent
    if sent <= 0:
        out["error"] = "no bytes crossed the links"
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", default="simplecnn")
    ap.add_argument("--compression", nargs="+", default=["topk:0.01", "powersgd:2"])
    ap.add_argument("--rates", nargs="+", default=["1gbit", "10gbit"])
    ap.add_argument("--bucket-mb", type=float, default=0.25)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--windows", type=int, default=10)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--prefix", default="co", help="emulated cluster's name prefix")
    ap.add_argument("--net", type=int, default=67, help="its addresses: 198.18.NET.0/24")
    ap.add_argument("--json", help="write every run's raw results here")
    args = ap.parse_args()
    if args.worker:
        args.compression = args.compression[0]
        worker(args)
        return
    import cluster_opts as opts
    opts.CLUSTER.update(prefix=args.prefix, net=args.net)
    from distnn.cluster import unavailable_reason
    why = unavailable_reason()
    if why:
        sys.exit(f"benchmarks/compressed_overlap.py: {why}")
    with open("/proc/loadavg") as f:
        print(f"2 emulated hosts x 1 rank, {args.model}, bucket_size_mb {args.bucket_mb}; "
              f"load before: {f.read().split()[:3]}")
    print("\n| compression | link | buckets | overlapped ms/step | blocking ms/step | "
          "overlapped / blocking | wait ms/step (ov / bl) | same weights |")
    print("|---|---|---|---|---|---|---|---|")
    raw = []
    for compression in args.compression:
        for rate in args.rates:
            r = run(args, compression, rate)
            raw.append({"compression": compression, "rate": rate, **r})
            if "error" in r:
                print(f"| {compression} | {rate} | failed: {r['error']} |||||")
                continue
            ov, bl = r["overlapped"], r["blocking"]
            print(f"| {compression} | {rate} | {r['buckets']} | {ov['ms_per_step']:.2f} | "
                  f"{bl['ms_per_step']:.2f} | {ov['ms_per_step'] / bl['ms_per_step']:.2f} | "
                  f"{ov['wait_ms_per_step']:.2f} / {bl['wait_ms_per_step']:.2f} | "
                  f"{'yes' if r['same'] else 'NO'} |", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(raw, indent=1))


if __name__ == "__main__":
    main()
