"""Gradient compression on real data (sklearn digits, float64) through the public API, on
every rank; rank 0 pickles what tests/distributed/test_compression.py checks.
Usage: compression_prog.py OUT_DIR"""
from __future__ import annotations

import pickle
import sys

import numpy as np

from distnn import distributed as dist
from distnn.data import load_dataset
from distnn.distributed import PowerSGD, Threshold, TopK
from distnn.distributed.sparse import sparse_allreduce_
from distnn.models import get_model
from distnn.nn.losses import CategoricalCrossEntropy
from distnn.optim import SGD
from distnn.rules import DataParallel
from distnn.training import Trainer

GLOBAL_BATCH = 64  # digits' 1438 training samples: the last batch has 30


def sparse_pairs(rank: int, n: int):
    """Rank r's pairs for the direct exchange test (the test draws them again)."""
    rng = np.random.default_rng([7, rank])
    k = 0 if rank == 1 else int(rng.integers(1, 3000))
    idx = np.sort(rng.choice(n, size=k, replace=False))
    return idx, rng.normal(size=k)


def fit(comm, train, rule, epochs: int = 1):
    model = get_model("simplecnn", input_shape=(1, 8, 8), num_classes=10, dtype=np.float64,
                      rng=0)
    trainer = Trainer(model, SGD(model, lr=0.05, momentum=0.9), comm=comm, rule=rule,
                      progress=False, verbose=False, seed=0)
    trainer.fit(train, epochs=epochs, global_batch_size=GLOBAL_BATCH, shuffle=True)
    comp = trainer.optimizer.compressor
    return {"weights": model.parameters_flat().copy(), "stats": rule.stats(),
            "compressed": comp.compressed if comp is not None else []}


def invariant(comm, train, compression, error_feedback=True, steps=8):
    """Manual steps of DistributedOptimizer; per step: max |sent + residual - accumulated|,
    the result minus the sum over ranks of what they sent, and whether ranks sent
    different indices."""
    model = get_model("simplecnn", input_shape=(1, 8, 8), num_classes=10, dtype=np.float64,
                      rng=0)
    dist.broadcast_parameters(model, comm=comm)
    opt = dist.DistributedOptimizer(SGD(model, lr=0.05), model, comm=comm, op="sum",
                                    compression=compression, error_feedback=error_feedback)
    comp = opt.compressor
    x, y = train.arrays()
    x = x.astype(np.float64)  # preprocessed: scaled to [0, 1]
    loss = CategoricalCrossEntropy()
    sizes = [37] * (steps - 1) + [5]  # uneven shards; the last batch leaves ranks empty
    out = {"invariant": [], "vs_sum": [], "vs_sum_compressed": [], "differ": [],
           "residual_norm": [], "sent_nonzero": [], "compressed": comp.compressed}
    start = 0
    for b in sizes:
        ids = np.array_split(np.arange(start, start + b), comm.size)[comm.rank]
        start += b
        if len(ids):
            _, dlogits = loss(model.forward(x[ids], training=True), y[ids], denom=b)
            model.backward(dlogits)
        else:
            model.gradients_flat().fill(0)
        acc = model.gradients_flat().copy()
        if error_feedback:
            acc += comp.residual
        opt.synchronize()
        out["invariant"].append(float(np.max(np.abs(comp.sent + comp.residual - acc))))
        sents = comm.allgather(comp.sent)
        ref = np.zeros_like(acc)
        for s in sents:  # the order the sparse exchange adds them in
            ref += s
        g = model.gradients_flat()
        out["vs_sum"].append(float(np.max(np.abs(g - ref))))
        mask = np.zeros(g.size, bool)
        for name in comp.compressed:
            lo, hi = next((lo, hi) for n, lo, hi, _ in comp.comp if n == name)
            mask[lo:hi] = True
        out["vs_sum_compressed"].append(float(np.max(np.abs(g[mask] - ref[mask]), initial=0)))
        patterns = [tuple(np.flatnonzero(s[mask])) for s in sents]
        out["differ"].append(len(set(patterns)) > 1)
        out["residual_norm"].append(float(np.linalg.norm(comp.residual)))
        out["sent_nonzero"].append(int(np.count_nonzero(comp.sent[mask])))
        opt.step()
    out["bytes"], out["bytes_dense"] = opt.bytes_reduced, opt.bytes_dense
    return out


def main() -> None:
    out_dir = sys.argv[1]
    comm = dist.init()
    with dist.abort_on_error(comm):
        train = load_dataset("digits", dtype=np.float64).train
        res: dict = {"size": comm.size}
        res["dense"] = fit(comm, train, DataParallel())
        res["topk1"] = fit(comm, train, DataParallel(compression="topk:1.0"))
        res["topk1_sparse"] = fit(comm, train, DataParallel(
            compression=TopK(1.0, exchange="sparse")))
        res["threshold0_sparse"] = fit(comm, train, DataParallel(
            compression=Threshold(1e-300, exchange="sparse")))
        res["powersgd_full"] = fit(comm, train, DataParallel(
            compression=PowerSGD(10 ** 6, min_compression_rate=0)))
        res["powersgd_full_warm"] = fit(comm, train, DataParallel(
            compression=PowerSGD(10 ** 6, min_compression_rate=0),
            compression_warmup_steps=5))
        res["topk_low"] = fit(comm, train, DataParallel(compression="topk:0.05"))
        for name, spec in (("topk", "topk:0.05"), ("threshold", "threshold:0.003"),
                           ("threshold_sparse", Threshold(0.003, exchange="sparse")),
                           ("powersgd", "powersgd:2")):
            res[f"inv_{name}"] = invariant(comm, train, spec)
        res["inv_topk_no_ef"] = invariant(comm, train, "topk:0.05", error_feedback=False)
        n = 3 * (1 << 16) + 123
        idx, vals = sparse_pairs(comm.rank, n)
        summed, _ = sparse_allreduce_(np.zeros(n), idx, vals, comm)
        res["sparse_direct"] = (n, summed)
        if comm.rank == 0:
            with open(f"{out_dir}/results.pkl", "wb") as f:
                pickle.dump(res, f)


if __name__ == "__main__":
    main()
