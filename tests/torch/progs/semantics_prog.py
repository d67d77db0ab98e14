"""Run under mpiexec by test_horovod_semantics.py: Horovod's semantics on distnn.torch
(scale factors on integers and float16, integer Average, the cross-rank check of
mismatched calls, asynchronous collectives in flight, names in flight, signatures).
Each rank pickles what it saw to <out>/rank<r>.pkl."""
import pickle
import sys
import time

import torch
from mpi4py import MPI

import distnn.torch as hvd

torch.set_num_threads(1)
hvd.init()
rank, size = hvd.rank(), hvd.size()
out = {}

# -- scale factors: integers scaled in float64, float16 in float32, cast back ------------------
ten = torch.full((4,), 10, dtype=torch.int32)
half = torch.full((3,), 1.5, dtype=torch.float16)
out["scale"] = {
    "int_pre": hvd.allreduce(ten, op=hvd.Sum, prescale_factor=0.5).tolist(),
    "int_post": hvd.allreduce(ten, op=hvd.Sum, postscale_factor=0.25).tolist(),
    "int64_pre": hvd.allreduce(ten.long(), op=hvd.Sum, prescale_factor=0.37).tolist(),
    "half_pre": hvd.allreduce(half, op=hvd.Sum, prescale_factor=0.3).float().tolist(),
    "half_dtype": str(hvd.allreduce(half, op=hvd.Sum, prescale_factor=0.3).dtype),
    "rs_half_pre": hvd.reducescatter(torch.full((2 * size,), 1.5, dtype=torch.float16),
                                     op=hvd.Sum, prescale_factor=0.3).float().tolist(),
    "rs_int_pre": hvd.reducescatter(torch.full((2 * size,), 10, dtype=torch.int64), op=hvd.Sum,
                                    prescale_factor=0.5).tolist(),
    "rs_int_post": hvd.reducescatter(torch.full((size,), 10, dtype=torch.int32), op=hvd.Sum,
                                     postscale_factor=0.25).tolist(),
    "grouped_int_pre": [t.tolist() for t in hvd.grouped_allreduce(
        [ten, ten.long()], op=hvd.Sum, prescale_factor=0.5)],
}
avg = hvd.allreduce(torch.tensor([2 * rank + 1, 7], dtype=torch.int32), op=hvd.Average)
rs_avg = hvd.reducescatter(torch.full((size,), 3 + rank, dtype=torch.int64), op=hvd.Average)
out["int_average"] = (str(avg.dtype), avg.tolist(), str(rs_avg.dtype), rs_avg.tolist())


# -- mismatched calls: the same RuntimeError on every rank, then the job goes on ------------
def outcome(fn):
    t0 = time.perf_counter()
    try:
        fn()
        return ("no error", "", time.perf_counter() - t0)
    except Exception as e:  # the type is what is tested
        return (type(e).__name__, str(e), time.perf_counter() - t0)


last = size - 1
f32, f64 = torch.float32, torch.float64
cases = {
    "broadcast_dtype": lambda: hvd.broadcast(
        torch.full((4,), 7, dtype=torch.int32 if rank == 0 else f32), 0),
    "broadcast_root": lambda: hvd.broadcast(torch.ones(3), rank),
    "broadcast_inplace_root": lambda: hvd.broadcast_(torch.ones(3), min(rank, 1)),
    "reducescatter_shape": lambda: hvd.reducescatter(torch.ones(4 + (rank == last))),
    "allreduce_dtype": lambda: hvd.allreduce(torch.ones(3, dtype=f32 if rank else f64)),
    "allreduce_same_numel": lambda: hvd.allreduce(
        torch.ones(17, 23 * 57) if rank == 0 else torch.ones(17, 23, 57)),
    "allreduce_op": lambda: hvd.allreduce(torch.ones(3), op=hvd.Sum if rank else hvd.Max),
    "allreduce_name": lambda: hvd.allreduce(torch.ones(3), name=f"n{min(rank, 1)}"),
    "allgather_shape": lambda: hvd.allgather(torch.ones(2, 3 + (rank == last))),
    "allgather_dtype": lambda: hvd.allgather(torch.ones(2, dtype=f32 if rank else f64)),
    "alltoall_shape": lambda: hvd.alltoall(torch.ones(size, 2 + (rank == last))),
    "grouped_allreduce_shapes": lambda: hvd.grouped_allreduce(
        [torch.ones(2), torch.ones(3 + (rank == last))]),
    "allreduce_vs_allgather": lambda: (hvd.allreduce(torch.ones(2)) if rank == 0
                                       else hvd.allgather(torch.ones(2))),
    "async_allgather_shape": lambda: hvd.synchronize(
        hvd.allgather_async(torch.ones(2, 2 + (rank == last)))),
}
out["mismatch"] = {k: outcome(fn) for k, fn in cases.items()}
out["after_mismatch"] = hvd.allreduce(torch.tensor([float(rank)]), op=hvd.Sum).item()

