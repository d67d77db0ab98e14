"""Per-layer time of one training step of a model-zoo model, and % of peak per conv layer.

Every leaf layer's forward and backward are timed (medians over ``--steps`` steps after
``--warmup``); conv layers also get the method the planner chose, their rate in direct
convolution FLOPs (2*N*F*C*KH*KW*OH*OW a product; 3 products with dx, 2 without) ÷ time,
and the rate of the arithmetic actually executed (Winograd: its GEMMs, 2*N*tiles*P*F*C a
product, P = 16 for F(2x2), 36 for F(4x4); transforms not counted; the other methods:
the direct FLOPs) ÷ time, with that rate's share of the sgemm rate measured in the same
run (a 1024^3 float32 matmul at the same thread count). Prints a Markdown table.

CPU time is measured next to wall time, because on a shared host wall time counts the
minutes other processes held the core: "CPU ms" is the process's CPU time (all threads)
per layer, and "main %" the calling thread's share of it. At 1 thread CPU ms is the
load-independent cost of the layer; at 2 threads a layer whose work is split evenly has
main % near 50, a serial one 100. The threads table after it gives each thread's CPU over
the timed steps and the speedup that split allows (total CPU / the busiest thread's CPU).
OpenBLAS threads spin-wait after a call, and the block threads look for their next share
(sched_yield) before they sleep: that counts as their CPU time too.

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

import distnn  # noqa: E402,F401  (before numpy, as the command: its BLAS thread-waiting default)
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


def thread_cpu() -> dict:
    """{(tid, name): CPU seconds} of this process's threads (Linux /proc)."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        out[(tid, name)] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out


