"""Attention forward+backward: peak memory against the sequence length, and tokens/s
against PyTorch's ``scaled_dot_product_attention``. Prints two Markdown tables.

    python benchmarks/attention_memory.py [--lengths 256,512,1024,2048,4096] [--heads 1]
        [--dim 32] [--speed-shape 16,4,128,32] [--repeat 20] [--clock wall|cpu]
        [--skip-memory] [--skip-speed]

Memory: the peak of NumPy allocations (``tracemalloc``, which sees every NumPy array)
during one causal float32 forward+backward at batch 1, above the inputs, for the tiled
kernel (``distnn.kernels.attention``, NumPy path: tiles of 64 keys, only o and the
row log-sum-exp kept) and the naive one (``attention_reference``: the whole Tq x Tk
probability matrix kept for the backward). The compiled path allocates through numba's
own allocator, which tracemalloc does not see, so its column is not measured this way; its
work arrays are (Tk, D) per (batch, head) item by construction.

Speed: causal float32 forward+backward at a gpt_mini-like shape (B, H, T, D), 1 thread
everywhere (BLAS through threadpoolctl, the compiled loops, torch), median over
``--repeat`` runs, interleaved so that load from other processes hits all alike;
tokens/s = B * T / time. ``--clock cpu`` times the process's CPU time instead of wall time
(everything runs on one thread, so on a host that other processes load it gives each
implementation's own cost).
"""
from __future__ import annotations

import argparse
import statistics
import time
import tracemalloc

import distnn  # noqa: F401  (before numpy, as the command: its BLAS thread-waiting default)
import numpy as np
from threadpoolctl import threadpool_limits

from distnn import kernels
from distnn.kernels.attention import (attention_backward, attention_forward,
                                      attention_reference, attention_reference_backward)


def fused(q, k, v, do):
    o, lse = attention_forward(q, k, v, causal=True)
    return attention_backward(q, k, v, o, lse, do, causal=True)


def naive(q, k, v, do):
    _, p = attention_reference(q, k, v, causal=True)
    return attention_reference_backward(q, k, v, p, do)


def _inputs(b, h, t, d, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((b, h, t, d)).astype(np.float32) for _ in range(4)]


def peak_mib(fn, arrays) -> float:
    tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    out = fn(*arrays)
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    del out
    return peak / 2**20


def memory_table(lengths, heads, dim) -> None:
    kernels.set_backend("numpy")
    print(f"\nPeak memory of one causal float32 forward+backward, B=1, H={heads}, D={dim} "
          "(MiB, tracemalloc, above the inputs)\n")
    print("| T | tiled (distnn) | naive (whole matrix) | naive / tiled | tiled MiB per 1k T |")
    print("|---:|---:|---:|---:|---:|")
    for t in lengths:
        arrays = _inputs(1, heads, t, dim)
        a = peak_mib(fused, arrays)
        b = peak_mib(naive, arrays)
        print(f"| {t} | {a:.2f} | {b:.1f} | {b / a:.1f}x | {a / t * 1000:.2f} |")


def speed_table(shape, repeat, clock) -> None:
    import torch
    F = torch.nn.functional
    b, h, t, d = shape
    torch.set_num_threads(1)
    q, k, v, do = _inputs(b, h, t, d)
    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    tdo = torch.tensor(do)

    def torch_sdpa():
        # loading numba's OpenMP layer (the compiled backend) sets torch's threads to 2
        torch.set_num_threads(1)
        for x in (tq, tk, tv):
            x.grad = None
        F.scaled_dot_product_attention(tq, tk, tv, is_causal=True).backward(tdo)

    def on(backend, fn):
        def run():
            kernels.set_backend(backend)
            fn(q, k, v, do)
        return run

    variants = {"torch F.scaled_dot_product_attention": torch_sdpa}
    if "numba" in _backends():
        variants["distnn tiled, compiled"] = on("numba", fused)
    variants["distnn tiled, NumPy"] = on("numpy", fused)
    variants["naive NumPy (whole matrix)"] = on("numpy", naive)
    times = {name: [] for name in variants}
    with threadpool_limits(limits=1):
        kernels.set_backend("numba" if "numba" in _backends() else "numpy")
        kernels.set_num_threads(1)
        for fn in variants.values():  # warm-up: compilation, caches
            fn()
        for _ in range(repeat):
            for name, fn in variants.items():
                t0 = clock()
                fn()
                times[name].append(clock() - t0)
    ref = statistics.median(times["torch F.scaled_dot_product_attention"])
    print(f"\nCausal float32 forward+backward, B={b}, H={h}, T={t}, D={d}, 1 thread, "
          f"median of {repeat}, {clock.__name__}\n")
    print("| implementation | ms | tokens/s | time / torch |")
    print("|---|---:|---:|---:|")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"| {name} | {med * 1e3:.2f} | {b * t / med:,.0f} | {med / ref:.2f}x |")


def _backends():
    try:
        import numba  # noqa: F401
        return ("numpy", "numba")
    except ImportError:
        return ("numpy",)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", default="256,512,1024,2048,4096")
    ap.add_argument("--heads", type=int, default=1)
    ap.add_argument("--dim", type=int, default=32)
    ap.add_argument("--speed-shape", default="16,4,128,32", help="B,H,T,D")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    ap.add_argument("--skip-memory", action="store_true")
    ap.add_argument("--skip-speed", action="store_true")
    args = ap.parse_args(argv)
    if not args.skip_memory:
        memory_table([int(x) for x in args.lengths.split(",")], args.heads, args.dim)
    if not args.skip_speed:
        clock = time.perf_counter if args.clock == "wall" else time.process_time
        speed_table(tuple(int(x) for x in args.speed_shape.split(",")), args.repeat, clock)


if __name__ == "__main__":
    main()