# -- asynchronous collectives: in flight while a peer is late --------------------------------
late = {}
for what, start in {
    "allgather": lambda: hvd.allgather_async(torch.full((2,), float(rank))),
    "broadcast": lambda: hvd.broadcast_async(torch.full((2,), float(rank)), root_rank=last),
    "broadcast_": lambda: hvd.broadcast_async_(torch.full((2,), float(rank)), root_rank=last),
    "alltoall": lambda: hvd.alltoall_async(torch.arange(size, dtype=f32) + 10 * rank),
    "reducescatter": lambda: hvd.reducescatter_async(torch.ones(size) * (rank + 1),
                                                     op=hvd.Sum),
    "grouped_allgather": lambda: hvd.grouped_allgather_async([torch.tensor([rank])]),
}.items():
    hvd.barrier()
    if rank == 0:
        t0 = time.perf_counter()
        h = start()
        returned = time.perf_counter() - t0
        polled = hvd.poll(h)
        result = hvd.synchronize(h)
        late[what] = (returned, polled, hvd.poll(h), result)
    else:
        time.sleep(0.8)
        h = start()
        late[what] = (0.0, False, True, hvd.synchronize(h))
out["late"] = {k: (r, p, q, [x.tolist() for x in v] if isinstance(v, list) else v.tolist())
               for k, (r, p, q, v) in late.items()}

# several in flight, a barrier among them, synchronized after it
b = hvd.broadcast_async(torch.eye(3) * (rank + 1), root_rank=0)
g1 = hvd.allgather_async(torch.eye(2))
g2 = hvd.allgather_async(torch.zeros(1, 2) + rank)
a = hvd.allreduce_async(torch.eye(2), op=hvd.Sum)
hvd.barrier()
out["with_barrier"] = (hvd.synchronize(a).tolist(), hvd.synchronize(g2).tolist(),
                       hvd.synchronize(g1).shape[0], hvd.synchronize(b).tolist())

# -- names in flight ------------------------------------------------------------------------
names = {}
t = torch.ones(3)
if rank == 0:
    h1 = hvd.allgather_async(t, name="twice")
    names["second"] = outcome(lambda: hvd.allgather_async(t, name="twice"))[0]
hvd.barrier()
if rank > 0:
    h1 = hvd.allgather_async(t, name="twice")
    names["second"] = outcome(lambda: hvd.allgather_async(t, name="twice"))[0]
hvd.synchronize(h1)
names["after_synchronize"] = outcome(
    lambda: hvd.synchronize(hvd.broadcast_async(t, 0, name="twice")))[0]
h = hvd.allreduce_async(t, name="reduced")
names["allreduce_second"] = outcome(lambda: hvd.allreduce_async(t, name="reduced"))[0]
hvd.synchronize(h)
out["names"] = names

# -- signatures and forms Horovod scripts use -----------------------------------------------
model = torch.nn.Linear(2, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1 * (rank + 1))
hvd.broadcast_optimizer_state(opt, 0, model=model)
sparse = hvd.sparse_allreduce_async(torch.ones(3).to_sparse() * (rank + 1), name="sp",
                                    op=hvd.Sum)
