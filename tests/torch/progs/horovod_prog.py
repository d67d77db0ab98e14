"""Every call of Horovod's three PyTorch examples (pytorch_mnist, pytorch_synthetic_benchmark,
pytorch_imagenet_resnet50; re-written here on small models) and the rest of Horovod's API,
on distnn.torch under mpiexec. Where an update rule promises it, each rank also trains a
reference copy on the WHOLE global batch in one process and records the largest difference.

python horovod_prog.py OUT_DIR  (under mpiexec -n N); writes OUT_DIR/rank<r>.pkl
"""
import copy
import math
import pickle
import sys
import timeit

import numpy as np
import torch
import torch.nn.functional as F
import torch.utils.data.distributed
from progkit import small_net

import distnn.torch as hvd
from distnn.distributed.adasum import reference as adasum_reference

torch.set_num_threads(1)
torch.set_default_dtype(torch.float64)
hvd.init()
rank, size = hvd.rank(), hvd.size()
out = {}


gen = np.random.default_rng(5)
X = torch.from_numpy(gen.standard_normal((64, 1, 6, 6)))
Y = torch.from_numpy(gen.integers(0, 4, 64))
DATA = torch.utils.data.TensorDataset(X, Y)


def max_diff(a, b):
    return max(float((p - q).detach().abs().max()) for p, q in zip(a.parameters(), b.parameters()))


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy().copy()


