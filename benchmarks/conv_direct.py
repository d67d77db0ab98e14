"""The compiled convolutions without columns (``kernels/direct.py``: direct stride-1 loops,
and 1x1 kernels as a strided slice + GEMMs) against the compiled im2col + GEMM path on the
same layers: the path the compiled backend picks (``use_direct``, ``use_pointwise``; named
in the last column) against im2col forced; 3x3 layers with C >= 16 would go to Winograd
first, so none is listed. Forward + backward of a Conv2D layer, batch 64,
medians of the rounds (variants interleaved: a, b, a, b, ...), in ms of this thread's CPU
time (``--clock cpu``, the default: load-independent at 1 thread) or wall time.

    python benchmarks/conv_direct.py [--batch 64] [--rounds 15] [--threads 1] [--clock cpu]
"""
from __future__ import annotations

import argparse
import time

import distnn  # noqa: F401  (before numpy, as the command: its BLAS thread-waiting default)
import numpy as np
from threadpoolctl import threadpool_limits

from distnn import kernels
from distnn.kernels import planner as plan
from distnn.nn.conv import Conv2D

# (label, filters, kernel, padding, per-sample input shape, needs dx[, strides])
CASES = [
    ("1->4 3x3 pad 1 28x28 (simplecnn_pydtnn 1)", 4, 3, 1, (1, 28, 28), False),
    ("4->8 3x3 pad 1 28x28 (simplecnn_pydtnn 2)", 8, 3, 1, (4, 28, 28), True),
    ("1->4 3x3 28x28 (simplecnn 1)", 4, 3, 0, (1, 28, 28), False),
    ("4->8 3x3 26x26 (simplecnn 2)", 8, 3, 0, (4, 26, 26), True),
    ("1->6 5x5 pad 2 28x28 (lenet 1)", 6, 5, 2, (1, 28, 28), False),
    ("6->16 5x5 14x14 (lenet 2)", 16, 5, 0, (6, 14, 14), True),
    ("3->16 3x3 pad 1 32x32 (resnet20 1)", 16, 3, 1, (3, 32, 32), False),
    ("3->64 3x3 pad 1 32x32 (vgg 1)", 64, 3, 1, (3, 32, 32), False),
    ("8->8 3x3 pad 1 26x26", 8, 3, 1, (8, 26, 26), True),
    ("8->16 3x3 pad 1 32x32", 16, 3, 1, (8, 32, 32), True),
    ("12->12 3x3 pad 1 16x16", 12, 3, 1, (12, 16, 16), True),
    ("6->16 5x5 pad 2 14x14", 16, 5, 2, (6, 14, 14), True),
    ("3->8 5x5 32x32", 8, 5, 0, (3, 32, 32), True),
    ("16->32 1x1 16x16", 32, 1, 0, (16, 16, 16), True),
    ("64->64 1x1 8x8", 64, 1, 0, (64, 8, 8), True),
    ("8->32 1x1 32x32", 32, 1, 0, (8, 32, 32), True),
    ("16->32 1x1 s2 32x32 (resnet20 shortcut)", 32, 1, 0, (16, 32, 32), True, 2),
    ("32->64 1x1 s2 16x16 (resnet20 shortcut)", 64, 1, 0, (32, 16, 16), True, 2),
]


def layer_step(filters, k, pad, shape, need_dx, batch, new, strides=1):
    rng = np.random.default_rng(0)
    layer = Conv2D(filters, k, strides=strides, padding=pad)
    layer.build(shape, rng=rng, dtype=np.float32)
    layer.need_dx = need_dx
    x = rng.standard_normal((batch,) + shape).astype(np.float32)
    dy = rng.standard_normal((batch,) + layer.output_shape).astype(np.float32)

    def step():
        with plan.using(**({} if new else IM2COL)):
            layer.forward(x, training=True)
            cache = layer._cache
            layer.backward(dy)
        return "direct" if cache.direct else "1x1" if cache.pointwise else "im2col"
    return step


# the planner's limits that leave im2col + GEMM (no direct, 1x1 or register-tiled kernels)
IM2COL = dict(direct_max_ckk=0, pointwise_max_fc=0, vector_max_cf=0, vector_max_cf2=0)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    args = ap.parse_args(argv)
    if kernels.set_backend("numba") != "numba":
        raise SystemExit("conv_direct.py needs numba")
    kernels.set_num_threads(args.threads)
    clock = time.thread_time if args.clock == "cpu" and args.threads == 1 else \
        time.process_time if args.clock == "cpu" else time.perf_counter
    print(f"batch {args.batch}, {args.threads} thread(s), {args.clock} ms, medians of "
          f"{args.rounds} interleaved rounds\n")
    print("| layer (fwd+bwd) | im2col + GEMM | chosen | speed-up | chosen path |")
    print("|---|---|---|---|---|")
    with threadpool_limits(limits=args.threads):
        for label, *case in CASES:
            steps = {"im2col": layer_step(*case[:5], args.batch, False, *case[5:]),
                     "direct": layer_step(*case[:5], args.batch, True, *case[5:])}
            times = {name: [] for name in steps}
            for step in steps.values():
                path = step()  # compile, allocate
            for _ in range(args.rounds):
                for name, step in steps.items():
                    t0 = clock()
                    step()
                    times[name].append(clock() - t0)
            a, b = (float(np.median(times[n])) * 1e3 for n in ("im2col", "direct"))
            print(f"| {label} | {a:.2f} | {b:.2f} | {a / b:.2f}x | {path} |", flush=True)


if __name__ == "__main__":
    main()
