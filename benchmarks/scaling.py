"""Data-parallel scaling of distnn: 1 rank vs N ranks, blocking vs overlapped all-reduce.

Runs itself under ``mpiexec -n N`` for each N (one BLAS/OpenMP thread per rank), trains a
few zoo models on synthetic data with ``DistributedOptimizer`` and prints a table of
medians over the timed steps: step time (the slowest rank), samples/s over all ranks,
speed-up over 1 rank, and the time a step spent blocked waiting on the gradient all-reduce.

    python benchmarks/scaling.py                        # simplecnn and lenet, 1 and 2 ranks
    python benchmarks/scaling.py --models simplecnn --ranks 1 2 4 --batch 32 --steps 50
    python benchmarks/scaling.py --scaling strong       # fixed global batch instead
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np


def _mlp():
    from distnn.nn.activations import ReLU
    from distnn.nn.core import Dense, Flatten
    return [Flatten(), Dense(512), ReLU(), Dense(512), ReLU(), Dense(10)]


def build(name: str, dtype):
    """A zoo model by name ("mlp" needs only the core layers)."""
    from distnn.nn.containers import Sequential
    if name == "mlp":
        return Sequential(_mlp(), input_shape=(1, 28, 28), dtype=dtype, rng=0)
    from distnn.models import get_model
    return get_model(name, input_shape=(1, 28, 28), num_classes=10, dtype=dtype, rng=0)


def worker(args) -> None:
    from distnn import distributed as dist
    from distnn.nn.losses import CategoricalCrossEntropy
    from distnn.optim import SGD

    comm = dist.init()
    loss_fn = CategoricalCrossEntropy()
    rng = np.random.default_rng([0, comm.rank])
    for name in args.models:
        for mode in args.modes:
            model = build(name, np.float32)
            dist.broadcast_parameters(model, comm=comm)
            opt = dist.DistributedOptimizer(
                SGD(model, lr=0.01, momentum=0.9), model, comm=comm, op="sum",
                bucket_size_mb=args.bucket_mb, non_blocking=mode == "overlap",
                compression="fp16" if mode == "fp16" else None)
            gbs = args.batch * (comm.size if args.scaling == "weak" else 1)
            local = len(np.array_split(np.arange(gbs), comm.size)[comm.rank])
            x = rng.normal(size=(local, 1, 28, 28)).astype(np.float32)
            y = rng.integers(0, 10, size=local)
            times, waits = [], []
            for step in range(args.warmup + args.steps):
                comm.barrier()
                w0 = opt.comm_wait_time
                t0 = time.perf_counter()
                _, d = loss_fn(model.forward(x, training=True), y, denom=gbs)
                model.backward(d)
                opt.step()
                if step >= args.warmup:
                    times.append(time.perf_counter() - t0)
                    waits.append(opt.comm_wait_time - w0)
            slowest = comm.allreduce_(np.array(times), "max")
            wait = comm.allreduce_(np.array(waits), "mean")
            if comm.rank == 0:
                print(json.dumps({
                    "model": name, "mode": mode, "ranks": comm.size, "global_batch": gbs,
                    "step_ms": 1e3 * float(np.median(slowest)),
                    "wait_ms": 1e3 * float(np.median(wait)),
                    "samples_s": gbs / float(np.median(slowest)),
                    "buckets": len(opt.buckets),
                    "grad_mb": model.gradients_flat().nbytes / 2**20}), flush=True)


def launcher() -> list[str]:
    here = Path(sys.executable).parent / "mpiexec"
    found = str(here) if here.exists() else shutil.which("mpiexec")
    if found is None:
        sys.exit("scaling.py: no mpiexec next to the Python interpreter or on PATH; "
                 "install the 'mpi' extra (mpi4py, mpich)")
    return [found]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--models", nargs="+", default=["simplecnn", "lenet"])
    p.add_argument("--ranks", nargs="+", type=int, default=[1, 2])
    p.add_argument("--modes", nargs="+", default=["blocking", "overlap"],
                   choices=["blocking", "overlap", "fp16"])
    p.add_argument("--batch", type=int, default=64, help="per-rank (weak) or global (strong) batch")
    p.add_argument("--scaling", choices=["weak", "strong"], default="weak")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--bucket-mb", type=float, default=4.0)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    rows = []
    for n in args.ranks:
        cmd = launcher() + ["-n", str(n), sys.executable, __file__, "--worker",
                            "--models", *args.models, "--modes", *args.modes,
                            "--batch", str(args.batch), "--scaling", args.scaling,
                            "--steps", str(args.steps), "--warmup", str(args.warmup),
                            "--bucket-mb", str(args.bucket_mb)]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            sys.exit(f"scaling.py: {n} ranks failed:\n{proc.stderr[-3000:]}")
        rows += [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    base = {(r["model"], r["mode"]): r["samples_s"] for r in rows if r["ranks"] == 1}
    head = (f"{'model':<10} {'mode':<9} {'ranks':>5} {'gbatch':>6} {'grad MB':>7} {'buckets':>7} "
            f"{'step ms':>8} {'samples/s':>9} {'speedup':>7} {'wait ms':>8}")
    print(f"{args.scaling} scaling, medians of {args.steps} steps, 1 thread per rank, "
          f"bucket {args.bucket_mb} MB")
    print(head)
    print("-" * len(head))
    for r in sorted(rows, key=lambda r: (r["model"], r["mode"], r["ranks"])):
        ref = base.get((r["model"], r["mode"]))
        speed = f"{r['samples_s'] / ref:.2f}x" if ref else "-"
        print(f"{r['model']:<10} {r['mode']:<9} {r['ranks']:>5} {r['global_batch']:>6} "
              f"{r['grad_mb']:>7.3f} {r['buckets']:>7} {r['step_ms']:>8.2f} "
              f"{r['samples_s']:>9.0f} {speed:>7} {r['wait_ms']:>8.3f}")


if __name__ == "__main__":
    main()
