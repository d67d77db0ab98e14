"""PyTorch's own distributed training, started two ways, for test_process_group.py:
``mpiexec -n 2 python torch_dist_prog.py mpi OUT`` (the group from MPI through
``distnn.torch.init_process_group``) and ``python torch_dist_prog.py env 2 OUT`` (torchrun's
environment: MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE and ``init_process_group("gloo")``;
this process is rank 0 and forks the others, one torch import for the group).

Both run the same script body: FSDP2 (``fully_shard`` on each Linear and the root) with Adam
on per-rank batches, then a 2-stage GPipe pipeline (``ScheduleGPipe``, 4 micro-batches)
with SGD-momentum, float64. Rank 0 writes <OUT>/<how>.pt: the full parameters of both
models and what each rank saw of the environment.
"""
import os
import sys

import torch
import torch.distributed as tdist
from progkit import fork_ranks


STEPS, MICRO = 6, 4


def mlp(seed: int, widths) -> torch.nn.Sequential:
    torch.manual_seed(seed)
    layers = []
    for a, b in zip(widths[:-1], widths[1:]):
        layers += [torch.nn.Linear(a, b), torch.nn.Tanh()]
    return torch.nn.Sequential(*layers[:-1]).double()


FSDP_WIDTHS, PIPE_WIDTHS = (8, 32, 32, 4), (8, 16, 16, 16, 4)


def batch(step: int, rank: int, rows: int = 8):
    g = torch.Generator().manual_seed(100 * step + rank)
    return (torch.randn(rows, 8, generator=g, dtype=torch.float64),
            torch.randn(rows, 4, generator=g, dtype=torch.float64))


def mse(y, t):
    return torch.nn.functional.mse_loss(y, t)


def fsdp(rank: int) -> dict:
    from torch.distributed.fsdp import fully_shard
    model = mlp(0, FSDP_WIDTHS)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for s in range(STEPS):
        x, y = batch(s, rank)
        mse(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    sharded = {k: v.to_local().numel() for k, v in model.state_dict().items()}
    return {"params": {k: v.full_tensor() for k, v in model.state_dict().items()},
            "local_numel": sharded}


def gpipe(rank: int, size: int) -> dict:
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe
    model = mlp(1, PIPE_WIDTHS)
    cut = len(model) // 2 + 1  # Linear, Tanh, Linear, Tanh | Linear, Tanh, Linear
    part = model[:cut] if rank == 0 else model[cut:]
    stage = PipelineStage(part, rank, size, torch.device("cpu"))
    schedule = ScheduleGPipe(stage, n_microbatches=MICRO, loss_fn=mse)
    opt = torch.optim.SGD(part.parameters(), lr=0.1, momentum=0.9)
    for s in range(STEPS):
        x, y = batch(s, 0, rows=16)  # one batch through the pipeline, not one per rank
        opt.zero_grad()
        if rank == 0:
            schedule.step(x)
        else:
            schedule.step(target=y)
        opt.step()
    mine = {k: v.detach().clone() for k, v in part.state_dict().items()}  # slices keep names
    everyone = [None] * size
    tdist.all_gather_object(everyone, mine)
    return {"params": {k: v for d in everyone for k, v in d.items()}}


def body(how: str, folder: str) -> None:
    rank, size = tdist.get_rank(), tdist.get_world_size()
    seen = {k: os.environ.get(k) for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE",
                                           "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    seen.update(rank=rank, size=size, backend=tdist.get_backend())
    out = {"fsdp": fsdp(rank), "gpipe": gpipe(rank, size)}
    envs = [None] * size
    tdist.all_gather_object(envs, seen)
    out["env"] = envs
    if rank == 0:
        torch.save(out, os.path.join(folder, f"{how}.pt"))
    tdist.barrier()
    tdist.destroy_process_group()


def torchrun_style(size: int, folder: str) -> None:
    rank, port = fork_ranks(size)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(size), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(size))
    tdist.init_process_group("gloo")
    body("env", folder)
    if rank:
        os._exit(0)
    for _ in range(1, size):
        if os.wait()[1]:
            sys.exit("a forked rank failed")


if __name__ == "__main__":
    torch.set_num_threads(1)
    if sys.argv[1] == "mpi":
        import distnn.torch
        distnn.torch.init_process_group(backend="gloo")  # the one line that differs
        body(sys.argv[3] if len(sys.argv) > 3 else "mpi", sys.argv[2])
    else:
        torchrun_style(int(sys.argv[2]), sys.argv[3])