def main() -> None:
    shape = SHAPES.get(args.model, (3, 32, 32))
    model = get_model(args.model, input_shape=shape, num_classes=10, dtype=np.float32, rng=0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.batch,) + shape).astype(np.float32)
    y = rng.integers(0, 10, args.batch)
    lossfn = CategoricalCrossEntropy()
    times = defaultdict(lambda: [[], []])
    cpu = defaultdict(lambda: [0.0, 0.0])  # per layer: process CPU, main-thread CPU
    order = []
    conv_shapes, conv_methods = {}, {}
    for i, layer in enumerate(leaves(model)):
        key = f"{i:02d} {type(layer).__name__}"
        order.append((key, layer))
        fwd, bwd = layer.forward, layer.backward

        def tf(xx, training=False, _f=fwd, _k=key, _l=layer):
            p0, m0, t0 = time.process_time(), time.thread_time(), time.perf_counter()
            out = _f(xx, training)
            times[_k][0].append(time.perf_counter() - t0)
            cpu[_k][0] += time.process_time() - p0
            cpu[_k][1] += time.thread_time() - m0
            if isinstance(_l, Conv2D):
                conv_shapes[_k] = (xx.shape, out.shape)
                conv_methods[_k] = getattr(_l, "_cache", None)
            return out

        def tb(dy, _b=bwd, _k=key):
            p0, m0, t0 = time.process_time(), time.thread_time(), time.perf_counter()
            out = _b(dy)
            times[_k][1].append(time.perf_counter() - t0)
            cpu[_k][0] += time.process_time() - p0
            cpu[_k][1] += time.thread_time() - m0
            return out

        layer.forward, layer.backward = tf, tb
        if hasattr(layer, "forward_add_relu"):  # a residual branch's last batch norm: its
            far = layer.forward_add_relu        # pass may write the block's sum and ReLU

            def tfar(xx, r, _f=far, _k=key):
                p0, m0, t0 = time.process_time(), time.thread_time(), time.perf_counter()
                out = _f(xx, r)
                if out is not None:  # else forward runs (and is timed)
                    times[_k][0].append(time.perf_counter() - t0)
                    cpu[_k][0] += time.process_time() - p0
                    cpu[_k][1] += time.thread_time() - m0
                return out

            layer.forward_add_relu = tfar
    steps = []
    for s in range(args.warmup + args.steps):
        if s == args.warmup:
            times.clear()
            cpu.clear()
            threads0, proc0 = thread_cpu(), time.process_time()
        t0 = time.perf_counter()
        logits = model.forward(x, training=True)
        _, dy = lossfn(logits, y)
        model.backward(dy)
        steps.append(time.perf_counter() - t0)
    threads1, proc_cpu = thread_cpu(), (time.process_time() - proc0) / args.steps
    peak = sgemm_peak()
    step_ms = 1e3 * float(np.median(steps[args.warmup:]))
    rows = []
    for key, layer in order:
        f, b = times[key]
        fm, bm = 1e3 * float(np.median(f)), 1e3 * float(np.median(b))
        desc = layer.describe() if hasattr(layer, "describe") else ""
        gf = pct = ""
        method = executed = ""
        if key in conv_shapes:
            (n, c, h, w), (_, fo, oh, ow) = conv_shapes[key]
            kh, kw = layer.kernel_size
            products = 3 if layer.need_dx else 2
            flop = 2.0 * n * fo * c * kh * kw * oh * ow * products
            cache = conv_methods.get(key)
            method, done = (cache.method, flop) if cache else ("?", flop)
            if cache is not None and cache.method == "winograd":
                m = cache.tile
                method = f"winograd F({m}x{m})"
                done = 2.0 * n * -(-oh // m) * -(-ow // m) * (m + 2) ** 2 * fo * c * products
            seconds = (fm + bm) * 1e-3
            rate, executed = flop / seconds / 1e9, done / seconds / 1e9
            gf, pct = f"{rate:.1f}", f"{100 * executed / peak:.0f}%"
            executed = f"{executed:.1f}"
            desc = f"{c}->{fo} {kh}x{kw} {h}x{w}" + ("" if layer.need_dx else " (no dx)")
        pc, mc = cpu[key]
        share = f"{100 * mc / pc:.0f}%" if pc > 0 else ""
        rows.append((fm + bm, key, desc, fm, bm, method, gf, executed, pct,
                     1e3 * pc / args.steps, share))
    total = sum(r[0] for r in rows)
    print(f"model {args.model}, batch {args.batch}, {args.threads} thread(s), kernels "
          f"{kernels.backend()}, step {step_ms:.1f} ms (sum of layers {total:.1f} ms), "
          f"process CPU {1e3 * proc_cpu:.1f} ms per step, sgemm 1024^3 {peak:.0f} GFLOP/s")
    print()
    print("| layer | config | fwd ms | bwd ms | share | method | direct GFLOP/s | executed "
          "GFLOP/s | executed ÷ sgemm | CPU ms | main % |")
    print("|---|---|---:|---:|---:|---|---:|---:|---:|---:|---:|")
    shown = sorted(rows, reverse=True)[:args.top] if args.top else rows
    for tot, key, desc, fm, bm, method, gf, executed, pct, pc, share in shown:
        print(f"| {key} | {desc} | {fm:.2f} | {bm:.2f} | {100 * tot / total:.0f}% | {method} "
              f"| {gf} | {executed} | {pct} | {pc:.2f} | {share} |")
    by_kind = defaultdict(float)
    for tot, key, *_ in rows:
        by_kind[key.split()[1]] += tot
    print()
    print("by kind: " + ", ".join(f"{k} {v:.1f} ms" for k, v in
                                 sorted(by_kind.items(), key=lambda kv: -kv[1])))
    used = {k: (v - threads0.get(k, 0.0)) / args.steps for k, v in threads1.items()}
    used = {k: v for k, v in used.items() if v > 0}
    if used:
        busiest = max(used.values())
        print()
        print(f"threads over the timed steps (CPU ms per step; the split allows at most "
              f"{sum(used.values()) / busiest:.2f}x over one thread doing all of it):")
        for (tid, name), v in sorted(used.items(), key=lambda kv: -kv[1]):
            print(f"  {name} ({tid}): {1e3 * v:.1f} ms")


if __name__ == "__main__":
    sys.exit(main())
