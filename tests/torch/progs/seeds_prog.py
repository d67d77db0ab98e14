"""SINGA's DistOpt and Needle's ddp calls, written as those systems' scripts write them, under
mpiexec. Each rank also trains a reference copy on the WHOLE global batch in one process
and records the largest parameter difference.

python seeds_prog.py OUT_DIR  (under mpiexec -n N); writes OUT_DIR/rank<r>.pkl
"""
import copy
import pickle
import sys

import numpy as np
import torch
import torch.nn.functional as F
from progkit import small_net

from distnn import distributed as dist
from distnn.torch import ddp, opt

torch.set_num_threads(1)
torch.set_default_dtype(torch.float64)
out = {}


def max_diff(a, b):
    return max(float((p - q).detach().abs().max()) for p, q in zip(a.parameters(), b.parameters()))


gen = np.random.default_rng(5)
X = torch.from_numpy(gen.standard_normal((62, 1, 6, 6)))
Y = torch.from_numpy(gen.integers(0, 4, 62))

# -- Needle: rank, device = ddp.init(); partition_dataset(dataset, 128, device=, dtype=) ----
rank, device = ddp.init()
sgd = opt.DistOpt(opt.SGD(lr=0.05, momentum=0.9, weight_decay=1e-3))
size = sgd.world_size
out["ids"] = (rank, str(device), sgd.world_size, sgd.global_rank, sgd.rank_in_global,
              sgd.local_rank, sgd.rank_in_local)

# -- SINGA: DistOpt(SGD(...)); backward_and_update(loss) on this rank's part of each
# global batch == SGD on the whole global batch in one process --------------------------
B = 4  # per rank, as SINGA's examples (batch_size per process)
model, ref = small_net(0), small_net(0)
ref_sgd = opt.SGD(lr=0.05, momentum=0.9, weight_decay=1e-3)
diffs = []
for step in range(5):
    lo = step * B * size
    xg, yg = X[lo:lo + B * size], Y[lo:lo + B * size]
    x, y = xg[rank * B:(rank + 1) * B], yg[rank * B:(rank + 1) * B]
    sgd.backward_and_update(F.cross_entropy(model(x), y))
    ref_sgd(F.cross_entropy(ref(xg), yg))
    diffs.append(max_diff(model, ref))
out["singa_diffs"] = diffs
out["singa_buckets"] = len(sgd.optimizer.buckets)

# backward_and_update_half: fp16 on the wire, optional clipping (SINGA's clip_Value)
model_h, ref_h = small_net(1), small_net(1)
sgd_h = opt.DistOpt(opt.SGD(lr=0.05, momentum=0.9))
ref_h_sgd = opt.SGD(lr=0.05, momentum=0.9)
half = []
for step, clip in enumerate((False, False, True)):
    lo = step * B * size
    xg, yg = X[lo:lo + B * size], Y[lo:lo + B * size]
    x, y = xg[rank * B:(rank + 1) * B], yg[rank * B:(rank + 1) * B]
    sgd_h.backward_and_update_half(F.cross_entropy(model_h(x), y), clipping=clip,
                                   clip_Value=0.02)
    if clip:
        # the reference clips each rank's gradient before averaging, as SINGA does
        grads = []
        for r in range(size):
            ref_r = copy.deepcopy(ref_h)
            xr, yr = xg[r * B:(r + 1) * B], yg[r * B:(r + 1) * B]
            F.cross_entropy(ref_r(xr), yr).backward()
            grads.append([p.grad.clamp(-0.02, 0.02) for p in ref_r.parameters()])
        ref_h_sgd.bind(F.cross_entropy(ref_h(xg), yg))
        with torch.no_grad():
            for i, p in enumerate(ref_h.parameters()):
                p.grad = sum(g[i] for g in grads) / size
        ref_h_sgd.torch_optimizer.step()
    else:
        ref_h_sgd(F.cross_entropy(ref_h(xg), yg))
    half.append(max_diff(model_h, ref_h))
out["half_diffs"] = half
out["half_wire"] = str(sgd_h.optimizer.compression.wire_dtype)

# all_reduce(t) / wait(): sums in place, several outstanding
t = torch.full((3,), float(rank + 1))
a = np.array([2.0 * rank], dtype=np.float64)
sgd.all_reduce(t)
sgd.all_reduce(a)
sgd.wait()
out["all_reduce"] = (t.tolist(), a.tolist())

# -- Needle: loader, bsz; broadcast_parameters(model); DistributedOptimizer(opt);
# opt.reset_grad() == Adam on the whole global batch in one process --------------------
dataset = torch.utils.data.TensorDataset(X, Y)
loader, bsz = ddp.partition_dataset(dataset, 12, device=device, dtype="float64")
out["needle_bsz"] = (bsz, len(loader))
model_n = small_net(2)
with torch.no_grad():  # different on every rank until broadcast
    for p in model_n.parameters():
        p.add_(0.1 * rank)
ddp.broadcast_parameters(model_n)
ref_n = small_net(2)
adam = ddp.DistributedOptimizer(torch.optim.Adam(model_n.parameters(), lr=0.01,
                                                 weight_decay=0.001))
