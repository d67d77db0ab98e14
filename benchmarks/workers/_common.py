"""What every benchmark worker shares: thread pinning, data, the timed loop, the JSON line.

Workers are plain scripts run in a fresh interpreter (one measurement per process) by
``python -m benchmarks``. Each one calls ``parse_args()`` and ``pin_threads()`` first, before
anything imports numpy or torch, so the BLAS/OpenMP pools start with the requested size.
This module only imports the standard library at the top for that reason.

Protocol: rank 0 prints exactly one line ``BENCH_JSON {...}`` on stdout (see ``report``).
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import resource
import sys
import time

MARKER = "BENCH_JSON "
FMNIST_DIR = os.environ.get("FMNIST_DIR", "/usr/share/datasets/fashion-mnist")
# Per-sample input shape of every model the suite knows.
INPUT_SHAPES = {
    "simplecnn": (1, 28, 28), "simplecnn_pydtnn": (1, 28, 28), "lenet": (1, 28, 28),
    "vgg11bn": (3, 32, 32), "resnet20": (3, 32, 32),
}
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
               "BLIS_NUM_THREADS", "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")


def parse_args(extra=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", required=True, choices=sorted(INPUT_SHAPES))
    ap.add_argument("--threads", type=int, default=1, help="BLAS/OpenMP threads per rank")
    ap.add_argument("--batch", type=int, default=64, help="samples per rank per step")
    ap.add_argument("--warmup", type=int, default=20, help="untimed steps first")
    ap.add_argument("--windows", type=int, default=7, help="timed windows")
    ap.add_argument("--steps", type=int, default=30, help="steps per timed window")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--task", choices=("train", "infer"), default="train",
                    help="train: a training step; infer: forward only, inference mode")
    if extra:
        extra(ap)
    a = ap.parse_args()
    if min(a.threads, a.batch, a.windows, a.steps) < 1 or a.warmup < 0:
        ap.error("--threads, --batch, --windows and --steps must be >= 1, --warmup >= 0")
    return a


def pin_threads(n: int) -> None:
    """Set every thread-count variable; call before numpy/torch are imported."""
    if "numpy" in sys.modules or "torch" in sys.modules:
        raise RuntimeError("pin_threads() must run before numpy/torch are imported")
    for var in THREAD_VARS:
        os.environ[var] = str(n)


def limit_blas(n: int):
    """threadpoolctl limit on top of the environment (returned object must be kept)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return None
    return threadpool_limits(limits=n)


def mpi_rank_size() -> tuple[int, int]:
    """Rank and size from the launcher's environment (MPICH hydra, Open MPI, Slurm)."""
    for r, s in (("PMI_RANK", "PMI_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
                 ("PMIX_RANK", "PMIX_SIZE"), ("SLURM_PROCID", "SLURM_NTASKS")):
        if r in os.environ and s in os.environ:
            return int(os.environ[r]), int(os.environ[s])
    return 0, 1


def _load_idx(path: str):
    import numpy as np
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic = int.from_bytes(data[0:4], "big")
    if magic >> 8 != 0x08:
        raise ValueError(f"{path}: not an unsigned-byte idx file (magic {magic:#x})")
    ndim = magic & 0xFF
    dims = [int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def rank_shard(model: str, rank: int, size: int, seed: int):
    """This rank's training samples, shuffled once: (x float32 NCHW, y int64).

    Fashion-MNIST for the 1x28x28 models (a 1/size shard of the 60k training images, the
    same permutation on every rank); a synthetic pool of 2048 CIFAR-sized samples per rank
    for the 3x32x32 models. Only the shard is converted to float32.
    """
    import numpy as np
    shape = INPUT_SHAPES[model]
    if shape == (1, 28, 28):
        xs = _load_idx(f"{FMNIST_DIR}/train-images-idx3-ubyte.gz")
        ys = _load_idx(f"{FMNIST_DIR}/train-labels-idx1-ubyte.gz")
        perm = np.random.default_rng(seed).permutation(len(xs))[rank::size]
        x = xs[perm].astype(np.float32)[:, None]
        x /= np.float32(255.0)
        y = ys[perm].astype(np.int64)
        del xs, ys
        return np.ascontiguousarray(x), y
    rng = np.random.default_rng([seed, rank])
    x = rng.standard_normal((2048,) + shape, dtype=np.float32)
    y = rng.integers(0, 10, 2048).astype(np.int64)
    return x, y


def batches(x, y, batch: int):
    """Endless contiguous batches (views, no copies) cycling over the shard."""
    n = (len(x) // batch) * batch
    if n == 0:
        raise ValueError(f"shard of {len(x)} samples is smaller than one batch of {batch}")
    i = 0
    while True:
        yield x[i:i + batch], y[i:i + batch]
        i = (i + batch) % n


def timed_windows(step, data, *, warmup: int, windows: int, steps: int,
                  comm_time=lambda: 0.0, barrier=lambda: None):
    """Run ``warmup`` steps, then ``windows`` windows of ``steps`` steps.

    ``step(x, y)`` does one full training step (or, for ``--task infer``, one forward).
    ``comm_time()`` returns the seconds this rank has spent blocked on gradient
    communication so far (cumulative). Ranks meet at a barrier (not timed) before each
    window. Returns this rank's per-window wall seconds and per-window communication-wait
    seconds.
    """
    global FIRST_STEP_S
    for i in range(warmup):
        t0 = time.perf_counter()
        step(*next(data))
        if i == 0:
            FIRST_STEP_S = time.perf_counter() - t0
    wall, comm = [], []
    for _ in range(windows):
        barrier()
        c0 = comm_time()
        t0 = time.perf_counter()
        for _ in range(steps):
            step(*next(data))
        wall.append(time.perf_counter() - t0)
        comm.append(comm_time() - c0)
    return wall, comm


# the first warm-up step's seconds: for torch.compile, its compile time (not in samples/s)
FIRST_STEP_S = 0.0


def rank_record(wall, comm) -> dict:
    """What each rank contributes: its windows and its peak RSS (KiB on Linux)."""
    return {"wall_s": wall, "comm_s": comm, "first_step_s": FIRST_STEP_S,
            "maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
            "pid": os.getpid()}


def report(args, system: str, per_rank: list[dict], **meta) -> None:
    """Combine the ranks' records (rank 0 only) and print the BENCH_JSON line.

    A window's time is the slowest rank's; its throughput is all ranks' samples over that
    time. Communication wait per step is the mean over ranks; compute = step - wait.
    """
    size = len(per_rank)
    nwin = len(per_rank[0]["wall_s"])
    win = [max(r["wall_s"][w] for r in per_rank) for w in range(nwin)]
    comm = [sum(r["comm_s"][w] for r in per_rank) / size for w in range(nwin)]
    out = {
        "system": system, "model": args.model, "ranks": size, "threads": args.threads,
        "batch_per_rank": args.batch, "warmup": args.warmup, "steps_per_window": args.steps,
        "samples_per_s": [size * args.batch * args.steps / t for t in win],
        "step_s": [t / args.steps for t in win],
        "comm_wait_s": [c / args.steps for c in comm],
        "peak_rss_mib": [r["maxrss_kib"] / 1024.0 for r in per_rank],
        "first_step_s": max(r.get("first_step_s", 0.0) for r in per_rank),
        "task": args.task,
        "python": platform.python_version(),
    }
    out.update(meta)
    print(MARKER + json.dumps(out), flush=True)
