"""Which registered convolution method the fixed plan picks for every convolution of the zoo
models, on each CPU kind (passed to the planner as a CPU object, so both kinds are answered
on any host), and which registered methods no layer picks: the evidence for removing a
method (issue 57, item 5).

    python benchmarks/kernel_choices.py [--batch 64] [--threads 1,2] [--models a,b]

Prints one table a CPU kind: method -> the layers (model: C->F HxW kernel stride) that
pick it, then the methods picked by none. Nothing is run or timed.
"""
from __future__ import annotations

import argparse
from collections import defaultdict

import numpy as np

from distnn.kernels import planner, registry
from distnn.kernels.im2col import conv_geometry
from distnn.models import MODELS, get_model
from distnn.nn import Conv2D

ZOO = ("lenet", "simplecnn", "resnet20", "resnet32", "vgg11bn", "vgg16", "alexnet_cifar",
       "resnet9", "mobilenet_v2", "mobilenet_v2_x0_5", "vit_tiny")


def convolutions(model):
    """Every Conv2D of a built model, through containers."""
    stack = list(model.layers)
    while stack:
        layer = stack.pop(0)
        if isinstance(layer, Conv2D):
            yield layer
        sub = getattr(layer, "sublayers", None)
        if callable(sub):
            stack[:0] = list(sub())


def choices(models, batch: int, threads: list[int]):
    table = {kind: defaultdict(list) for kind in ("avx512", "avx2")}
    for name in models:
        model = get_model(name, dtype=np.float32)
        for layer in convolutions(model):
            c, h, w = layer.input_shape
            g = conv_geometry((batch, c, h, w), layer.kernel_size, layer.strides,
                              layer._pads, layer.dilation)
            groups = getattr(layer, "groups", 1)
            family = "conv2d" if groups == 1 else "conv2d_grouped"
            where = (f"{name}: {c}->{layer.filters} {h}x{w} k{g.kh} s{g.sh}"
                     + (f" g{groups}" if groups > 1 else ""))
            for kind in table:
                for t in threads:
                    q = registry.Query(g, layer.filters, np.float32, planner.CPU(kind), t,
                                       groups=groups)
                    picked = registry.fixed(family, q)
                    table[kind][(family, picked)].append(f"{where} t{t}")
                    if family == "conv2d" and picked in ("winograd2", "winograd4"):
                        bq = registry.BackwardQuery(g, layer.filters, np.float32,
                                                    planner.CPU(kind), t,
                                                    cache=_winograd_cache(g, picked, kind,
                                                                          layer.filters))
                        table[kind][("conv2d_backward", registry.fixed("conv2d_backward",
                                                                       bq))].append(where)
                    elif family == "conv2d":  # the forward's own backward
                        back = "reference" if picked in ("flat", "compact") else picked
                        table[kind][("conv2d_backward", back)].append(where)
    return table


def _winograd_cache(g, name, kind, f):
    from distnn.kernels.geometry import ConvCache
    back = planner.vector_backward(g, f, np.float32, cpu=planner.CPU(kind))
    return ConvCache(g, "winograd", None, tile=int(name[-1]), vector_backward=back)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--models", default=",".join(m for m in ZOO if m in MODELS))
    args = ap.parse_args()
    threads = [int(t) for t in args.threads.split(",")]
    table = choices(args.models.split(","), args.batch, threads)
    picked_anywhere = set()
    for kind, rows in table.items():
        print(f"\n## {kind} (fixed plan, float32, batch {args.batch}, threads {threads})")
        for (family, name), layers in sorted(rows.items()):
            picked_anywhere.add((family, name))
            uniq = sorted(set(layers))
            print(f"{family:<16} {name:<10} {len(uniq):>3} layer(s): {'; '.join(uniq[:6])}"
                  + (" ..." if len(uniq) > 6 else ""))
    print("\n## registered methods no zoo layer picks on either kind (fixed plan, float32)")
    for family, methods in registry.METHODS.items():
        for name, m in methods.items():
            if (family, name) not in picked_anywhere:
                print(f"{family:<16} {name:<10} {'compiled' if m.compiled else 'NumPy'}")


if __name__ == "__main__":
    main()
