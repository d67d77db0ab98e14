"""distnn.torch's DistributedOptimizer with gradient compression on sklearn digits (float64,
global batches of 37 split unevenly, the last one of 5): rank 0 pickles each run's final
weights and counters. Usage: compression_torch_prog.py OUT_DIR"""
from __future__ import annotations

import pickle
import sys

import numpy as np
import torch

import distnn.torch as hvd
from distnn.data import load_dataset


def run(compression, steps: int = 8):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 8, 3), torch.nn.ReLU(),
                                torch.nn.Flatten(), torch.nn.Linear(8 * 36, 32),
                                torch.nn.ReLU(), torch.nn.Linear(32, 10)).double()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters(), op=hvd.Sum,
                                   compression=compression)
    x, y = load_dataset("digits", dtype=np.float64).train.arrays()
    x = torch.from_numpy(x.astype(np.float64))  # preprocessed: scaled to [0, 1]
    y = torch.from_numpy(y)
    start = 0
    for b in [37] * (steps - 1) + [5]:
        ids = np.array_split(np.arange(start, start + b), hvd.size())[hvd.rank()]
        start += b
        opt.zero_grad()
        if len(ids):
            loss = torch.nn.functional.cross_entropy(model(x[ids]), y[ids], reduction="sum") / b
            loss.backward()
        opt.step()
    comp = opt.compressor
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy().copy()
    return {"weights": flat, "bytes": opt.bytes_reduced, "bytes_dense": opt.bytes_dense,
            "compressed": comp.compressed if comp is not None else [],
            "residual": float(np.linalg.norm(comp.residual)) if comp is not None else 0.0}


def main() -> None:
    hvd.init()
    out = {"dense": run(hvd.Compression.none), "topk1": run("topk:1.0"),
           "powersgd_full": run(hvd.Compression.powersgd(1000, min_compression_rate=0)),
           "topk_low": run(hvd.Compression.topk(0.05)), "powersgd2": run("powersgd:2")}
    if hvd.rank() == 0:
        with open(f"{sys.argv[1]}/out.pkl", "wb") as f:
            pickle.dump(out, f)


if __name__ == "__main__":
    main()