ref_adam = torch.optim.Adam(ref_n.parameters(), lr=0.01, weight_decay=0.001)
loss_fn = torch.nn.CrossEntropyLoss()
needle = []
seen = []
for _ in range(2):
    for batch in loader:
        adam.reset_grad()
        Xb, yb = batch
        loss = loss_fn(model_n(Xb), yb)
        loss.backward()
        adam.step()
        # the global batch: every rank's share, in rank order
        parts = dist.get_comm().allgather_obj((Xb.numpy(), yb.numpy()))
        xg = torch.from_numpy(np.concatenate([p[0] for p in parts]))
        yg = torch.from_numpy(np.concatenate([p[1] for p in parts]))
        seen.append(len(yb))
        ref_adam.zero_grad()
        loss_fn(ref_n(xg), yg).backward()
        ref_adam.step()
        needle.append(max_diff(model_n, ref_n))
out["needle_diffs"] = needle
out["needle_local_sizes"] = seen
out["needle_dtype"] = str(Xb.dtype)

# -- SINGA: backward_and_sparse_update(loss, spars, topK, corr) ---------------------------
def wide(seed):  # a 36x40 weight: large enough (>= 1024 elements) to be sparsified
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(36, 40), torch.nn.Tanh(),
                               torch.nn.Linear(40, 4))


def global_batch(step):
    lo = (step * B * size) % (60 - B * size)
    xg, yg = X[lo:lo + B * size], Y[lo:lo + B * size]
    return xg, yg, xg[rank * B:(rank + 1) * B], yg[rank * B:(rank + 1) * B]


model_s, ref_s = wide(3), wide(3)
sgd_s = opt.DistOpt(opt.SGD(lr=0.05, momentum=0.9))
ref_s_sgd = opt.SGD(lr=0.05, momentum=0.9)
full = []
for step in range(4):  # spars=1.0 with topK: everything sent, == the dense update
    xg, yg, x, y = global_batch(step)
    sgd_s.backward_and_sparse_update(F.cross_entropy(model_s(x), y), spars=1.0, topK=True)
    ref_s_sgd(F.cross_entropy(ref_s(xg), yg))
    full.append(max_diff(model_s, ref_s))
out["sparse_full_diffs"] = full
sparse = {}
for corr in (True, False):
    model_c = wide(4)
    sgd_c = opt.DistOpt(opt.SGD(lr=0.05))
    ids, spread = set(), []
    for step in range(3):
        xg, yg, x, y = global_batch(step)
        sgd_c.backward_and_sparse_update(F.cross_entropy(model_c(x), y), spars=0.05,
                                         topK=True, corr=corr)
        ids.add(id(sgd_c.optimizer.compressor))
        mine = torch.cat([p.detach().reshape(-1) for p in model_c.parameters()]).numpy()
        every = dist.get_comm().allgather_obj(mine)
        spread.append(max(float(np.abs(e - mine).max()) for e in every))
    comp = sgd_c.optimizer.compressor
    sparse[corr] = dict(spread=spread, compressors=len(ids), compressed=list(comp.compressed),
                        residual=float(np.abs(comp.residual).max()),
                        ratio=sgd_c.optimizer.bytes_reduced / sgd_c.optimizer.bytes_dense)
out["sparse"] = sparse

# -- SINGA: backward_and_partial_update(loss, threshold) ---------------------------------
model_p, ref_p = small_net(5), small_net(5)
sgd_p = opt.DistOpt(opt.SGD(lr=0.05))  # no momentum: averaging all every step == dense
ref_p_sgd = opt.SGD(lr=0.05)
whole = []
for step in range(4):
    xg, yg, x, y = global_batch(step)
    sgd_p.backward_and_partial_update(F.cross_entropy(model_p(x), y))  # one chunk
    ref_p_sgd(F.cross_entropy(ref_p(xg), yg))
    whole.append(max_diff(model_p, ref_p))
out["partial_whole_diffs"] = whole
# chunks of <= 30 elements: [conv w 27 + b 3], [fc1 w 288], [fc1 b 6 + fc2 w 24], [fc2 b 4];
# every rank steps locally (momentum), one chunk averaged per call; the reference runs
# every rank's replica in this process
model_q = small_net(6)
sgd_q = opt.DistOpt(opt.SGD(lr=0.05, momentum=0.9))
replicas = [small_net(6) for _ in range(size)]
ref_opts = [torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in replicas]
chunks = [[0, 1], [2], [3, 4], [5]]
partial, equal = [], []
for step in range(9):
    xg, yg, x, y = global_batch(step)
    sgd_q.backward_and_partial_update(F.cross_entropy(model_q(x), y), threshold=30)
    for r, (m, o) in enumerate(zip(replicas, ref_opts)):
        o.zero_grad()
        F.cross_entropy(m(xg[r * B:(r + 1) * B]), yg[r * B:(r + 1) * B]).backward()
        o.step()
    with torch.no_grad():
        for i in chunks[step % len(chunks)]:
            mean = sum(list(m.parameters())[i] for m in replicas) / size
            for m in replicas:
                list(m.parameters())[i].copy_(mean)
    partial.append(max_diff(model_q, replicas[rank]))
    mine = [p.detach().numpy().copy() for p in model_q.parameters()]
    every = dist.get_comm().allgather_obj(mine)
    equal.append([i for i in range(len(mine))
                  if max(float(np.abs(e[i] - mine[i]).max()) for e in every) < 1e-13])
out["partial_diffs"] = partial
out["partial_equal"] = equal
out["partial_chunks"] = [len(c) for c in sgd_q._chunks[1]]

with open(f"{sys.argv[1]}/rank{rank}.pkl", "wb") as f:
    pickle.dump(out, f)
