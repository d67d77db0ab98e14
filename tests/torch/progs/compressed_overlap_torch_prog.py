"""distnn.torch's DistributedOptimizer with compression, overlapped with backward
(non_blocking, a bucket per parameter) and blocking, on sklearn digits (float64, uneven
shards, a last batch that leaves ranks without data): every rank pickles, per step, the
weights, residuals and PowerSGD's Q of both. Usage: compressed_overlap_torch_prog.py OUT"""
from __future__ import annotations

import pickle
import sys

import numpy as np
import torch

import distnn.torch as hvd
from distnn.data import load_dataset

SPECS = {"topk": "topk:0.05", "threshold": hvd.Compression.threshold(0.003, min_size=16),
         "powersgd": hvd.Compression.powersgd(2, min_compression_rate=0)}


def run(compression, non_blocking: bool, steps: int = 6):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 8, 3), torch.nn.ReLU(),
                                torch.nn.Flatten(), torch.nn.Linear(8 * 36, 32),
                                torch.nn.ReLU(), torch.nn.Linear(32, 10)).double()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters(),
                                   compression=compression, bucket_size_mb=0,
                                   non_blocking=non_blocking)
    x, y = load_dataset("digits", dtype=np.float64).train.arrays()
    x = torch.from_numpy(x.astype(np.float64))
    y = torch.from_numpy(y)
    start, out = 0, []
    for b in [37] * (steps - 1) + [2]:
        ids = np.array_split(np.arange(start, start + b), hvd.size())[hvd.rank()]
        start += b
        opt.zero_grad()
        if len(ids):
            loss = torch.nn.functional.cross_entropy(model(x[ids]), y[ids], reduction="sum") / b
            loss.backward()
        opt.step()
        comp = opt.compressor
        out.append({"weights": torch.cat([p.detach().reshape(-1) for p in model.parameters()])
                    .numpy().copy(), "residual": comp.residual.copy(),
                    "q": [q.copy() for q in getattr(comp, "qs", [])]})
    reducer = opt._reducer
    return {"steps": out, "overlap": reducer.overlap is not None,
            "buckets": len(reducer.buckets), "early_starts": reducer.early_starts}


def main() -> None:
    hvd.init()
    res = {name: (run(spec, True), run(spec, False)) for name, spec in SPECS.items()}
    with open(f"{sys.argv[1]}/rank{hvd.rank()}.pkl", "wb") as f:
        pickle.dump(res, f)


if __name__ == "__main__":
    main()
