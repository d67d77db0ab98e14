"""A Horovod-style PyTorch script on distnn.torch (change `import horovod.torch as hvd`):

    mpiexec -n 2 python examples/horovod_mnist.py --epochs 3

Each rank trains on its share of every global batch (distnn's exact sharding: the summed
loss divided by the global batch size, op="sum"), so N ranks make the updates of one
process with the same global batch.
"""
import argparse

import numpy as np
import torch
import torch.nn.functional as F

import distnn.torch as hvd
from distnn.data import load_dataset
from mnist_torch import MNistNet

ap = argparse.ArgumentParser()
ap.add_argument("--epochs", type=int, default=3)
ap.add_argument("--batch_size", type=int, default=64, help="per rank")
ap.add_argument("--steps", type=int, default=0, help="at most this many steps per epoch")
args = ap.parse_args()

hvd.init()
torch.set_num_threads(1)  # one thread per rank: ranks share the host's cores
torch.manual_seed(0)
splits = load_dataset("fashion_mnist", validation_split=0.0)
(x_train, y_train), (x_test, y_test) = splits.train.arrays(), splits.test.arrays()
train = (torch.from_numpy(x_train), torch.from_numpy(y_train))

model = MNistNet()
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(opt, root_rank=0)
opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(), op="sum")

for epoch in range(args.epochs):
    model.train()
    loss_sum = count = 0.0
    for step, (x, y, n) in enumerate(hvd.partition_dataset(
            train, args.batch_size * hvd.size(), seed=0, epoch=epoch)):
        if args.steps and step >= args.steps:
            break
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y, reduction="sum") / n
        loss.backward()
        opt.step()
        loss_sum += loss.item() * n  # this rank's summed loss
        count += len(x)
    # exact test accuracy: every rank scores its share, then sums and counts are reduced
    model.eval()
    lo, hi = np.array_split(np.arange(len(x_test)), hvd.size())[hvd.rank()][[0, -1]]
    with torch.no_grad():
        pred = model(torch.from_numpy(x_test[lo:hi + 1])).argmax(1).numpy()
    sums = hvd.allreduce(torch.tensor([loss_sum, count,
                                       float((pred == y_test[lo:hi + 1]).sum())]), op=hvd.Sum)
    if hvd.rank() == 0:
        print(f"epoch {epoch + 1}: train loss {float(sums[0] / sums[1]):.4f}, test accuracy "
              f"{float(sums[2]) / len(x_test):.4f}", flush=True)
