"""One gradient bucket's exchange, timed three (or four) ways under ``mpiexec -n R``:

- ``dense``: the float32 bucket all-reduced as it is (``MPIComm.iallreduce_``);
- ``fp16 op``: cast to float16, all-reduced with the user-defined MPI op that adds pairs in
  float32 (``MPIComm(fp16="op")``: the path when MPI has no float16 sum), cast back;
- ``fp16 native``: the same with MPI's own float16 sum (only when the library has one);
- ``fp16 new``: cast into ``HalfSumExchange`` (all-to-all of float16 chunks, float32 sum,
  all-gather; what the Reducer's "fp16" buckets use), cast back.

Every variant casts with ``distnn.kernels.half`` (as the Reducer does) and copies the
bucket in and out as the Reducer's float16 paths do. For each bucket size (bytes of the
float32 bucket) every repetition runs the variants one after the other (A B C D A B C D
...); one measurement is ``--iters`` back-to-back
exchanges (started and waited, as a bucket is) between two barriers, and counts the
slowest rank's time per exchange. Rank 0 prints the medians over ``--reps`` repetitions
and the new path's ratios to the others.

    mpiexec -n 2 .venv/bin/python benchmarks/fp16_exchange.py [--reps 7] [--blocking]
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from distnn import distributed as dist
from distnn import kernels
from distnn.distributed.halfsum import HalfSumExchange
from distnn.kernels.half import from_half, to_half

SIZES = [64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20]


def variants(comm, grads: np.ndarray, blocking: bool) -> dict:
    """{name: one exchange of ``grads`` (float32, left unchanged), as that path runs a
    bucket: into a work buffer, exchanged, back into ``out``}."""
    work, out = np.empty_like(grads), np.empty_like(grads)

    def reduce(c, arr):
        if blocking:
            c.allreduce_(arr, "sum")
        else:
            c.iallreduce_(arr, "sum").wait()

    def dense():
        np.copyto(work, grads)
        reduce(comm, work)
        np.copyto(out, work)

    def halved(c):
        wire = np.empty(grads.size, np.float16)

        def run():
            to_half(grads, wire)
            reduce(c, wire)
            from_half(wire, out)
        return run

    ex = HalfSumExchange(comm, [grads.size])

    def new():
        to_half(grads, ex.wire(0))
        ex.start(0).wait()
        from_half(ex.wire(0), out)

    fns = {"dense": dense, "fp16 op": halved(dist.MPIComm(comm.comm, fp16="op"))}
    mpi = comm.MPI
    if getattr(mpi, "FLOAT16_T", mpi.DATATYPE_NULL) != mpi.DATATYPE_NULL:
        fns["fp16 native"] = halved(dist.MPIComm(comm.comm, fp16="native"))
    fns["fp16 new"] = new
    return fns


def timed(comm, fn, iters: int) -> float:
    """Seconds per exchange, the slowest rank's."""
    comm.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    mine = (time.perf_counter() - t0) / iters
    return comm.allreduce_obj(mine, "max")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=7, help="repetitions (>= 5)")
    parser.add_argument("--iters", type=int, default=0,
                        help="exchanges per measurement (0: 8 MiB of buckets, 2 to 64)")
    parser.add_argument("--sizes", default="",
                        help="comma-separated bucket sizes in KiB (default 64 to 16384)")
    parser.add_argument("--blocking", action="store_true",
                        help="dense and the float16 all-reduces blocking (MPI Allreduce)")
    args = parser.parse_args()
    comm = dist.init()
    sizes = [int(s) << 10 for s in args.sizes.split(",")] if args.sizes else SIZES
    rows = []
    for nbytes in sizes:
        rng = np.random.default_rng(comm.rank)
        grads = rng.standard_normal(nbytes // 4).astype(np.float32)
        fns = variants(comm, grads, args.blocking)
        iters = args.iters or max(2, min(64, (8 << 20) // nbytes))
        for fn in fns.values():  # warm-up: buffers, the duplicate communicator
            timed(comm, fn, 1)
        times: dict[str, list[float]] = {name: [] for name in fns}
        for _ in range(args.reps):
            for name, fn in fns.items():
                times[name].append(timed(comm, fn, iters))
        rows.append((nbytes, iters, {k: statistics.median(v) for k, v in times.items()}))
    if comm.rank == 0:
        names = list(rows[0][2])
        others = [n for n in names if n != "fp16 new"]
        print(f"ranks {comm.size}, {comm.library_version()}, kernels {kernels.backend()}, "
              f"{'blocking' if args.blocking else 'non-blocking'} all-reduces, "
              f"medians of {args.reps} alternated repetitions, ms per exchange")
        print("| float32 bucket | iters | " + " | ".join(f"{n} ms" for n in names) + " | "
              + " | ".join(f"new / {n.replace('fp16 ', '')}" for n in others) + " |")
        print("|---" * (2 + len(names) + len(others)) + "|")
        for nbytes, iters, med in rows:
            size = f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"
            cells = [f"{med[n] * 1e3:.3f}" for n in names]
            ratios = [f"{med['fp16 new'] / med[n]:.2f}" for n in others]
            print(f"| {size} | {iters} | " + " | ".join(cells + ratios) + " |")


if __name__ == "__main__":
    main()
