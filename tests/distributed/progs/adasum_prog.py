"""Adasum and the Reducer's Horovod knobs on N ranks (no torch): rank r writes
OUT_DIR/rank<r>.pkl with

- "vectors": |adasum_(v_r) - reference(v_0..v_{N-1})| for float64 segments (a zero vector
  and empty segments included) and float32;
- "optimizer": the NumPy DistributedOptimizer with op="adasum" (3 SGD steps) against the
  same steps computed in this process: every rank's delta -lr * g_r, combined by the
  reference layer by layer;
- "predivide"/"compression": op="average" with gradient_predivide_factor=4 and with
  Compression.none vs plain op="average";
- "join": the optimizer over a JoinableComm, rank r given 2 + r batches, then join().

python adasum_prog.py OUT_DIR  (under mpiexec -n N)
"""
import pickle
import sys

import numpy as np

import common
from distnn import distributed as dist
from distnn.distributed.adasum import adasum_, reference
from distnn.optim import SGD

comm = dist.init()
rank, size = comm.rank, comm.size
out = {}

counts = [5, 0, 17, 1, 40, 3]
vectors = [np.random.default_rng([11, r]).standard_normal(sum(counts)) for r in range(size)]
vectors[size - 1][:22] = 0.0  # a zero gradient in some segments (coefficient 1)
x = vectors[rank].copy()
adasum_(x, counts, comm)
ref = reference(vectors, counts)
x32 = vectors[rank].astype(np.float32)
adasum_(x32, counts, comm)
out["vectors"] = {"f64": float(np.abs(x - ref).max()), "scale": float(np.abs(ref).max()),
                  "f32": float(np.abs(x32 - ref).max()),
                  "sum": float(np.abs(ref - np.sum(vectors, axis=0)).max())}


def train(op, steps=3, **kw):
    net = common.build_model("mlp", np.float64, seed=0)
    opt = dist.DistributedOptimizer(SGD(net, lr=0.1), net, comm=comm, op=op, **kw)
    xs, ys = common.data(128)
    for step in range(steps):
        lo = 8 * (step * size + rank)
        logits = net.forward(xs[lo:lo + 8], training=True)
        net.backward(common.cross_entropy(logits, ys[lo:lo + 8], 8)[1])
        opt.step()
    return net, opt


net, opt = train("adasum")
ref_net = common.build_model("mlp", np.float64, seed=0)
segments = [hi - lo for _, lo, hi in ref_net.layer_ranges()]
xs, ys = common.data(128)
for step in range(3):
    w = ref_net.parameters_flat().copy()
    deltas = []
    for r in range(size):
        lo = 8 * (step * size + r)
        logits = ref_net.forward(xs[lo:lo + 8], training=True)
        ref_net.backward(common.cross_entropy(logits, ys[lo:lo + 8], 8)[1])
        deltas.append(-0.1 * ref_net.gradients_flat().copy())
    ref_net.parameters_flat()[...] = w + reference(deltas, segments)
out["optimizer"] = {"diff": float(np.abs(net.parameters_flat() - ref_net.parameters_flat()).max()),
                    "moved": float(np.abs(net.parameters_flat() - w).max()),
                    "calls": opt.allreduce_calls, "hooks": len(net.grad_hooks)}

avg = train("average")[0].parameters_flat()
out["predivide"] = float(np.abs(train("average", gradient_predivide_factor=4.0)[0]
                                .parameters_flat() - avg).max())
out["compression"] = float(np.abs(train("average", compression=dist.Compression.none)[0]
                                  .parameters_flat() - avg).max())
fp16_net, fp16_opt = train("average", compression=dist.Compression.fp16)
out["fp16"] = (float(np.abs(fp16_net.parameters_flat() - avg).max()), fp16_opt.bytes_reduced)
# join: rank r has 2 + r batches, then joins; the others' averages count its zeros
jc = dist.JoinableComm(comm)
net = common.build_model("mlp", np.float64, seed=0)
opt = dist.DistributedOptimizer(SGD(net, lr=0.1), net, comm=jc, op="average",
                                bucket_size_mb=0.0)
ref_net = common.build_model("mlp", np.float64, seed=0)
for step in range(1 + size):
    live = [r for r in range(size) if step < 2 + r]
    total = np.zeros_like(ref_net.gradients_flat())
    for r in live:
        lo = 8 * (step * size + r)
        logits = ref_net.forward(xs[lo:lo + 8], training=True)
        ref_net.backward(common.cross_entropy(logits, ys[lo:lo + 8], 8)[1])
        total += ref_net.gradients_flat()
        if r == rank:
            logits = net.forward(xs[lo:lo + 8], training=True)
            net.backward(common.cross_entropy(logits, ys[lo:lo + 8], 8)[1])
            opt.step()
    ref_net.parameters_flat()[...] -= 0.1 * total / size
last = jc.join()
dist.broadcast_parameters(net, root=last, comm=comm)
out["join"] = (last, float(np.abs(net.parameters_flat() - ref_net.parameters_flat()).max()),
               opt.allreduce_calls, len(opt.buckets))
with open(f"{sys.argv[1]}/rank{rank}.pkl", "wb") as f:
    pickle.dump(out, f)
