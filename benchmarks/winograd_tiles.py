"""Winograd F(2x2, 3x3) vs F(4x4, 3x3) vs im2col on the compiled path: forward+backward of
one 3x3 stride-1 'same' convolution, batch 64, float32. Prints a Markdown table of medians
(ms) of CPU time (``time.process_time``: all threads of this process), every variant
interleaved in every round; the measurements behind ``plan.winograd_tile``.

    python benchmarks/winograd_tiles.py [--batch 64] [--repeat 9] [--threads 1,2]
"""
from __future__ import annotations

import argparse
import time

import distnn  # noqa: F401  (before numpy, as the command)
import numpy as np
from threadpoolctl import threadpool_limits

from distnn import kernels
from distnn.kernels import conv as K
from distnn.kernels import planner as plan

SHAPES = [(16, 16, 32), (32, 32, 16), (64, 64, 8), (64, 128, 16), (128, 256, 8),
          (256, 256, 8), (512, 512, 4), (8, 8, 28), (16, 16, 14), (32, 32, 7), (16, 32, 32),
          (16, 16, 24), (16, 16, 28), (32, 32, 28)]
METHODS = {"im2col": "compiled", "F(2x2)": "winograd", "F(4x4)": "winograd4"}


def step(x, w, b, dy, method):
    if method == "compiled":  # the compiled im2col path, Winograd switched off
        with plan.using(winograd_min_channels=1 << 30, direct_max_ckk=0,
                        register_tiles=False):
            y, cache = K.conv2d_forward(x, w, b, (1, 1), (1, 1, 1, 1))
    else:
        y, cache = K.conv2d_forward(x, w, b, (1, 1), (1, 1, 1, 1), method=method)
    K.conv2d_backward(dy, cache, w)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=9)
    ap.add_argument("--threads", default="1,2")
    args = ap.parse_args(argv)
    kernels.set_backend("numba")
    threads = [int(t) for t in args.threads.split(",")]
    variants = [(name, t) for t in threads for name in METHODS]
    print(f"batch {args.batch}, float32, fwd+bwd, median ms of process CPU time over "
          f"{args.repeat} interleaved rounds")
    print()
    print("| C->F HxW | " + " | ".join(f"{n} {t}t" for n, t in variants) + " | F4÷F2 |")
    print("|---" + "|---:" * (len(variants) + 1) + "|")
    rng = np.random.default_rng(0)
    for c, f, h in SHAPES:
        x = rng.standard_normal((args.batch, c, h, h), dtype=np.float32)
        w = (rng.standard_normal((f, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32)
        b = np.zeros(f, np.float32)
        dy = rng.standard_normal((args.batch, f, h, h), dtype=np.float32)
        times = {v: [] for v in variants}
        for r in range(args.repeat + 1):
            for name, t in variants:
                with threadpool_limits(limits=t):
                    kernels.set_num_threads(t)
                    t0 = time.process_time()
                    step(x, w, b, dy, METHODS[name])
                    if r:  # the first round warms up (JIT cache load, scratch)
                        times[(name, t)].append(time.process_time() - t0)
        med = {v: 1e3 * float(np.median(ts)) for v, ts in times.items()}
        ratio = med[("F(4x4)", threads[0])] / max(med[("F(2x2)", threads[0])], 1e-9)
        print(f"| {c}->{f} {h}x{h} | " + " | ".join(f"{med[v]:.2f}" for v in variants)
              + f" | {ratio:.2f} |", flush=True)
    kernels.set_backend(None)


if __name__ == "__main__":
    main()