xs = [torch.ones(3, requires_grad=True), torch.ones(2, 2, dtype=f64, requires_grad=True)]
ys = hvd.grouped_allreduce(xs, op=hvd.Sum)
(ys[0].sum() + 2 * ys[1].sum()).backward()
ys = hvd.grouped_allreduce([x.detach().requires_grad_() for x in xs], op=hvd.Average)
sub = MPI.COMM_WORLD.Split(rank % 2, rank)
ps = hvd.add_process_set(hvd.ProcessSet(sub))
out["forms"] = {
    "object": hvd.broadcast_object({"from": rank}, last, "obj"),
    "lr": opt.param_groups[0]["lr"],
    "sparse_callable": callable(sparse),
    "sparse": sparse().to_dense().tolist(),
    "grouped_grads": [xs[0].grad.tolist(), xs[1].grad.tolist()],
    "grouped_avg_grad_fn": all(y.grad_fn is not None for y in ys),
    "comm_set": ps.ranks,
    "comm_set_sum": hvd.allreduce(torch.tensor([rank]), op=hvd.Sum, process_set=ps).item(),
    "parameter_names": sorted(hvd.DistributedOptimizer(torch.optim.SGD(
        [{"params": model.parameters()}, {"params": torch.nn.Linear(2, 1).parameters()}],
        lr=0.1))._parameter_names.values()),
}

# -- a barrier returns after the async collectives every rank queued before it -------------
hs = [hvd.allgather_async(torch.ones(50000) * rank), hvd.allreduce_async(torch.ones(50000))]
hvd.barrier()
out["barrier_polls"] = [hvd.poll(h) for h in hs]
for h in hs:
    hvd.synchronize(h)

# -- join serves the queued all-reduces of the ranks still training -------------------------
a_ = torch.tensor([6.0, 3.0]) * (rank + 1)
if rank == 0:
    joined = {"ret": hvd.join()}
else:
    h = hvd.allreduce_async(a_, name="joined_avg")
    g = hvd.grouped_allreduce_async([a_, a_ * 2], op=hvd.Sum)
    joined = {"avg": hvd.synchronize(h).tolist(),
              "grouped": [t.tolist() for t in hvd.synchronize(g)]}
    joined["allgather"] = outcome(lambda: hvd.synchronize(hvd.allgather_async(a_)))[0]
    if rank == size - 1:
        time.sleep(0.3)  # the last rank to join
    joined["ret"] = hvd.join()
joined["rets"] = hvd.allgather_object(joined["ret"])
out["join"] = joined

# -- sparse gradients (nn.Embedding(sparse=True)) with SparseAdam, against one process -------
inputs = [torch.tensor([[1, 2, 4, 5]]), torch.tensor([[1, 3, 4, 7]]), torch.tensor([[0, 9, 9, 2]])]
torch.manual_seed(3)
emb = torch.nn.Embedding(10, 3, sparse=True)
ref = torch.nn.Embedding(10, 3, sparse=True)
ref.load_state_dict(emb.state_dict())
sopt = hvd.DistributedOptimizer(torch.optim.SparseAdam(list(emb.parameters()), lr=0.1))
ref_opt = torch.optim.SparseAdam(list(ref.parameters()), lr=0.1)
for _ in range(2):
    sopt.zero_grad()
    emb(inputs[rank % 3]).sum().backward()
    sopt.step()
    grads = []
    for r in range(size):
        ref.zero_grad()
        ref(inputs[r % 3]).sum().backward()
        grads.append(ref.weight.grad.to_dense())
    ref.weight.grad = (sum(grads) / size).to_sparse(1)
    ref_opt.step()
out["sparse_adam"] = float((emb.weight - ref.weight).abs().max())
out["errors"] = {
    "alltoall_float_splits": outcome(
        lambda: hvd.alltoall(torch.ones(size), torch.ones(size)))[0],
}
try:
    hvd.reducescatter(torch.ones(size), op=hvd.Adasum)
except Exception as e:
    out["errors"]["adasum_is"] = (isinstance(e, RuntimeError), isinstance(e, ValueError))
hvd.barrier()
with open(f"{sys.argv[1]}/rank{rank}.pkl", "wb") as f:
    pickle.dump(out, f)
