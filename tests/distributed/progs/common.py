"""Shared by the MPI test programs and the in-process references of tests/distributed."""
from __future__ import annotations

import numpy as np

from distnn import distributed as dist
from distnn.nn.activations import ReLU
from distnn.nn.containers import Sequential
from distnn.nn.core import Dense, Flatten
from distnn.optim import SGD, Adam

INPUT_SHAPE = (2, 3, 3)
CLASSES = 5


def have_batchnorm() -> bool:
    try:
        from distnn.nn.conv import Conv2D  # noqa: F401
        from distnn.nn.normalization import BatchNormalization  # noqa: F401
    except ImportError:
        return False
    return True


def build_model(kind: str, dtype, seed: int) -> Sequential:
    if kind == "mlp":
        layers = [Flatten(), Dense(16), ReLU(), Dense(12), ReLU(), Dense(CLASSES)]
    elif kind == "bn":
        from distnn.nn.conv import Conv2D
        from distnn.nn.normalization import BatchNormalization
        # no bias before BN: its exact gradient is 0, and Adam would amplify the rounding
        # noise there (|g| ~ 1e-7 in float32 gives steps of ~lr) into different weights
        layers = [Conv2D(4, 3, padding="same", use_bias=False), BatchNormalization(), ReLU(),
                  Flatten(), Dense(8, use_bias=False), BatchNormalization(), ReLU(),
                  Dense(CLASSES)]
    else:
        raise ValueError(kind)
    return Sequential(layers, input_shape=INPUT_SHAPE, dtype=dtype, rng=seed)


def data(n: int = 64):
    rng = np.random.default_rng(123)
    x = rng.normal(size=(n,) + INPUT_SHAPE)
    y = rng.integers(0, CLASSES, size=n)
    return x, y


def cross_entropy(logits: np.ndarray, labels: np.ndarray, denom: float):
    """(sum of per-sample losses / denom, dlogits)."""
    try:
        from distnn.nn.losses import CategoricalCrossEntropy
    except ImportError:
        z = logits - logits.max(axis=1, keepdims=True)
        p = np.exp(z)
        p /= p.sum(axis=1, keepdims=True)
        n = len(labels)
        loss = -np.log(p[np.arange(n), labels]).sum() / denom
        p[np.arange(n), labels] -= 1
        return loss, p / denom
    return CategoricalCrossEntropy()(logits, labels, denom=denom)


def scenarios(size: int) -> dict[str, dict]:
    """Training runs compared between N ranks and 1 process; batch sizes are global."""
    uneven = [7, 7, 7, 7, 2]  # not divisible by 2 or 3; the last leaves rank 2 of 3 empty
    even = [3 * size] * 5
    f64, f32 = np.float64, np.float32
    out = {
        "sgd_sum_f64": dict(opt="sgd", op="sum", batches=uneven, dtype=f64),
        "adam_sum_f64": dict(opt="adam", op="sum", batches=uneven, dtype=f64),
        "sgd_avg_f64": dict(opt="sgd", op="average", batches=even, dtype=f64),
        "adam_avg_f32": dict(opt="adam", op="average", batches=even, dtype=f32),
        "sgd_sum_f32": dict(opt="sgd", op="sum", batches=uneven, dtype=f32),
        "sgd_sum_f64_blocking": dict(opt="sgd", op="sum", batches=uneven, dtype=f64,
                                     non_blocking=False),
        "sgd_sum_f64_tiny": dict(opt="sgd", op="sum", batches=uneven, dtype=f64,
                                 bucket_size_mb=0.0),
        "sgd_sum_f32_fp16": dict(opt="sgd", op="sum", batches=uneven, dtype=f32,
                                 compression="fp16"),
    }
    if have_batchnorm():
        out["bn_sgd_sum_f64"] = dict(opt="sgd", op="sum", batches=[7, 7, 9, 7, 8], dtype=f64,
                                     model="bn", sync_bn=True)
        out["bn_adam_avg_f32"] = dict(opt="adam", op="average", batches=even, dtype=f32,
                                      model="bn", sync_bn=True)
    return out


def run_training(comm, *, opt: str, op: str, batches, dtype, model: str = "mlp",
                 non_blocking: bool = True, bucket_size_mb: float = 4.0,
                 compression=None, sync_bn: bool = False) -> dict:
    """Train 5 steps on this rank's shards of fixed global batches; return what to compare."""
    net = build_model(model, dtype, seed=100 + comm.rank)  # different on purpose
    dist.broadcast_parameters(net, comm=comm)
    if sync_bn:
        dist.sync_batchnorm(net, comm=comm)
    base = (SGD(net, lr=0.1, momentum=0.9) if opt == "sgd" else Adam(net, lr=0.01))
    dopt = dist.DistributedOptimizer(base, net, comm=comm, op=op, bucket_size_mb=bucket_size_mb,
                                     non_blocking=non_blocking, compression=compression)
    trace: list[int] = []  # buckets in flight after each layer's backward
    net.grad_hooks.append(lambda layer: trace.append(dopt._next))
    x, y = data()
    start, started = 0, []
    for b in batches:
        idx = np.array_split(np.arange(start, start + b), comm.size)[comm.rank]
        start += b
        if len(idx):
            logits = net.forward(x[idx], training=True)
            denom = b if op == "sum" else len(idx)
            _, dlogits = cross_entropy(logits, y[idx], denom)
            net.backward(dlogits)
            started.append(dopt._next)
        else:  # what the trainer does with an empty shard: zero gradients, still step
            net.gradients_flat().fill(0)
        dopt.step()
    return {"weights": net.parameters_flat().copy(),
            "buffers": {f"{layer.name}/{k}": np.array(v) for layer in net.walk()
                        for k, v in layer.buffers.items()},
            "buckets": [(int(s), int(e), list(n)) for s, e, n in dopt.buckets],
            "calls": dopt.allreduce_calls, "trace": trace, "steps": dopt.steps, "started": started,
            "bytes": dopt.bytes_reduced, "wait": dopt.comm_wait_time,
            "layers": [layer.name for layer, _, _ in net.layer_ranges()]}
