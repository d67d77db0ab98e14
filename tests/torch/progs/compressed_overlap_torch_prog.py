"""distnn.torch's DistributedOptimizer with compression, overlapped with backward
(non_blocking, a bucket per parameter) and blocking, on sklearn digits (float64, uneven
shards, a last batch that leaves ranks without data): every rank pickles, per step, the
weights, residuals and PowerSGD's Q of both. Usage: compressed_overlap_torch_prog.py OUT"""
from __future__ import annotations

import pickle
import sys

import torch
from progkit import digits_net, digits_steps

import distnn.torch as hvd

SPECS = {"topk": "topk:0.05", "threshold": hvd.Compression.threshold(0.003, min_size=16),
         "powersgd": hvd.Compression.powersgd(2, min_compression_rate=0)}


def run(compression, non_blocking: bool, steps: int = 6):
    model = digits_net()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters(),
                                   compression=compression, bucket_size_mb=0,
                                   non_blocking=non_blocking)
    out = []
    for _ in digits_steps(model, opt, [37] * (steps - 1) + [2]):
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
