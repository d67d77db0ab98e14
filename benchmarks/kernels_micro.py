"""Per-kernel micro-benchmark: forward+backward of distnn's conv, pooling, batch-norm and
ReLU layers on the NumPy path and the compiled (numba) path, at 1 and 2 threads, with
PyTorch CPU at the same thread counts. Prints a Markdown table of medians (ms).

The compiled path runs few-channel 3x3 convolutions on big planes (stride 1 and 2) as
register-tiled direct convolutions (``kernels/_vdirect.py``), other 3x3 stride-1 ones with
C >= 16 as Winograd F(2x2, 3x3) or F(4x4, 3x3) (``kernels/winograd.py``), stride-1 ones with
very few channels as direct loops and 1x1 ones as a strided slice + GEMMs
(``kernels/direct.py``); the "im2col" columns force the compiled im2col + GEMM path on the
same layers, so they are side by side; "F2" and "F4" force Winograd F(2x2, 3x3) or F(4x4,
3x3) wherever the default would take Winograd or the register-tiled direct kernels
(elsewhere they equal the default, less those); "blas" is the default with the register
tiles off (every GEMM on BLAS, no register-tiled direct kernels: the engine before them).

    python benchmarks/kernels_micro.py [--batch 64] [--repeat 30] [--threads 1,2] [--clock cpu]

``--clock cpu`` times the process's CPU time (all its threads) instead of wall time: on a
host that other processes load, the 1-thread columns then give each kernel's own cost; at
2 threads CPU time is the work of both threads (a kernel that splits perfectly costs what
it costs at 1 thread, spinning and duplicated work cost more), not the time to the result.
PyTorch's OpenMP threads spin between ops, so its 2-thread CPU columns mostly count spinning.

Runs are interleaved (every variant once per round) so load from other processes hits all
of them alike. Threads: BLAS through threadpoolctl, the compiled loops through
``distnn.kernels.set_num_threads``, torch through ``torch.set_num_threads``.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import time

import distnn  # noqa: F401  (before numpy, as the command: its BLAS thread-waiting default)
import numpy as np
from threadpoolctl import threadpool_limits

from distnn import kernels
from distnn.kernels import planner as plan
from distnn.nn.activations import ReLU
from distnn.nn.conv import Conv2D
from distnn.nn.normalization import BatchNormalization
from distnn.nn.pooling import MaxPool2D

# (label, layer factory, per-sample input shape, needs dx)
CASES = [
    ("conv 1->4 3x3 28x28 (simplecnn 1)", lambda: Conv2D(4, 3), (1, 28, 28), False),
    ("conv 4->8 3x3 26x26 (simplecnn 2)", lambda: Conv2D(8, 3), (4, 26, 26), True),
    ("conv 1->6 5x5 pad 2 28x28 (lenet 1)", lambda: Conv2D(6, 5, padding=2), (1, 28, 28), False),
    ("conv 6->16 5x5 14x14 (lenet 2)", lambda: Conv2D(16, 5), (6, 14, 14), True),
    ("conv 3->16 3x3 same 32x32 (resnet20 1)", lambda: Conv2D(16, 3, padding="same"),
     (3, 32, 32), False),
    ("conv 16->16 3x3 same 32x32", lambda: Conv2D(16, 3, padding="same"), (16, 32, 32), True),
    ("conv 16->32 3x3 s2 same 32x32", lambda: Conv2D(32, 3, strides=2, padding="same"),
     (16, 32, 32), True),
    ("conv 16->32 1x1 s2 32x32 (resnet20 shortcut)", lambda: Conv2D(32, 1, strides=2,
                                                                    use_bias=False),
     (16, 32, 32), True),
    ("conv 32->32 3x3 same 16x16", lambda: Conv2D(32, 3, padding="same"), (32, 16, 16), True),
    ("conv 64->64 3x3 same 8x8", lambda: Conv2D(64, 3, padding="same"), (64, 8, 8), True),
    ("conv 64->128 3x3 same 16x16 (vgg11bn)", lambda: Conv2D(128, 3, padding=1),
     (64, 16, 16), True),
    ("conv 128->256 3x3 same 8x8 (vgg11bn)", lambda: Conv2D(256, 3, padding=1),
     (128, 8, 8), True),
    ("conv 256->256 3x3 same 8x8 (vgg11bn)", lambda: Conv2D(256, 3, padding=1),
     (256, 8, 8), True),
    ("conv 512->512 3x3 same 4x4 (vgg11bn)", lambda: Conv2D(512, 3, padding=1),
     (512, 4, 4), True),
    ("maxpool 2x2 8x24x24", lambda: MaxPool2D(2), (8, 24, 24), True),
    ("maxpool 2x2 64x32x32 (vgg11bn)", lambda: MaxPool2D(2), (64, 32, 32), True),
    ("batchnorm 16x32x32", lambda: BatchNormalization(), (16, 32, 32), True),
    ("relu 16x32x32", lambda: ReLU(), (16, 32, 32), True),
]


def distnn_step(factory, shape, need_dx, batch):
    layer = factory()
    layer.build(shape, rng=np.random.default_rng(0), dtype=np.float32)
    layer.need_dx = need_dx
    x = np.random.default_rng(1).standard_normal((batch,) + shape).astype(np.float32)
    dy = np.random.default_rng(2).standard_normal((batch,) + layer.output_shape
                                                  ).astype(np.float32)

    def step():
        layer.forward(x, training=True)
        layer.backward(dy)
    return step, layer, x, dy


def torch_step(layer, x, dy, need_dx):
    import torch
    F = torch.nn.functional
    xt = torch.from_numpy(x).requires_grad_(need_dx)
    dyt = torch.from_numpy(dy)
    params = []
    if isinstance(layer, Conv2D):
        w = torch.from_numpy(layer.params["w"].copy()).requires_grad_(True)
        b = (torch.from_numpy(layer.params["b"].copy()).requires_grad_(True)
             if "b" in layer.params else None)  # use_bias=False: the 1x1 shortcut
        pt, pb, pl, pr = layer._pads
        params = [w] if b is None else [w, b]

        def op(inp):
            if not (pt == pb and pl == pr):
                inp = F.pad(inp, (pl, pr, pt, pb))
                return F.conv2d(inp, w, b, stride=layer.strides, dilation=layer.dilation)
            return F.conv2d(inp, w, b, stride=layer.strides, dilation=layer.dilation,
                            padding=(pt, pl))
    elif isinstance(layer, MaxPool2D):
        def op(inp):
            return F.max_pool2d(inp, layer.pool_size, layer.strides, layer.padding)
    elif isinstance(layer, BatchNormalization):
        c = x.shape[1]
        g = torch.ones(c, requires_grad=True)
        bt = torch.zeros(c, requires_grad=True)
        rm, rv = torch.zeros(c), torch.ones(c)
        params = [g, bt]

        def op(inp):
            return F.batch_norm(inp, rm, rv, g, bt, training=True)
    else:
        def op(inp):
            return F.relu(inp)

    def step():
        for p in params:
            p.grad = None
        xt.grad = None
        out = op(xt)
        out.backward(dyt)
    return step


# the planner's limits of each variant: "im2col" with no Winograd or direct kernels; "F2"
# and "F4" force the Winograd tile; "blas" is the default with every GEMM on BLAS and no
# register tiles (the last engine); the register-tiled direct kernels only in "numba"
_VARIANT_LIMITS = {
    "im2col": dict(winograd_min_channels=1 << 30, direct_max_ckk=0, pointwise_max_fc=0,
                   vector_max_cf=0, vector_max_cf2=0),
    "F2": dict(winograd4_min_cf=1 << 62, winograd4_min_area=1 << 62, vector_max_cf=0,
               vector_max_cf2=0),
    "F4": dict(winograd4_min_cf=0, winograd4_min_area=0, vector_max_cf=0, vector_max_cf2=0),
    "blas": dict(register_tiles=False),
}


def measure(variants, args, step, tstep):
    """Median ms of each variant, all variants interleaved in every round."""
    times = {v: [] for v in variants}
    clock = time.process_time if args.clock == "cpu" else time.perf_counter

    def run(v):
        kind, t = v
        with threadpool_limits(limits=t):
            if kind == "torch":
                import torch
                torch.set_num_threads(t)
                fn = tstep
            else:
                kernels.set_backend("numba" if kind in ("im2col", "F2", "F4", "blas") else kind)
                kernels.set_num_threads(t)
                fn = step
            with plan.using(**_VARIANT_LIMITS.get(kind, {})):
                fn()
                t0 = clock()
                fn()
                return clock() - t0

    for v in variants:  # warm-up (and JIT/cache load)
        run(v)
    for _ in range(args.repeat):
        for v in variants:
            times[v].append(run(v))
    return {v: 1e3 * float(np.median(ts)) for v, ts in times.items()}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="wall time, or the process's CPU time (all threads)")
    ap.add_argument("--torch-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    threads = [int(t) for t in args.threads.split(",")]
    if args.torch_only:  # the child process: PyTorch's columns, printed as JSON
        out = {}
        for label, factory, shape, need_dx in CASES:
            _, layer, x, dy = distnn_step(factory, shape, need_dx, args.batch)
            med = measure([("torch", t) for t in threads], args, None,
                          torch_step(layer, x, dy, need_dx))
            out[label] = {str(t): med[("torch", t)] for t in threads}
        print(json.dumps(out))
        return
    # PyTorch runs in its own process: its OpenMP threads keep spinning after each op and,
    # in one process with distnn's pools, slow both (distnn's 2-thread convs 10-20x).
    torch_ms = None
    if not args.no_torch and importlib.util.find_spec("torch") is not None:
        proc = subprocess.run([sys.executable, __file__, "--torch-only", "--batch",
                               str(args.batch), "--repeat", str(args.repeat), "--threads",
                               args.threads, "--clock", args.clock],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"the PyTorch process failed:\n{proc.stderr[-2000:]}")
        torch_ms = json.loads(proc.stdout.strip().splitlines()[-1])
    variants = [(k, t) for t in threads
                for k in ("numpy", "im2col", "F2", "F4", "blas", "numba")]
    head = ["case"] + [f"{k} {t}t" for k, t in variants]
    if torch_ms is not None:
        head += [f"torch {t}t" for t in threads]
    ratio_heads = [f"numba÷numpy {t}t" for t in threads] + [f"torch÷numba {t}t"
                                                             for t in threads]
    print(f"batch {args.batch}, float32, forward+backward, median ms "
          f"({'process CPU time' if args.clock == 'cpu' else 'wall time'}) over {args.repeat} "
          "interleaved rounds (first conv layers skip dx, as in a model; PyTorch measured "
          "first, in a process of its own; numba = the compiled default: register-tiled direct "
          "convolutions, Winograd, direct loops or 1x1 where they apply; im2col = the compiled "
          "im2col path forced; F2/F4 = Winograd F(2x2)/F(4x4) forced where Winograd applies; "
          "blas = the default without register tiles, every GEMM on BLAS)")
    print()
    print("| " + " | ".join(head + ratio_heads) + " |")
    print("|---" + "|---:" * (len(head) - 1 + len(ratio_heads)) + "|")
    for label, factory, shape, need_dx in CASES:
        step, _, _, _ = distnn_step(factory, shape, need_dx, args.batch)
        med = measure(variants, args, step, None)
        cells = [f"{med[v]:.2f}" for v in variants]
        if torch_ms is not None:
            cells += [f"{torch_ms[label][str(t)]:.2f}" for t in threads]
        ratios = [f"{med[('numpy', t)] / med[('numba', t)]:.2f}x" for t in threads]
        ratios += ([f"{torch_ms[label][str(t)] / med[('numba', t)]:.2f}x" for t in threads]
                   if torch_ms is not None else ["" for t in threads])
        print(f"| {label} | " + " | ".join(cells + ratios) + " |", flush=True)
    kernels.set_backend(None)


if __name__ == "__main__":
    main()
