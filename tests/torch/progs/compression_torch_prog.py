"""distnn.torch's DistributedOptimizer with gradient compression on sklearn digits (float64,
global batches of 37 split unevenly, the last one of 5): rank 0 pickles each run's final
weights and counters. Usage: compression_torch_prog.py OUT_DIR"""
from __future__ import annotations

import pickle
import sys

import numpy as np
import torch
from progkit import digits_net, digits_steps

import distnn.torch as hvd


def run(compression, steps: int = 8):
    model = digits_net()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters(), op=hvd.Sum,
                                   compression=compression)
    for _ in digits_steps(model, opt, [37] * (steps - 1) + [5]):
        pass
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
