"""The same ZeRO training on distnn (``mpiexec -n N python zero_prog.py distnn OUT``) and on
PyTorch's own ZeroRedundancyOptimizer over gloo (``python zero_prog.py torch N OUT``: this
process is rank 0 and forks ranks 1..N-1, one torch import for the whole group, gloo on
127.0.0.1). Same seeds, same data, float64. Each rank writes <OUT>/<side>.rank<r>.pt.

Cases: "sgd" (two parameter groups, momentum, weight decay, bucket views) with gradients
combined the usual way of each side (hvd.DistributedOptimizer / torch DDP); "adam" (a group
added after 3 steps, gradients averaged by hand on both sides); "memory" (a model that
splits evenly: the bytes of each rank's optimizer state). The distnn side also reloads its
consolidated state into a fresh optimizer and checks that it steps as the original does.
"""
import copy
import os
import sys

import torch
from progkit import fork_ranks


STEPS, MORE = 8, 3


def net(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16),
                               torch.nn.Tanh(), torch.nn.Linear(16, 4)).double()


def batch(step: int, rank: int):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return (torch.randn(8, 6, generator=g, dtype=torch.float64),
            torch.randn(8, 4, generator=g, dtype=torch.float64))


def train(model, fwd, opt, steps, rank, first=0, average=None, at_step=None):
    for s in range(first, first + steps):
        if at_step is not None:
            at_step(s)
        x, y = batch(s, rank)
        opt.zero_grad()
        torch.nn.functional.mse_loss(fwd(x), y).backward()
        if average is not None:
            average([p.grad for p in model.parameters()])
        opt.step()


def params(model) -> list:
    return [p.detach().clone() for p in model.parameters()]


def state_bytes(optim) -> int:
    return sum(v.numel() * v.element_size() for st in optim.state.values()
               for v in st.values() if torch.is_tensor(v))


def owned(zero, model) -> list:
    """Indices (in model.parameters() order) of the parameters this rank updates."""
    mine = {id(p) for g in zero.optim.param_groups for p in g["params"]}
    return [i for i, p in enumerate(model.parameters()) if id(p) in mine]


def sgd_groups(model):
    ws = [p for n, p in model.named_parameters() if n.endswith("weight")]
    bs = [p for n, p in model.named_parameters() if n.endswith("bias")]
    return [{"params": ws}, {"params": bs, "lr": 0.1, "weight_decay": 1e-3}]


def cases(Zero, rank, size, wrap_sgd, average, consolidate_to):
    """What both sides run; ``wrap_sgd(model, zero) -> (forward, optimizer)``."""
    out = {}
    model = net(0)
    zero = Zero(sgd_groups(model), torch.optim.SGD, lr=0.05, momentum=0.9,
                parameters_as_bucket_view=True)
    fwd, opt = wrap_sgd(model, zero)
    train(model, fwd, opt, STEPS, rank)
    zero.consolidate_state_dict(to=consolidate_to)
    out["sgd"] = {"params": params(model), "owned": owned(zero, model),
                  "state": zero.state_dict() if rank == consolidate_to else None}

    model = net(1)
    layers = list(model.children())
    zero = Zero([p for m in layers[:3] for p in m.parameters()], torch.optim.Adam, lr=0.01)

    def add_last(s):
        if s == 3:
            zero.add_param_group({"params": list(layers[4].parameters()), "lr": 0.003})
    train(model, model, zero, STEPS, rank, average=average, at_step=add_last)
    zero.consolidate_state_dict(to=consolidate_to)
    sd = zero.state_dict() if rank == consolidate_to else None
    out["adam"] = {"params": params(model), "owned": owned(zero, model), "state": sd,
                   "model": model, "zero": zero}

    torch.manual_seed(2)
    even = torch.nn.Sequential(*[torch.nn.Linear(24, 24) for _ in range(6)]).double()
    zero = Zero(even.parameters(), torch.optim.Adam, lr=0.01)
    for p in even.parameters():
        p.grad = torch.ones_like(p)
    zero.step()
    full = torch.optim.Adam(even.parameters(), lr=0.01)
    full.step()
    out["memory"] = {"mine": state_bytes(zero.optim), "unsharded": state_bytes(full),
                     "owned": owned(zero, even)}
    return out


def run_distnn(folder: str) -> None:
    import distnn.torch as hvd
    hvd.init()
    rank, size = hvd.rank(), hvd.size()

    def wrap_sgd(model, zero):  # a Horovod script's lines, with the optimizer sharded
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(zero, root_rank=0)
        return model, hvd.DistributedOptimizer(zero, named_parameters=model.named_parameters())

    def average(grads):
        hvd.grouped_allreduce_(grads, op=hvd.Average)

    out = cases(hvd.ZeroRedundancyOptimizer, rank, size, wrap_sgd, average, size - 1)
    adam = out["adam"]
    # the consolidated state, loaded on every rank into a fresh optimizer of a copy of the
    # model, steps exactly as the optimizer it came from
    sd = hvd.broadcast_object(adam.pop("state") if rank == size - 1 else None, size - 1)
    model, zero = adam.pop("model"), adam.pop("zero")
    twin = net(1)
    twin.load_state_dict(model.state_dict())
    layers = list(twin.children())
    fresh = hvd.ZeroRedundancyOptimizer([p for m in layers[:3] for p in m.parameters()],
                                        torch.optim.Adam, lr=0.5 + rank)
    fresh.add_param_group({"params": list(layers[4].parameters()), "lr": 0.5 + rank})
    hvd.broadcast_optimizer_state(fresh, root_rank=0)  # rank 0's hyper-parameters everywhere
    adam["broadcast_lrs"] = [g["lr"] for g in fresh.param_groups]
    adam["state"] = copy.deepcopy(sd)  # the fresh optimizer's state will share sd's tensors
    fresh.load_state_dict(sd)
    train(model, model, zero, MORE, rank, first=STEPS, average=average)
    train(twin, twin, fresh, MORE, rank, first=STEPS, average=average)
    adam["resumed"] = [torch.equal(a, b) for a, b in zip(params(model), params(twin))]
    adam["lrs"] = [g["lr"] for g in fresh.param_groups]
    torch.save(out, os.path.join(folder, f"distnn.rank{rank}.pt"))


def run_torch(size: int, folder: str) -> None:
    import torch.distributed as dist
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel
    rank, port = fork_ranks(size)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=size)

    def wrap_sgd(model, zero):
        return DistributedDataParallel(model), zero

    def average(grads):
        for g in grads:
            dist.all_reduce(g)
            g /= size

    out = cases(ZeroRedundancyOptimizer, rank, size, wrap_sgd, average, size - 1)
    for case in out.values():
        case.pop("model", None), case.pop("zero", None)
    torch.save(out, os.path.join(folder, f"torch.rank{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()
    if rank:
        os._exit(0)
    for _ in range(1, size):
        _, status = os.wait()
        if status:
            sys.exit(f"a forked rank failed (wait status {status})")


if __name__ == "__main__":
    torch.set_num_threads(1)
    if sys.argv[1] == "distnn":
        run_distnn(sys.argv[2])
    else:
        run_torch(int(sys.argv[2]), sys.argv[3])
