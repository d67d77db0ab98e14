"""Needle's data-parallel ResNet9 script (apps/ddp: ``python apps/train_ddp.py`` under
mpiexec) in distnn's words: the same calls of ``ddp`` (``init``, ``partition_dataset``,
``broadcast_parameters``, ``DistributedOptimizer``, ``reset_grad``), the same model, optimizer
and loop, with ``from distnn.torch import ddp`` in place of ``import ddp`` and the model in
torch. Reads CIFAR-10's Python version (``cifar-10-batches-py``) as Needle does.

    mpiexec -n 2 python examples/needle_ddp_cifar10.py data/cifar-10-batches-py
    mpiexec -n 2 python examples/needle_ddp_cifar10.py data/cifar-10-batches-py --steps 20

The zoo has the same architecture for the distnn command: ``mpiexec -n 2 distnn train
--model resnet9 --dataset cifar10 --dataset_path data/cifar-10-batches-py``.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from torch import nn

from distnn import distributed as dist
from distnn.data import load_dataset
from distnn.torch import ddp


class ConvBN(nn.Module):
    """Needle's ConvBN: convolution (padding k // 2, with bias), BatchNorm, ReLU."""

    def __init__(self, a, b, k, s):
        super().__init__()
        self.conv = nn.Conv2d(a, b, k, stride=s, padding=k // 2)
        self.bn = nn.BatchNorm2d(b)
        self.relu = nn.ReLU()

    def forward(self, x):
        return self.relu(self.bn(self.conv(x)))


class Residual(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x) + x


class ResNet9(nn.Module):
    """Needle's hw4 ResNet9 (the zoo's ``resnet9``)."""

    def __init__(self, device=None, dtype="float32"):
        super().__init__()
        self.model = nn.Sequential(
            ConvBN(3, 16, 7, 4), ConvBN(16, 32, 3, 2),
            Residual(nn.Sequential(ConvBN(32, 32, 3, 1), ConvBN(32, 32, 3, 1))),
            ConvBN(32, 64, 3, 2), ConvBN(64, 128, 3, 2),
            Residual(nn.Sequential(ConvBN(128, 128, 3, 1), ConvBN(128, 128, 3, 1))),
            nn.Flatten(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10))
        self.to(device=device, dtype=getattr(torch, dtype))

    def forward(self, x):
        return self.model(x)


def main(argv=None):
    parser = argparse.ArgumentParser(description="Needle's apps/ddp ResNet9 on distnn")
    parser.add_argument("data", nargs="?", default="data/cifar-10-batches-py")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--steps", type=int, default=0, help="at most this many steps an epoch")
    parser.add_argument("--batch_size", type=int, default=128, help="global batch size")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    np.random.seed(0)
    torch.manual_seed(0)
    rank, device = ddp.init()

    dataset = load_dataset("cifar10", path=args.data).train  # Needle: CIFAR10Dataset(path)

    train_set, bsz = ddp.partition_dataset(dataset, args.batch_size, device=device,
                                           dtype="float32")
    if rank == 0:
        print(f"original dataset length: {len(dataset)}; batch size per rank: {bsz}")

    model = ResNet9(device=device, dtype="float32")
    ddp.broadcast_parameters(model)

    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=0.001, weight_decay=0.001)
    opt = ddp.DistributedOptimizer(opt)
    loss_fn = nn.CrossEntropyLoss()                      # Needle's SoftmaxLoss
    begin = time.time()
    for i in range(args.epochs):
        if rank == 0:
            print(f"epoch: {i + 1}/{args.epochs}")
        correct = total = 0
        for count, batch in enumerate(train_set):
            if args.steps and count >= args.steps:
                break
            opt.reset_grad()
            X, y = batch
            out = model(X)
            correct += int(np.sum(np.argmax(out.detach().numpy(), axis=1) == y.numpy()))
            total += y.shape[0]
            loss = loss_fn(out, y)
            loss.backward()
            opt.step()
            if rank == 0 and count % 100 == 0:
                print(f"acc: {correct / total:.4f}; avg_loss: {loss.detach().numpy()}")
    sums = dist.allreduce(np.array([correct, total], dtype=np.float64), op="sum")
    if rank == 0:
        print(f"train accuracy (last epoch, all ranks): {sums[0] / sums[1]:.4f}; "
              f"time: {time.time() - begin:.1f}s")


if __name__ == "__main__":
    main()