# -- pytorch_mnist.py's calls: sampler, broadcasts, compression, op, predivide, the
# synchronize/skip_synchronize (mixed precision, clipping) pattern, metric_average ---------
def mnist_flow(op=hvd.Average, compression=hvd.Compression.none, passes=1, predivide=1.0,
               clip=0.0, scale=1.0, steps=4, bs=4):
    model = small_net(0)
    ref = copy.deepcopy(model)
    with torch.no_grad():  # different on every rank until broadcast
        for p in model.parameters():
            p.add_(0.1 * rank)
    lr_scaler = 1  # N ranks == 1 process at the same learning rate (Average of means)
    if op == hvd.Adasum and hvd.nccl_built():
        lr_scaler = hvd.local_size()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1 * lr_scaler, momentum=0.5)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression, op=op,
                                         backward_passes_per_step=passes,
                                         gradient_predivide_factor=predivide)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.5)
    samplers = [torch.utils.data.distributed.DistributedSampler(
        DATA, num_replicas=size, rank=r, seed=3) for r in range(size)]
    scaler = torch.amp.GradScaler("cpu", init_scale=scale) if scale != 1.0 else None
    exact_adasum = op == hvd.Adasum and compression is hvd.Compression.none and passes == 1
    counts = [p.numel() for p in ref.parameters()]
    moms = [torch.zeros(sum(counts)) for _ in range(size)]
    diffs, losses = [], []
    for epoch in range(1, 3):
        for s in samplers:
            s.set_epoch(epoch)
        loaders = [torch.utils.data.DataLoader(DATA, batch_size=bs, sampler=s)
                   for s in samplers]
        for batch_idx, batches in enumerate(zip(*loaders)):
            if batch_idx >= steps // 2:
                break
            data, target = batches[rank]
            optimizer.zero_grad()
            for i in range(0, len(data), bs // passes):  # imagenet's sub-batches
                output = model(data[i:i + bs // passes])
                if op == hvd.Sum:
                    loss = F.cross_entropy(output, target[i:i + bs // passes],
                                           reduction="sum") / (bs * size)
                else:
                    loss = F.cross_entropy(output, target[i:i + bs // passes])
                    loss = loss / math.ceil(len(data) / (bs // passes))
                (scaler.scale(loss) if scaler else loss).backward()
            losses.append(loss.item())
            if scaler or clip:
                optimizer.synchronize()  # all-reduced gradients, then edit them in place
                if scaler:
                    scaler.unscale_(optimizer)  # in-place unscaling before the update
                if clip:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
                with optimizer.skip_synchronize():
                    scaler.step(optimizer) if scaler else optimizer.step()
                if scaler:
                    scaler.update()
            else:
                optimizer.step()
            if exact_adasum:  # every rank's local SGD-momentum delta, combined by Adasum
                w, deltas = torch.from_numpy(flat(ref)), []
                for r, (bx, by) in enumerate(batches):
                    ref.zero_grad()
                    F.cross_entropy(ref(bx), by).backward()
                    g = torch.cat([p.grad.reshape(-1) for p in ref.parameters()])
                    moms[r] = 0.5 * moms[r] + g
                    deltas.append(-0.1 * moms[r].numpy())
                new = w + torch.from_numpy(adasum_reference(deltas, counts))
                torch.nn.utils.vector_to_parameters(new, ref.parameters())
            else:
                gx = torch.cat([b[0] for b in batches])
                gy = torch.cat([b[1] for b in batches])
                ref_opt.zero_grad()
                F.cross_entropy(ref(gx), gy).backward()
                if clip:
                    torch.nn.utils.clip_grad_norm_(ref.parameters(), clip)
                ref_opt.step()
            diffs.append(max_diff(model, ref))
    test_loss = hvd.allreduce(torch.tensor(float(np.mean(losses))), name="avg_loss").item()
    optimizer.remove_hooks()
    return {"diffs": diffs, "flat": flat(model), "metric": test_loss,
            "calls": optimizer.allreduce_calls, "buckets": len(optimizer.buckets)}


out["mnist"] = {
    "average": mnist_flow(),
    "sum": mnist_flow(op=hvd.Sum),
    "passes2": mnist_flow(passes=2),
    "predivide": mnist_flow(predivide=2.0),
    "clip_scaler": mnist_flow(clip=0.3, scale=1024.0),
    "fp16": mnist_flow(compression=hvd.Compression.fp16),
    "adasum": mnist_flow(op=hvd.Adasum),
    "adasum_fp16_passes2": mnist_flow(op=hvd.Adasum, compression=hvd.Compression.fp16,
                                      passes=2),
}

# -- pytorch_synthetic_benchmark.py's calls: wrap first, then broadcast the wrapped optimizer,
# timeit over benchmark_step, logging on rank 0 ---------------------------------------------
def synthetic_benchmark(use_adasum):
    model = small_net(10 + rank)
    lr_scaler = hvd.size() if not use_adasum else 1
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * lr_scaler)
    compression = hvd.Compression.fp16 if use_adasum else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression,
                                         op=hvd.Adasum if use_adasum else hvd.Average)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    data, target = X[:8] + rank, Y[:8]

    def benchmark_step():
        optimizer.zero_grad()
        F.cross_entropy(model(data), target).backward()
        optimizer.step()

    timeit.timeit(benchmark_step, number=2)
    img_sec = 8 * 3 / timeit.timeit(benchmark_step, number=3)
    if hvd.rank() == 0:
        print(f"Img/sec per CPU: {img_sec:.1f}")
    optimizer.remove_hooks()
    return {"flat": flat(model), "img_sec": img_sec}


for use_adasum in (False, True):
    out[f"synthetic_adasum={use_adasum}"] = synthetic_benchmark(use_adasum)

# -- pytorch_imagenet_resnet50.py's calls: resume epoch broadcast with a name, Metric
# (allreduce with name), lr warm-up through param_groups, backward_passes_per_step,
# checkpoint save on rank 0 and restore on rank 0 followed by the broadcasts ----------------


class Metric:
    def __init__(self, name):
        self.name, self.sum, self.n = name, torch.tensor(0.0), torch.tensor(0.0)

    def update(self, val):
        self.sum += hvd.allreduce(val.detach().cpu(), name=self.name)
        self.n += 1

    @property
    def avg(self):
        return self.sum / self.n


resume_from_epoch = 2 if rank == 0 else 0
resume_from_epoch = hvd.broadcast(torch.tensor(resume_from_epoch), root_rank=0,
                                  name="resume_from_epoch").item()
model = small_net(0)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * size * 2, momentum=0.9)
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                     compression=hvd.Compression.none,
                                     backward_passes_per_step=2, op=hvd.Average,
                                     gradient_predivide_factor=1.0)
train_loss, train_accuracy = Metric("train_loss"), Metric("train_accuracy")
for batch_idx in range(3):
    for param_group in optimizer.param_groups:  # adjust_learning_rate
        param_group["lr"] = 0.01 * size * 2 * (batch_idx + 1) / 3
    optimizer.zero_grad()
    data, target = X[8 * rank:8 * rank + 8], Y[8 * rank:8 * rank + 8]
    for i in range(0, len(data), 4):
        output = model(data[i:i + 4])
        train_accuracy.update(output.argmax(1).eq(target[i:i + 4]).double().mean())
        loss = F.cross_entropy(output, target[i:i + 4])
        train_loss.update(loss)
        loss.div_(math.ceil(len(data) / 4))
        loss.backward()
    optimizer.step()
checkpoint = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
checkpoint = hvd.broadcast_object(checkpoint if rank == 0 else None, root_rank=0)
fresh = small_net(50 + rank)
fresh_opt = hvd.DistributedOptimizer(torch.optim.SGD(fresh.parameters(), lr=0.5, momentum=0.9),
                                     named_parameters=fresh.named_parameters(),
                                     backward_passes_per_step=2)
if resume_from_epoch > 0 and rank == 0:
    fresh.load_state_dict(checkpoint["model"])
    fresh_opt.load_state_dict(checkpoint["optimizer"])
hvd.broadcast_parameters(fresh.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(fresh_opt, root_rank=0)
out["imagenet"] = {
    "resume": resume_from_epoch, "loss": float(train_loss.avg), "acc": float(train_accuracy.avg),
    "flat": flat(model), "restored": flat(fresh),
    "momentum": torch.cat([fresh_opt.state[p]["momentum_buffer"].reshape(-1)
                           for p in fresh.parameters()]).numpy().copy(),
    "lr": fresh_opt.param_groups[0]["lr"],
}
optimizer.remove_hooks()
fresh_opt.remove_hooks()

# -- collectives: name=, op=, pre/postscale, async handles, grouped forms, alltoall,
# reducescatter, objects, autograd ----------------------------------------------------------
c = {}
t = torch.tensor([rank + 1.0, -2.0 * rank])
c["avg"] = hvd.allreduce(t, name="t").tolist()
c["sum_scaled"] = hvd.allreduce(t, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5,
                                name="s").tolist()
c["min_max_prod"] = [hvd.allreduce(t, op=hvd.Min).tolist(), hvd.allreduce(t, op=hvd.Max).tolist(),
                     hvd.allreduce(t, op=hvd.Product).tolist()]
h = hvd.allreduce_async(t, op=hvd.Sum, name="async")
while not hvd.poll(h):
    pass
c["async"] = hvd.synchronize(h).tolist()
inplace = torch.arange(6.0).reshape(2, 3) + rank
hvd.synchronize(hvd.allreduce_async_(inplace[:, ::2], op=hvd.Sum))  # non-contiguous view
c["async_inplace"] = inplace.tolist()
group = [torch.full((2,), float(rank)), torch.arange(3) + rank, torch.ones(2, 2) * rank]
c["grouped"] = [g.tolist() for g in hvd.grouped_allreduce(group, op=hvd.Sum, name="g")]
hvd.grouped_allreduce_(group[:1] + group[2:], op=hvd.Average)
c["grouped_inplace"] = [group[0].tolist(), group[2].tolist()]
c["allgather"] = hvd.allgather(torch.full((rank + 1, 2), float(rank)), name="ag").tolist()
c["grouped_allgather"] = [x.tolist() for x in hvd.grouped_allgather(
    [torch.tensor([rank]), torch.tensor([[rank * 1.0]])])]
c["broadcast"] = hvd.broadcast(torch.tensor([rank * 1.0]), root_rank=size - 1, name="b").tolist()
c["broadcast_async"] = hvd.synchronize(hvd.broadcast_async(torch.tensor([rank]), 1)).tolist()
rows = torch.arange(rank * 10, rank * 10 + size + 1).double()  # size + 1 rows: uneven
c["alltoall"] = hvd.alltoall(rows).tolist()
splits = [r + 1 for r in range(size)]
sent = torch.arange(sum(splits)).double().reshape(-1, 1) + 100 * rank
received, rsplits = hvd.alltoall(sent, splits=splits)
c["alltoall_splits"] = (received.reshape(-1).tolist(), rsplits.tolist())
full = torch.arange((size + 1) * 2).double().reshape(size + 1, 2) * (rank + 1)
c["reducescatter"] = hvd.reducescatter(full, op=hvd.Sum).tolist()
c["reducescatter_avg"] = hvd.reducescatter(full, postscale_factor=3.0).tolist()
c["grouped_reducescatter"] = [x.tolist() for x in hvd.grouped_reducescatter([full, full * 2],
                                                                            op=hvd.Sum)]
half = hvd.allreduce(t.float() / 3, compression=hvd.Compression.fp16)
c["fp16"] = (str(half.dtype), half.tolist(), hvd.Compression.fp16.compress(t)[0].dtype ==
             torch.float16)
c["object"] = hvd.broadcast_object({"from": rank}, root_rank=size - 1)
c["objects"] = hvd.allgather_object(("rank", rank))
x = torch.tensor([1.0, 2.0], requires_grad=True)
(hvd.allreduce(x, op=hvd.Sum) * (rank + 1)).sum().backward()
c["autograd"] = x.grad.tolist()
grads = {}
x = torch.ones(rank + 1, 2, requires_grad=True)
(hvd.allgather(x) * torch.arange(2.0 * size * (size + 1) / 2).reshape(-1, 2)).sum().backward()
grads["allgather"] = x.grad.tolist()
x = torch.ones(2, requires_grad=True)
hvd.broadcast(x, root_rank=size - 1).sum().backward()
grads["broadcast"] = x.grad.tolist()
x = torch.ones(size, 1, requires_grad=True)
(hvd.alltoall(x) * (rank + 1)).sum().backward()
grads["alltoall"] = x.grad.reshape(-1).tolist()
x = torch.ones(size, 2, requires_grad=True)
hvd.reducescatter(x, op=hvd.Sum).sum().backward()
grads["reducescatter"] = x.grad.tolist()
c["grads"] = grads
vectors = [np.random.default_rng([9, r]).standard_normal(7) for r in range(size)]
mine = [torch.from_numpy(vectors[rank][:3].copy()), torch.from_numpy(vectors[rank][3:].copy())]
ada = hvd.grouped_allreduce(mine, op=hvd.Adasum)
ref = adasum_reference(vectors, [3, 4])
c["adasum_err"] = float(np.abs(torch.cat(ada).numpy() - ref).max())
hvd.barrier()
out["collectives"] = c

# -- basics and process sets ---------------------------------------------------------------
out["basics"] = {
    "initialized": hvd.is_initialized(), "mpi_built": hvd.mpi_built(),
    "mpi_enabled": hvd.mpi_enabled(),
    "not_built": [f() for f in (hvd.gloo_built, hvd.gloo_enabled, hvd.nccl_built, hvd.ddl_built,
                                hvd.ccl_built, hvd.cuda_built, hvd.rocm_built)],
    "threads": hvd.mpi_threads_supported(), "cross": (hvd.cross_rank(), hvd.cross_size()),
    "local": (hvd.local_rank(), hvd.local_size()), "homogeneous": hvd.is_homogeneous(),
}
ends = hvd.add_process_set(hvd.ProcessSet([0, size - 1]))
odd = hvd.add_process_set([1])
p = {"ends": (ends.included(), ends.size(), ends.rank(), ends.ranks)}
if ends.included():
    p["ends_sum"] = hvd.allreduce(torch.tensor([rank]), op=hvd.Sum, process_set=ends).item()
    p["ends_bcast"] = hvd.broadcast(torch.tensor([rank]), root_rank=size - 1,
                                    process_set=ends).item()
    p["ends_gather"] = hvd.allgather_object(rank, process_set=ends)
if odd.included():
    p["odd_sum"] = hvd.allreduce(torch.tensor([rank + 5]), op=hvd.Sum, process_set=odd).item()
try:
    hvd.allreduce(torch.tensor([1.0]), process_set=odd)
    p["outsider_error"] = None
except ValueError as e:
    p["outsider_error"] = str(e)
model = small_net(70 + rank)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                               named_parameters=model.named_parameters(), process_set=ends)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
opt.zero_grad()
F.cross_entropy(model(X[rank:rank + 2]), Y[rank:rank + 2]).backward()
opt.step()
p["ps_opt_flat"] = flat(model)
p["removed"] = hvd.remove_process_set(odd)
out["process_sets"] = p

# -- join: rank r has 3 + r batches; every rank trains on its own, joins when out of data --
model, ref = small_net(0), small_net(0)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.2),
                               named_parameters=model.named_parameters())
ref_opt = torch.optim.SGD(ref.parameters(), lr=0.2)
nb = [3 + r for r in range(size)]
for step in range(max(nb)):
    live = [r for r in range(size) if step < nb[r]]
    if rank in live:
        opt.zero_grad()
        lo = 4 * (step * size + rank)
        F.cross_entropy(model(X[lo:lo + 4]), Y[lo:lo + 4]).backward()
        opt.step()
    ref_opt.zero_grad()  # reference: the live ranks' gradients summed, divided by size
    for r in live:
        lo = 4 * (step * size + r)
        (F.cross_entropy(ref(X[lo:lo + 4]), Y[lo:lo + 4]) / size).backward()
    ref_opt.step()
last = hvd.join()
hvd.broadcast_parameters(model.state_dict(), root_rank=last)
j = {"last": last, "diff": max_diff(model, ref), "calls": opt.allreduce_calls}
opt.remove_hooks()
# Horovod's join test: an average while rank 0 is joined counts its zeros
if rank == 0:
    j["ret0"] = hvd.join()
else:
    j["avg"] = hvd.allreduce(torch.tensor([6.0, 3.0])).tolist()
    try:
        hvd.allgather(torch.tensor([1.0]))
        j["allgather_error"] = None
    except RuntimeError as e:
        j["allgather_error"] = str(e)
    j["ret0"] = hvd.join()
j["rets"] = hvd.allgather_object(j["ret0"])
out["join"] = j

hvd.shutdown()
out["after_shutdown"] = hvd.is_initialized()
with open(f"{sys.argv[1]}/rank{rank}.pkl", "wb") as f:
    pickle.dump(out, f)
