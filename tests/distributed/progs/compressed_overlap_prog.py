"""The compressed exchanges overlapped with backward (non_blocking) against the blocking
path (non_blocking=False), step by step on real data (sklearn digits), through the public
DistributedOptimizer; and when each exchange is posted relative to backward. Rank 0
pickles what tests/distributed/test_compressed_overlap.py checks.
Usage: compressed_overlap_prog.py OUT_DIR"""
from __future__ import annotations

import pickle
import sys

import numpy as np

from distnn import distributed as dist
from distnn.data import load_dataset
from distnn.distributed import JoinableComm, PowerSGD, Threshold, TopK
from distnn.models import get_model
from distnn.nn.losses import CategoricalCrossEntropy
from distnn.optim import SGD

# name: (compression, options); every case runs overlapped and blocking, then compares
CASES = {
    "topk": ("topk:0.05", {}),
    "topk_small_tensors": (TopK(0.05, min_size=16), {"bucket_size_mb": 0.02}),
    "topk_sparse": (TopK(0.05, exchange="sparse"), {"op": "sum"}),
    "topk_crossover_dense": (TopK(0.9, min_size=16), {}),
    "topk_no_ef_warmup": ("topk:0.05", {"error_feedback": False,
                                        "compression_warmup_steps": 2}),
    "topk_float32": ("topk:0.05", {"dtype": np.float32}),
    "threshold": ("threshold:0.003", {}),
    "threshold_sparse": (Threshold(0.003, exchange="sparse", min_size=16), {"op": "sum"}),
    "threshold_dense": (Threshold(0.003, exchange="dense"), {}),
    "threshold_crossover_dense": (Threshold(1e-9, min_size=16), {"bucket_size_mb": 0.02}),
    "powersgd": ("powersgd:2", {}),
    "powersgd_all": (PowerSGD(2, min_compression_rate=0), {"bucket_size_mb": 0.02}),
    "powersgd_cold_sum": (PowerSGD(1, warm_start=False, min_compression_rate=0),
                          {"op": "sum"}),
    "powersgd_warmup_float32": ("powersgd:2", {"compression_warmup_steps": 2,
                                               "dtype": np.float32}),
}
BATCHES = [37, 37, 64, 37, 1, 37]  # a batch of 1 leaves ranks without data (no backward)


def model_for(dtype):
    return get_model("simplecnn", input_shape=(1, 8, 8), num_classes=10, dtype=dtype, rng=0)


class Recording:
    """The communicator, with every gradient collective logged in ``log`` in call order."""

    def __init__(self, comm, log: list):
        self._comm, self.log = comm, log

    def __getattr__(self, name):
        return getattr(self._comm, name)

    def _call(self, kind: str, name: str, *args, **kwargs):
        self.log.append((kind, name))
        return getattr(self._comm, name)(*args, **kwargs)

    def iallreduce_(self, *args, **kwargs):
        return self._call("post", "iallreduce_", *args, **kwargs)

    def iallgatherv(self, *args, **kwargs):
        return self._call("post", "iallgatherv", *args, **kwargs)

    def allreduce_(self, *args, **kwargs):
        return self._call("blocking", "allreduce_", *args, **kwargs)

    def allgatherv(self, *args, **kwargs):
        return self._call("blocking", "allgatherv", *args, **kwargs)

    def allgather(self, *args, **kwargs):
        return self._call("blocking", "allgather", *args, **kwargs)


def train(comm, x, y, compression, options, non_blocking: bool, log: list | None = None):
    """Manual steps; per step the combined gradients, weights and compression state."""
    options = dict(options)
    dtype = options.pop("dtype", np.float64)
    model = model_for(dtype)
    dist.broadcast_parameters(model, comm=comm)
    opt = dist.DistributedOptimizer(SGD(model, lr=0.05, momentum=0.9), model, comm=comm,
                                    compression=compression, non_blocking=non_blocking,
                                    bucket_size_mb=options.pop("bucket_size_mb", 0), **options)
    if log is not None:  # after the optimizer's hook: a layer's gradients are ready
        model.grad_hooks.append(lambda layer: log.append(("ready", layer.name)))
    comp = opt.compressor
    loss = CategoricalCrossEntropy()
    steps, start = [], 0
    for b in BATCHES:
        ids = np.array_split(np.arange(start, start + b), comm.size)[comm.rank]
        start += b
        if log is not None:
            log.append(("step", len(steps)))
        if len(ids):
            _, dlogits = loss(model.forward(x[ids].astype(dtype), training=True), y[ids],
                              denom=b)
            model.backward(dlogits)
        else:
            model.gradients_flat().fill(0)
        opt.synchronize()
        state = {"grads": model.gradients_flat().copy(), "residual": comp.residual.copy(),
                 "sent": comp.sent.copy(), "q": [q.copy() for q in getattr(comp, "qs", [])]}
        opt.step()
        state["weights"] = model.parameters_flat().copy()
        steps.append(state)
    reducer = opt._reducer
    return {"steps": steps, "overlap": reducer.overlap is not None,
            "buckets": len(reducer.buckets), "compressed": list(comp.compressed),
            "early_starts": reducer.early_starts, "calls": opt.allreduce_calls,
            "bytes": opt.bytes_reduced}


