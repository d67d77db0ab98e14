"""hvd.DistributedOptimizer(stall=): the stall inspector watching the optimizer's
communicator names a late rank and the phase this rank waits in (rank 1 is late)."""
import time

import torch

import distnn.torch as hvd
from distnn import distributed as dist
from distnn.distributed.stall import watch_stalls

hvd.init()
comm = dist.init()
inspector = watch_stalls(comm, warning=1.0)
torch.manual_seed(0)
model = torch.nn.Linear(8, 2)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                               named_parameters=model.named_parameters(), comm=comm,
                               stall=inspector)
for step in range(2):
    opt.zero_grad()
    if comm.rank == 1 and step == 1:
        time.sleep(3.0)  # late: rank 0 waits for it in the all-reduce of its bucket
    model(torch.ones(4, 8)).sum().backward()
    opt.step()
inspector.close()
print(f"rank {comm.rank} done", flush=True)
