"""Per-layer time of one training step of a model-zoo model, and % of peak per conv layer.

Every leaf layer's forward and backward are timed (medians over ``--steps`` steps after
``--warmup``); conv layers also get their GFLOP/s and the share of the measured single-core
sgemm peak (a 1024^3 float32 matmul at the same thread count). Prints a Markdown table.

    python benchmarks/layer_profile.py --model resnet20 --threads 1 [--kernels numpy|numba]
"""
from __future__ import annotations

import argparse
import os
import sys

ap = argparse.ArgumentParser(description=__doc__)
ap.add_argument("--model", default="resnet20")
ap.add_argument("--threads", type=int, default=1)
ap.add_argument("--batch", type=int, default=64)
ap.add_argument("--steps", type=int, default=10)
ap.add_argument("--warmup", type=int, default=3)
ap.add_argument("--kernels", default=None, help="numpy or numba (default: DISTNN_KERNELS)")
ap.add_argument("--top", type=int, default=0, help="only the N slowest layers (0: all)")
args = ap.parse_args()
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ[_var] = str(args.threads)
if args.kernels:
    os.environ["DISTNN_KERNELS"] = args.kernels

import time  # noqa: E402
from collections import defaultdict  # noqa: E402

import numpy as np  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

_limits = threadpool_limits(limits=args.threads)

from distnn import kernels  # noqa: E402
from distnn.models import get_model  # noqa: E402
from distnn.nn.conv import Conv2D  # noqa: E402
from distnn.nn.losses import CategoricalCrossEntropy  # noqa: E402

SHAPES = {"simplecnn": (1, 28, 28), "simplecnn_pydtnn": (1, 28, 28), "lenet": (1, 28, 28),
          "vgg11bn": (3, 32, 32), "resnet20": (3, 32, 32)}


def leaves(layer):
    subs = layer.sublayers()
    if not subs:
        yield layer
    for s in subs:
        yield from leaves(s)


def sgemm_peak() -> float:
    a = np.ones((1024, 1024), np.float32)
    c = np.empty_like(a)
    ts = []
    for _ in range(7):
        t0 = time.perf_counter()
        np.matmul(a, a, out=c)
        ts.append(time.perf_counter() - t0)
    return 2 * 1024 ** 3 / float(np.median(ts)) / 1e9


def main() -> None:
    shape = SHAPES.get(args.model, (3, 32, 32))
    model = get_model(args.model, input_shape=shape, num_classes=10, dtype=np.float32, rng=0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.batch,) + shape).astype(np.float32)
    y = rng.integers(0, 10, args.batch)
    lossfn = CategoricalCrossEntropy()
    times = defaultdict(lambda: [[], []])
    order = []
    conv_shapes = {}
    for i, layer in enumerate(leaves(model)):
        key = f"{i:02d} {type(layer).__name__}"
        order.append((key, layer))
        fwd, bwd = layer.forward, layer.backward

        def tf(xx, training=False, _f=fwd, _k=key, _l=layer):
            t0 = time.perf_counter()
            out = _f(xx, training)
            times[_k][0].append(time.perf_counter() - t0)
            if isinstance(_l, Conv2D):
                conv_shapes[_k] = (xx.shape, out.shape)
            return out

        def tb(dy, _b=bwd, _k=key):
            t0 = time.perf_counter()
            out = _b(dy)
            times[_k][1].append(time.perf_counter() - t0)
            return out

        layer.forward, layer.backward = tf, tb
    steps = []
    for s in range(args.warmup + args.steps):
        if s == args.warmup:
            times.clear()
        t0 = time.perf_counter()
        logits = model.forward(x, training=True)
        _, dy = lossfn(logits, y)
        model.backward(dy)
        steps.append(time.perf_counter() - t0)
    peak = sgemm_peak()
    step_ms = 1e3 * float(np.median(steps[args.warmup:]))
    rows = []
    for key, layer in order:
        f, b = times[key]
        fm, bm = 1e3 * float(np.median(f)), 1e3 * float(np.median(b))
        desc = layer.describe() if hasattr(layer, "describe") else ""
        gf = pct = ""
        if key in conv_shapes:
            (n, c, h, w), (_, fo, oh, ow) = conv_shapes[key]
            kh, kw = layer.kernel_size
            flop = 2.0 * n * fo * c * kh * kw * oh * ow * (3 if layer.need_dx else 2)
            rate = flop / ((fm + bm) * 1e-3) / 1e9
            gf, pct = f"{rate:.1f}", f"{100 * rate / peak:.0f}%"
            desc = f"{c}->{fo} {kh}x{kw} {h}x{w}" + ("" if layer.need_dx else " (no dx)")
        rows.append((fm + bm, key, desc, fm, bm, gf, pct))
    total = sum(r[0] for r in rows)
    print(f"model {args.model}, batch {args.batch}, {args.threads} thread(s), kernels "
          f"{kernels.backend()}, step {step_ms:.1f} ms (sum of layers {total:.1f} ms), "
          f"sgemm 1024^3 peak {peak:.0f} GFLOP/s")
    print()
    print("| layer | config | fwd ms | bwd ms | share | conv GFLOP/s | % of peak |")
    print("|---|---|---:|---:|---:|---:|---:|")
    shown = sorted(rows, reverse=True)[:args.top] if args.top else rows
    for tot, key, desc, fm, bm, gf, pct in shown:
        print(f"| {key} | {desc} | {fm:.2f} | {bm:.2f} | {100 * tot / total:.0f}% | {gf} | {pct} |")
    by_kind = defaultdict(float)
    for tot, key, *_ in rows:
        by_kind[key.split()[1]] += tot
    print()
    print("by kind: " + ", ".join(f"{k} {v:.1f} ms" for k, v in
                                 sorted(by_kind.items(), key=lambda kv: -kv[1])))


if __name__ == "__main__":
    sys.exit(main())
