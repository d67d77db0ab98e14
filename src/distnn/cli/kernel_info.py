"""``distnn info --kernels [PLAN] --model M``: each convolution's kernel method and its
measured rate against the host's sgemm rate.

One training step (forward and backward) of the zoo model on random data, the planner in
PLAN's mode (fixed, measure or plan:FILE) with every chosen method timed
(``kernels.measure.recording``); the sgemm rate is NumPy's BLAS on a 1024^3 float32 product
at the same threads (best of 5). A last line names the registered methods that cannot run
here and why (``registry.unavailable_line``: oneDNN's without its library). A method
shown as ``vector+onednn`` runs its backward on oneDNN's primitives
(``planner.onednn_backward``); its time is forward and backward together.
"""
from __future__ import annotations

import time

import numpy as np


def sgemm_rate(size: int = 1024, repeats: int = 5) -> float:
    """The host's float32 GEMM rate in GFLOP/s (BLAS, the threads in effect)."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((size, size), dtype=np.float32)
    b = rng.standard_normal((size, size), dtype=np.float32)
    out = np.empty_like(a)
    np.matmul(a, b, out=out)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.matmul(a, b, out=out)
        best = min(best, time.perf_counter() - t0)
    return 2.0 * size ** 3 / best / 1e9


def kernel_report(model_name: str, plan: str, batch: int = 64) -> str:
    """The table of ``distnn info --kernels``: one row a convolution shape of the model."""
    from .. import kernels
    from ..kernels import measure
    from ..models import get_model
    measure.set_mode(plan)
    measure.forget()  # this model's choices only (the cache file stays)
    model = get_model(model_name)
    x = _input(model, batch)
    with measure.recording() as records:
        y = model.forward(x, training=True)
        model.backward(np.ones_like(y))
        layers = list(records)
    rate = sgemm_rate()
    lines = [f"kernels of {model_name} (batch {batch}, {kernels.get_num_threads()} thread(s), "
             f"backend {kernels.backend()}, --kernels {plan}): host sgemm {rate:.1f} GFLOP/s",
             f"{'family':<15} {'shape (NxCxHxW>F kernel stride pads dilation groups)':<58} "
             f"{'method':<16} {'fixed':<10} {'ms':>8} {'GFLOP/s':>8} {'% sgemm':>8}  others (ms)"]
    for k in layers:
        e = measure.RECORDS[k]
        s = e["seconds"].get(e["method"])
        ms = f"{s * 1e3:.2f}" if s else "-"
        gf = e["flops"] / s / 1e9 if s else 0.0
        others = ", ".join(f"{n} {t * 1e3:.2f}" for n, t in sorted(e["seconds"].items(),
                                                                    key=lambda i: i[1])
                           if n != e["method"])
        name = e["method"] + (f"+{e['backward']}" if e.get("backward") else "")
        lines.append(f"{e['family']:<15} {e['shape']:<58} {name:<16} {e['fixed']:<10} "
                     f"{ms:>8} {gf:8.1f} {100 * gf / rate:7.0f}%  {others}")
    if not layers:
        lines.append("(no convolution in this model)")
    from ..kernels import registry
    missing = registry.unavailable_line(kernels.backend() == "numba")
    if missing:
        lines.append(missing)
    return "\n".join(lines)


def _input(model, batch: int) -> np.ndarray:
    from ..models import MODELS, _DEFAULT_INPUT
    kind = MODELS[model.name][1] if model.name in MODELS else "cifar"
    sample = tuple(_DEFAULT_INPUT[kind])
    rng = np.random.default_rng(0)
    return rng.standard_normal((batch,) + sample).astype(model.dtype)
