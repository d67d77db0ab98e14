"""The cost of ``distnn.torch``'s cross-rank check (``torch/agree.py``) per collective:
Horovod's coordinator checks every call's name, op, dtype, shape and root across ranks,
and so does distnn, with one extra non-blocking all-reduce of 30 int64 per call.

    mpiexec -n 2 python benchmarks/agree_cost.py --calls 3000 --reps 5

Times, per call and alternated (A B A B ...), ``hvd.allreduce`` of a small float32 tensor
(which includes the check), the check alone on the same tensor, and a plain MPI
all-reduce of the same data without the torch layer; prints the medians over repetitions
(rank 0) and the check's share of the small all-reduce.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

import distnn.torch as hvd
from distnn.torch.agree import agree
from distnn.torch.collectives import channel


def per_call_us(fn, calls: int, comm) -> float:
    comm.barrier()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    comm.barrier()
    return (time.perf_counter() - t0) / calls * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--elements", type=int, default=4)
    args = ap.parse_args()
    hvd.init()
    c = channel()
    x = torch.ones(args.elements)
    a = np.ones(args.elements, dtype=np.float32)
    cases = {
        "hvd.allreduce (with the check)": lambda: hvd.allreduce(x, name="x"),
        "the check alone": lambda: agree(c, "allreduce", [x], name="x", op="mean"),
        "MPI all-reduce, no torch layer": lambda: c.allreduce_(a.copy()),
    }
    for fn in cases.values():  # warm-up
        per_call_us(fn, 200, c)
    times = {k: [] for k in cases}
    for _ in range(args.reps):
        for k, fn in cases.items():
            times[k].append(per_call_us(fn, args.calls, c))
    if hvd.rank() == 0:
        med = {k: statistics.median(v) for k, v in times.items()}
        print(f"{hvd.size()} ranks, {args.elements} float32 elements, {args.calls} calls x "
              f"{args.reps} alternated repetitions (medians)\n")
        print("| call | µs per call |\n|---|---:|")
        for k, v in med.items():
            print(f"| {k} | {v:.1f} |")
        share = med["the check alone"] / med["hvd.allreduce (with the check)"]
        print(f"\nThe check is {share:.0%} of a small hvd.allreduce's time.")


if __name__ == "__main__":
    main()
