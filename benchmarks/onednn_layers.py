"""oneDNN's convolutions ("onednn") against distnn's fixed plan, per 3x3 convolution layer of
zoo models: forward + backward (dx, dw, db) of each distinct layer shape of one training
step, float32, wall-clock medians of alternated repetitions (ms), and each one's share of
the host's sgemm rate (1024^3 float32, same threads). Optionally (``--step``) a model's
whole training step under ``--kernels fixed`` and ``--kernels measure`` (alternated in one
process, the measured choices made first).

    python benchmarks/onednn_layers.py [--models resnet20,vgg11bn] [--batch 64]
                                       [--threads 1] [--repeat 7] [--step resnet20]
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import tempfile
import time

import distnn  # noqa: F401  (before numpy, as the command)
import numpy as np

from distnn import kernels
from distnn.cli.kernel_info import _input, sgemm_rate
from distnn.kernels import conv as K
from distnn.kernels import measure, registry
from distnn.models import get_model

SHAPE = re.compile(r"(\d+)x(\d+)x(\d+)x(\d+)>(\d+) k(\d+)x(\d+) s(\d+)x(\d+) "
                   r"p(\d+),(\d+),(\d+),(\d+) d(\d+)x(\d+) g(\d+)")


def layer_shapes(model_name: str, batch: int) -> list[tuple]:
    """The distinct ungrouped 3x3 convolutions of one training step, in order."""
    measure.set_mode("fixed")
    measure.forget()
    model = get_model(model_name)
    x = _input(model, batch)
    with measure.recording():
        y = model.forward(x, training=True)
        model.backward(np.ones_like(y))
    out = []
    for entry in measure.RECORDS.values():
        m = SHAPE.fullmatch(entry["shape"])
        n, c, h, w, f, kh, kw, sh, sw, pt, pb, pl, pr, dh, dw, groups = map(int, m.groups())
        if entry["family"] == "conv2d" and (kh, kw) == (3, 3) and groups == 1:
            out.append(((n, c, h, w), f, (sh, sw), (pt, pb, pl, pr), (dh, dw)))
    measure.forget()
    return out


def timer(shape, f, stride, pads, dil, method):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype(np.float32)
    w = (rng.standard_normal((f, shape[1], 3, 3)) * 0.1).astype(np.float32)
    b = rng.standard_normal(f).astype(np.float32)
    ws: dict = {}
    dw, db = np.empty_like(w), np.empty_like(b)
    y, _ = K.conv2d_forward(x, w, b, stride, pads, dil)
    dy = rng.standard_normal(y.shape).astype(np.float32)

    def once() -> float:
        t0 = time.perf_counter()
        y, cache = K.conv2d_forward(x, w, b, stride, pads, dil, ws=ws, method=method)
        K.conv2d_backward(dy, cache, w, dw_out=dw, db_out=db, ws=ws)
        return time.perf_counter() - t0
    once()  # compile / build the primitives, warm
    return once


def flops(shape, f, stride, pads, dil) -> float:
    g = K.conv_geometry(shape, (3, 3), stride, pads, dil)
    return K.conv_flops(g, f)


def layers(models, batch, repeat, rate) -> None:
    print("| model | layer (NxCxHxW>F, stride) | fixed method | fixed ms | onednn ms | "
          "fixed % sgemm | onednn % sgemm | fixed/onednn |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for name in models:
        seen = set()
        for shape, f, stride, pads, dil in layer_shapes(name, batch):
            if (shape, f, stride) in seen:
                continue
            seen.add((shape, f, stride))
            q = K.query(K.conv_geometry(shape, (3, 3), stride, pads, dil), f, np.float32)
            fixed = registry.fixed("conv2d", q)
            runs = {m: timer(shape, f, stride, pads, dil, m) for m in (None, "onednn")}
            times = {m: [] for m in runs}
            for _ in range(repeat):  # alternated
                for m, run in runs.items():
                    times[m].append(run())
            med = {m: statistics.median(t) for m, t in times.items()}
            fl = flops(shape, f, stride, pads, dil)
            share = {m: 100 * fl / s / 1e9 / rate for m, s in med.items()}
            print(f"| {name} | {'x'.join(map(str, shape))}>{f} s{stride[0]} | {fixed} | "
                  f"{med[None] * 1e3:.2f} | {med['onednn'] * 1e3:.2f} | {share[None]:.0f}% | "
                  f"{share['onednn']:.0f}% | {med[None] / med['onednn']:.2f} |", flush=True)


def step(name, batch, repeat) -> None:
    """A training step (forward + backward) under fixed and measure, alternated."""
    os.environ["DISTNN_KERNEL_PLANS"] = os.path.join(tempfile.mkdtemp(), "plans.json")
    model = get_model(name)
    x = _input(model, batch)

    def once(mode: str) -> float:
        measure.set_mode(mode)
        t0 = time.perf_counter()
        y = model.forward(x, training=True)
        model.backward(np.ones_like(y))
        return time.perf_counter() - t0
    measure.forget()
    once("measure")  # the measuring step: every layer's choice is made
    chosen = {e["shape"]: e["method"] for e in measure.RECORDS.values()
              if e["family"] == "conv2d"}
    once("fixed"), once("measure")
    times = {"fixed": [], "measure": []}
    for _ in range(repeat):
        for mode in times:
            times[mode].append(once(mode))
    med = {m: statistics.median(t) for m, t in times.items()}
    print(f"\n{name} step (batch {batch}): fixed {med['fixed'] * 1e3:.1f} ms, measure "
          f"{med['measure'] * 1e3:.1f} ms ({med['fixed'] / med['measure']:.3f}x); measure "
          f"chose: {sorted(set(chosen.values()))}; onednn on "
          f"{sum(v == 'onednn' for v in chosen.values())}/{len(chosen)} conv shapes")
    for shape, m in chosen.items():
        print(f"  {shape}: {m}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="resnet20,vgg11bn")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--step", default="", help="a model whose training step to time too")
    ap.add_argument("--no-layers", action="store_true")
    args = ap.parse_args(argv)
    why = registry.method("conv2d", "onednn").reason()
    if why:
        raise SystemExit(f"onednn: {why}")
    kernels.set_num_threads(args.threads)
    from threadpoolctl import threadpool_limits
    with threadpool_limits(limits=args.threads, user_api="blas"):
        rate = sgemm_rate()
        print(f"{args.threads} thread(s), batch {args.batch}, float32, host sgemm "
              f"{rate:.1f} GFLOP/s, OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE')}, "
              f"load {os.getloadavg()[0]:.2f}\n")
        if not args.no_layers:
            layers(args.models.split(","), args.batch, args.repeat, rate)
        if args.step:
            step(args.step, args.batch, args.repeat)
        print(f"\nload at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
