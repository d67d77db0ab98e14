"""Forward+backward time of distnn's conv/pool layers against PyTorch CPU, one thread.

The cases are simplecnn's layers on 1x28x28 input at batch 64 (plus a few wider ones);
the first conv layer skips dx in both engines, as it does in a model. Prints medians.

    python benchmarks/kernels_micro.py [--batch 64] [--repeat 50] [--dtype float32]
"""
from __future__ import annotations

import argparse
import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import time  # noqa: E402

import numpy as np  # noqa: E402

from distnn.nn.conv import Conv2D  # noqa: E402
from distnn.nn.pooling import MaxPool2D  # noqa: E402

# (label, layer factory, per-sample input shape, needs dx)
CASES = [
    ("conv1 simplecnn 1->4 3x3 28x28", lambda: Conv2D(4, 3), (1, 28, 28), False),
    ("conv2 simplecnn 4->8 3x3 26x26", lambda: Conv2D(8, 3), (4, 26, 26), True),
    ("maxpool 2x2 8x24x24", lambda: MaxPool2D(2), (8, 24, 24), True),
    ("conv 16->16 3x3 same 32x32", lambda: Conv2D(16, 3, padding="same"), (16, 32, 32), True),
    ("conv 16->32 3x3 s2 same 32x32", lambda: Conv2D(32, 3, strides=2, padding="same"),
     (16, 32, 32), True),
]


def median_ms(fns, repeat: int) -> list[float]:
    """Median time of each function; runs are interleaved so that load from other
    processes hits all of them alike."""
    for fn in fns:
        fn()
        fn()
    times = [[] for _ in fns]
    for _ in range(repeat):
        for fn, ts in zip(fns, times):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
    return [1e3 * float(np.median(ts)) for ts in times]


def distnn_step(factory, shape, need_dx, batch, dtype):
    layer = factory()
    layer.build(shape, rng=np.random.default_rng(0), dtype=dtype)
    layer.need_dx = need_dx
    x = np.random.default_rng(1).standard_normal((batch,) + shape).astype(dtype)
    dy = np.random.default_rng(2).standard_normal((batch,) + layer.output_shape).astype(dtype)

    def fwd():
        return layer.forward(x, training=True)

    def step():
        layer.forward(x, training=True)
        layer.backward(dy)

    return fwd, step, layer, x, dy


def torch_step(layer, x, dy, need_dx):
    import torch
    F = torch.nn.functional
    xt = torch.from_numpy(x).requires_grad_(need_dx)
    dyt = torch.from_numpy(dy)
    if isinstance(layer, Conv2D):
        w = torch.from_numpy(layer.params["w"].copy()).requires_grad_(True)
        b = torch.from_numpy(layer.params["b"].copy()).requires_grad_(True)
        pt, pb, pl, pr = layer._pads
        symmetric = pt == pb and pl == pr

        def op(inp):
            if not symmetric:
                inp = F.pad(inp, (pl, pr, pt, pb))
            return F.conv2d(inp, w, b, stride=layer.strides, dilation=layer.dilation,
                            padding=(pt, pl) if symmetric else 0)
        params = [w, b]
    else:
        def op(inp):
            return F.max_pool2d(inp, layer.pool_size, layer.strides, layer.padding)
        params = []

    def fwd():
        with torch.no_grad():
            return op(xt)

    def step():
        for p in params:
            p.grad = None
        xt.grad = None
        op(xt).backward(dyt)

    return fwd, step


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    args = ap.parse_args(argv)
    try:
        from threadpoolctl import threadpool_limits
        threadpool_limits(1)
    except ImportError:
        pass
    try:
        import torch
        torch.set_num_threads(1)
    except ImportError:
        torch = None
    dtype = np.dtype(args.dtype)
    print(f"batch {args.batch}, {dtype}, 1 thread; median ms over {args.repeat} runs")
    head = f"{'case':34s} {'distnn fwd':>10s} {'fwd+bwd':>9s} {'torch fwd':>10s} {'fwd+bwd':>9s}"
    print(head)
    print("-" * len(head))
    for label, factory, shape, need_dx in CASES:
        fwd, step, layer, x, dy = distnn_step(factory, shape, need_dx, args.batch, dtype)
        if torch is None:
            ours = median_ms([fwd, step], args.repeat)
            theirs = "-", "-"
        else:
            tf, ts = torch_step(layer, x, dy, need_dx)
            f0, f1, s0, s1 = median_ms([fwd, tf, step, ts], args.repeat)
            ours, theirs = (f0, s0), (f"{f1:.3f}", f"{s1:.3f}")
        print(f"{label:34s} {ours[0]:10.3f} {ours[1]:9.3f} {theirs[0]:>10s} {theirs[1]:>9s}")


if __name__ == "__main__":
    main()
