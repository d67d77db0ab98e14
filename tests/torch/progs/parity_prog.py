"""N ranks with distnn.torch == one process on the same global batches (DDP's
_test_DDP_niter pattern): every rank also trains a reference copy on the WHOLE global
batch and compares parameters after every step.

python parity_prog.py OUT_DIR  (under mpiexec -n N); writes OUT_DIR/rank<r>.pkl
"""
import pickle
import sys

import numpy as np
import torch
import torch.nn.functional as F

import distnn.torch as hvd
from distnn.distributed import LocalComm

torch.set_num_threads(1)
torch.set_default_dtype(torch.float64)
out_dir = sys.argv[1]
comm = hvd.init()
rank, size = hvd.rank(), hvd.size()


def net(seed, batchnorm=False):
    torch.manual_seed(seed)
    layers = [torch.nn.Conv2d(1, 3, 3)]
    if batchnorm:
        layers.append(torch.nn.BatchNorm2d(3))
    layers += [torch.nn.ReLU(), torch.nn.MaxPool2d(2), torch.nn.Flatten(),
               torch.nn.Linear(27, 8), torch.nn.Tanh(), torch.nn.Linear(8, 4)]
    return torch.nn.Sequential(*layers)


def make_opt(kind, params, lr_scale=1.0):
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.1 * lr_scale, momentum=0.9, weight_decay=1e-3)
    return torch.optim.Adam(params, lr=0.01 * lr_scale, weight_decay=1e-3)


def max_diff(a, b):
    return max(float((p - q).abs().max()) for p, q in zip(a.state_dict().values(),
                                                           b.state_dict().values())
               if p.is_floating_point())


gen = np.random.default_rng(123)
X = torch.from_numpy(gen.standard_normal((42, 1, 8, 8)))
Y = torch.from_numpy(gen.integers(0, 4, 42))
results = {}
for kind in ("sgd", "adam"):
    for mode in ("sum", "average", "syncbn"):
        ref = net(0, batchnorm=mode == "syncbn")
        model = net(100 + rank, batchnorm=mode == "syncbn")   # different until broadcast
        if mode == "syncbn":
            model = hvd.convert_sync_batchnorm(model)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        if rank == 0:
            ref.load_state_dict(model.state_dict())
        ref.load_state_dict({k: hvd.broadcast(v) for k, v in ref.state_dict().items()})
        ref_opt = make_opt(kind, ref.parameters())
        # Non-root ranks start with other hyper-parameters: the broadcast must fix them
        # without stepping (a step would move Adam's step count and the weights).
        opt = make_opt(kind, model.parameters(), 1.0 if rank == 0 else 3.0)
        hvd.broadcast_optimizer_state(opt, root_rank=0)
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                       op="average" if mode == "average" else "sum",
                                       bucket_size_mb=0.0005)
        diffs = []
        gbs = 12 if mode == "average" else 10
        n_total = 60 if mode == "average" else 42
        data = (X[:n_total], Y[:n_total]) if n_total <= 42 else (
            torch.cat([X, X[:18]]), torch.cat([Y, Y[:18]]))
        ref_batches = list(hvd.partition_dataset(data, gbs, seed=7, comm=LocalComm()))
        for step, (x, y, n) in enumerate(hvd.partition_dataset(data, gbs, seed=7)):
            if step == 5:
                break
            opt.zero_grad()
            out = model(x)
            if mode == "average":
                loss = F.cross_entropy(out, y)
            else:
                loss = F.cross_entropy(out, y, reduction="sum") / n
            loss.backward()
            opt.step()
            rx, ry, rn = ref_batches[step]
            ref_opt.zero_grad()
            F.cross_entropy(ref(rx), ry, reduction="sum").div(rn).backward()
            ref_opt.step()
            diffs.append((len(x), n, max_diff(model, ref)))
        flat = torch.cat([v.reshape(-1).double() for v in model.state_dict().values()])
        results[(kind, mode)] = {"diffs": diffs, "flat": flat.numpy().copy(),
                                 "calls": opt.allreduce_calls, "buckets": len(opt.buckets)}
        opt.remove_hooks()

# Resume: root's optimizer has state (2 steps, as after loading a checkpoint), the others
# are fresh; after the broadcasts every rank continues root's trajectory.
batches = list(hvd.partition_dataset((X, Y), 10, seed=3, comm=LocalComm()))
ref, model = net(0), net(0)
ref_opt, opt = make_opt("adam", ref.parameters()), make_opt("adam", model.parameters())
for step in range(2):
    x, y, n = batches[step]
    for m, o in ((ref, ref_opt), (model, opt)):
        if m is model and rank != 0:
            continue
        o.zero_grad()
        F.cross_entropy(m(x), y, reduction="sum").div(n).backward()
        o.step()
hvd.broadcast_parameters(model.state_dict())
hvd.broadcast_optimizer_state(opt)
state_steps = [float(s["step"]) for s in opt.state.values()]
opt = hvd.DistributedOptimizer(opt, model.named_parameters(), op="sum")
diffs = []
for step, (x, y, n) in enumerate(hvd.partition_dataset((X, Y), 10, seed=3)):
    if step < 2:
        continue
    opt.zero_grad()
    F.cross_entropy(model(x), y, reduction="sum").div(n).backward()
    opt.step()
    rx, ry, rn = batches[step]
    ref_opt.zero_grad()
    F.cross_entropy(ref(rx), ry, reduction="sum").div(rn).backward()
    ref_opt.step()
    diffs.append((len(x), n, max_diff(model, ref)))
results["resume"] = {"diffs": diffs, "state_steps": state_steps}

# Collectives on tensors (uneven allgather: rank r passes r + 1 rows).
mine = torch.full((rank + 1, 2), float(rank))
results["collectives"] = {
    "average": hvd.allreduce(torch.tensor([rank + 1.0, 2.0])).tolist(),
    "sum": hvd.allreduce(torch.tensor([rank + 1]), op=hvd.Sum).tolist(),
    "max": hvd.allreduce(torch.tensor([float(rank)]), op=hvd.Max).tolist(),
    "allgather": hvd.allgather(mine).tolist(),
    "broadcast": hvd.broadcast(torch.tensor([float(rank), 7.0]), root_rank=size - 1).tolist(),
    "inplace": (lambda t: (hvd.allreduce_(t[::2], op="sum"), t.tolist())[1])(
        torch.arange(4.0) + rank),
    "metric": hvd.metric_average(torch.tensor(float(rank))),
}
with open(f"{out_dir}/rank{rank}.pkl", "wb") as f:
    pickle.dump(results, f)
