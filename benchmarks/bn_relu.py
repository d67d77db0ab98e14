"""Batch norm + ReLU fusion and kept buffers, A/B in one process: training steps of a zoo
model with the BatchNormalization + ReLU pairs fused or apart, and with the layers' kept
output/dx buffers on or off, the variants interleaved round by round (a, b, c, d, a, ...).

Per variant, medians over the rounds: the step's wall time, the calling thread's CPU time
(``time.thread_time``; at 1 thread the load-independent cost), the BN + ReLU layers' wall
and main-thread CPU time per step, and minor page faults per step (``getrusage``): a fresh
large array per step costs one fault per page touched (or per huge page under numpy's
madvise) unless the allocator hands back memory it kept.

    python benchmarks/bn_relu.py --model vgg11bn --threads 1 [--rounds 7 --steps 3]
"""
from __future__ import annotations

import argparse
import os
import sys

ap = argparse.ArgumentParser(description=__doc__)
ap.add_argument("--model", default="vgg11bn")
ap.add_argument("--threads", type=int, default=1)
ap.add_argument("--batch", type=int, default=64)
ap.add_argument("--rounds", type=int, default=7)
ap.add_argument("--steps", type=int, default=3, help="steps per variant per round")
ap.add_argument("--variants", default="fused+keep,fused,apart+keep,apart",
                help="comma-separated: fused|apart, +keep = kept buffers")
args = ap.parse_args()
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ[_var] = str(args.threads)

import resource  # noqa: E402
import time  # noqa: E402

import distnn  # noqa: E402,F401  (before numpy, as the command)
import numpy as np  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

_limits = threadpool_limits(limits=args.threads)

from distnn import kernels  # noqa: E402
from distnn.models import get_model  # noqa: E402
from distnn.nn import BatchNormalization, ReLU, set_bn_relu_fusion  # noqa: E402
from distnn.nn.losses import CategoricalCrossEntropy  # noqa: E402


def instrument(model, acc):
    """Add each BN/ReLU call's wall and thread CPU time to acc[0], acc[1]."""
    for layer in model.walk():
        if not isinstance(layer, (BatchNormalization, ReLU)):
            continue
        for meth in ("forward", "backward"):
            f = getattr(layer, meth)

            def timed(*a, _f=f):
                t0, c0 = time.perf_counter(), time.thread_time()
                out = _f(*a)
                acc[0] += time.perf_counter() - t0
                acc[1] += time.thread_time() - c0
                return out
            setattr(layer, meth, timed)


def set_variant(model, name: str) -> None:
    set_bn_relu_fusion(model, name.startswith("fused"))
    keep = name.endswith("+keep")
    BatchNormalization.reuse_buffers = ReLU.reuse_buffers = keep
    if not keep:
        for layer in model.walk():
            getattr(layer, "_bufs", {}).clear()


def main() -> None:
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    for v in variants:
        if v.split("+")[0] not in ("fused", "apart") or v.count("+") > 1 or (
                "+" in v and not v.endswith("+keep")):
            sys.exit(f"--variants: {v!r} is not fused|apart[+keep]")
    shape = (3, 32, 32)
    model = get_model(args.model, input_shape=shape, num_classes=10, dtype=np.float32, rng=0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.batch,) + shape).astype(np.float32)
    y = rng.integers(0, 10, args.batch)
    lossfn = CategoricalCrossEntropy()
    acc = [0.0, 0.0]
    instrument(model, acc)

    def step():
        logits = model.forward(x, training=True)
        _, dy = lossfn(logits, y)
        model.backward(dy)

    for v in variants:  # warm-up: compile, first-touch the kept buffers
        set_variant(model, v)
        step()
        step()
    rows = {v: [] for v in variants}
    for _ in range(args.rounds):
        for v in variants:
            set_variant(model, v)
            step()  # the first step after a switch allocates the kept buffers
            acc[0] = acc[1] = 0.0
            f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            t0, c0 = time.perf_counter(), time.thread_time()
            for _s in range(args.steps):
                step()
            n = args.steps
            rows[v].append((1e3 * (time.perf_counter() - t0) / n,
                            1e3 * (time.thread_time() - c0) / n, 1e3 * acc[0] / n,
                            1e3 * acc[1] / n,
                            (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) / n))
    BatchNormalization.reuse_buffers = ReLU.reuse_buffers = False  # the default
    print(f"model {args.model}, batch {args.batch}, {args.threads} thread(s), kernels "
          f"{kernels.backend()}, {args.rounds} rounds x {args.steps} steps per variant, "
          "medians")
    print()
    print("| variant | step ms | step main-thread CPU ms | BN+ReLU ms | BN+ReLU main CPU ms "
          "| minor faults / step |")
    print("|---|---:|---:|---:|---:|---:|")
    for v in variants:
        med = np.median(np.array(rows[v]), axis=0)
        print(f"| {v} | {med[0]:.1f} | {med[1]:.1f} | {med[2]:.2f} | {med[3]:.2f} "
              f"| {med[4]:.0f} |")


if __name__ == "__main__":
    sys.exit(main())