def join_run(comm, x, y, compression, non_blocking: bool) -> dict:
    """Over a JoinableComm rank r trains 2 + r steps, then joins (hvd.join's uneven data):
    the weights after each step, the error the last ranks got (if any), join's result."""
    jc = JoinableComm(comm)
    model = model_for(np.float64)
    dist.broadcast_parameters(model, comm=comm)
    opt = dist.DistributedOptimizer(SGD(model, lr=0.05), model, comm=jc, bucket_size_mb=0,
                                    compression=compression, non_blocking=non_blocking)
    loss = CategoricalCrossEntropy()
    weights, error = [], None
    for step in range(2 + comm.rank):
        ids = np.arange(37 * step, 37 * step + 37)[comm.rank::comm.size]
        try:
            _, dlogits = loss(model.forward(x[ids], training=True), y[ids], denom=37)
            model.backward(dlogits)
            opt.step()
        except RuntimeError as e:  # a rank has joined: the all-gathers are refused
            error = str(e)
            break
        weights.append(model.parameters_flat().copy())
    return {"weights": weights, "error": error, "last": jc.join(),
            "overlap": opt._reducer.overlap is not None}


def compare(a, b) -> dict:
    """Per step and field, whether a and b are equal bit for bit (and the largest gap)."""
    out = {"equal": [], "gap": []}
    for sa, sb in zip(a["steps"], b["steps"]):
        for key in ("grads", "residual", "sent", "weights"):
            out["equal"].append(bool(np.array_equal(sa[key], sb[key])))
            out["gap"].append(float(np.max(np.abs(sa[key] - sb[key]))))
        out["equal"] += [bool(np.array_equal(p, q)) for p, q in zip(sa["q"], sb["q"])]
    return out


def main() -> None:
    out_dir = sys.argv[1]
    comm = dist.init()
    with dist.abort_on_error(comm):
        x, y = load_dataset("digits", dtype=np.float64).train.arrays()
        res: dict = {"size": comm.size, "cases": {}}
        for name, (compression, options) in CASES.items():
            over = train(comm, x, y, compression, options, True)
            block = train(comm, x, y, compression, options, False)
            res["cases"][name] = {"compare": compare(over, block),
                                  "overlap": {k: v for k, v in over.items() if k != "steps"},
                                  "blocking": {k: v for k, v in block.items() if k != "steps"},
                                  "trained": float(np.max(np.abs(
                                      over["steps"][-1]["weights"]
                                      - model_for(np.float64).parameters_flat())))}
        for name, compression in (("topk", "topk:0.05"), ("threshold", "threshold:0.003"),
                                  ("powersgd", "powersgd:2")):
            for non_blocking in (True, False):
                log: list = []
                train(Recording(comm, log), x, y, compression, {}, non_blocking, log)
                res[f"log_{name}_{non_blocking}"] = log
        for spec in ("topk:0.05", "powersgd:2"):
            joinable = train(JoinableComm(comm), x, y, spec, {}, True)
            plain = train(comm, x, y, spec, {}, False)
            res[f"joinable_{spec}"] = {"compare": compare(joinable, plain),
                                       "overlap": joinable["overlap"]}
            res[f"join_{spec}"] = [join_run(comm, x, y, spec, nb) for nb in (True, False)]
        for r in range(comm.size):  # every rank's own results (residuals differ by rank)
            mine = res if r == comm.rank else None
            got = comm.bcast_obj(mine, root=r)
            if comm.rank == 0:
                with open(f"{out_dir}/rank{r}.pkl", "wb") as f:
                    pickle.dump(got, f)


if __name__ == "__main__":
    main()
