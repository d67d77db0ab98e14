"""Depthwise 3x3 convolutions, forward + backward (dx, dw), per layer shape of the zoo's
mobilenet_v2 on 3x32x32 input: distnn's compiled depthwise kernel (``_numba_depthwise``),
its NumPy reference (``grouped``'s "shifted" method) and torch's
``nn.Conv2d(groups=C)``, eager in NCHW and in channels_last. Batch 64, float32, 1 thread,
medians of rounds with the variants alternated (a, b, c, d, a, b, ...), in ms of this
thread's CPU time (``--clock cpu``, the default: at 1 thread it does not count the time
other processes take the core) or wall time. The load average before and after is printed
with the table.

    python benchmarks/grouped_conv.py [--batch 64] [--rounds 7] [--clock cpu]
"""
from __future__ import annotations

import argparse
import os
import time
from collections import Counter

import distnn  # noqa: F401  (before numpy, as the command: its BLAS thread-waiting default)
import numpy as np
from threadpoolctl import threadpool_limits

from distnn import kernels
from distnn.kernels.conv import conv2d_backward, conv2d_forward
from distnn.models import get_model
from distnn.nn import Conv2D


def mobilenet_shapes() -> Counter:
    """(channels, side, stride) of every depthwise layer of mobilenet_v2 on 3x32x32."""
    model = get_model("mobilenet_v2", input_shape=(3, 32, 32))
    return Counter((m.input_shape[0], m.input_shape[1], m.strides[0]) for m in model.walk()
                   if isinstance(m, Conv2D) and m.groups > 1)


def distnn_step(c, side, stride, batch, method):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, c, side, side)).astype(np.float32)
    w = (rng.standard_normal((c, 1, 3, 3)) / 3).astype(np.float32)
    pads = (1, 1, 1, 1)
    out = -(-side // stride)
    dy = rng.standard_normal((batch, c, out, out)).astype(np.float32)
    dw = np.empty_like(w)

    def step():
        _, cache = conv2d_forward(x, w, None, (stride, stride), pads, groups=c, method=method)
        assert cache.method == method
        conv2d_backward(dy, cache, w, dw_out=dw, need_db=False)
    return step


def torch_step(c, side, stride, batch, channels_last):
    import torch
    conv = torch.nn.Conv2d(c, c, 3, stride, 1, groups=c, bias=False)
    x = torch.randn(batch, c, side, side)
    if channels_last:
        conv = conv.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    x.requires_grad_(True)
    dy = torch.randn_like(conv(x))

    def step():
        conv.zero_grad(set_to_none=True)
        x.grad = None
        conv(x).backward(dy)
    return step


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    args = ap.parse_args(argv)
    import torch
    torch.set_num_threads(1)
    if kernels.set_backend("numba") != "numba":
        raise SystemExit("grouped_conv.py needs numba")
    kernels.set_num_threads(1)
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    load0 = os.getloadavg()
    print(f"batch {args.batch}, float32, 1 thread, {args.clock} ms, medians of {args.rounds} "
          f"alternated rounds; load average before: {load0[0]:.1f} {load0[1]:.1f} "
          f"{load0[2]:.1f} on {os.cpu_count()} CPUs\n")
    print("| depthwise 3x3 layer (fwd+bwd) | count | distnn compiled | NumPy reference | "
          "torch eager | torch channels_last | compiled vs best torch |")
    print("|---|---|---|---|---|---|---|")
    totals = Counter()
    with threadpool_limits(limits=1):
        for (c, side, stride), count in sorted(mobilenet_shapes().items(),
                                               key=lambda kv: (-kv[0][1], kv[0][0])):
            steps = {"compiled": distnn_step(c, side, stride, args.batch, "depthwise"),
                     "numpy": distnn_step(c, side, stride, args.batch, "shifted"),
                     "torch": torch_step(c, side, stride, args.batch, False),
                     "torch_cl": torch_step(c, side, stride, args.batch, True)}
            times = {name: [] for name in steps}
            for step in steps.values():
                step()  # compile, allocate
            for _ in range(args.rounds):
                for name, step in steps.items():
                    t0 = clock()
                    step()
                    times[name].append(clock() - t0)
            ms = {n: float(np.median(t)) * 1e3 for n, t in times.items()}
            for n, v in ms.items():
                totals[n] += v * count
            best = min(ms["torch"], ms["torch_cl"])
            print(f"| {c}ch {side}x{side} s{stride} | {count} | {ms['compiled']:.2f} | "
                  f"{ms['numpy']:.2f} | {ms['torch']:.2f} | {ms['torch_cl']:.2f} | "
                  f"{best / ms['compiled']:.2f}x |", flush=True)
    best = min(totals["torch"], totals["torch_cl"])
    print(f"| all 17 layers (x count) | 17 | {totals['compiled']:.1f} | {totals['numpy']:.1f} "
          f"| {totals['torch']:.1f} | {totals['torch_cl']:.1f} | "
          f"{best / totals['compiled']:.2f}x |")
    load1 = os.getloadavg()
    print(f"\nload average after: {load1[0]:.1f} {load1[1]:.1f} {load1[2]:.1f}")


if __name__ == "__main__":
    main()
