"""The README main job's recipe as a plain PyTorch DDP (gloo) script, for benchmarks/main_job.py.

    torchrun --standalone --nproc_per_node 2 benchmarks/workers/ddp_main_job.py OUT.json
        [--epochs 3] [--first-step-only] [--powersgd RANK [--powersgd-start STEPS]]

Recipe (distnn train's defaults): simplecnn, Fashion-MNIST scaled to [0, 1], the last 20% of
the training images held out for validation, batch 64 per rank, SGD lr 0.01 momentum 0.9,
cross-entropy, 3 epochs, a fresh shuffle every epoch sharded rank::size, validation after
every epoch and the test split at the end (both sharded, counts summed with all_reduce).
``--powersgd RANK``: DDP's PowerSGD communication hook (torch.distributed.algorithms.
ddp_comm_hooks.powerSGD_hook; error feedback, warm start, ``--powersgd-start`` dense steps).
Written the way a PyTorch user writes it: tensors indexed by a permutation (no per-sample
DataLoader collation, which would only slow PyTorch down). Rank 0 writes OUT.json with
wall-clock (time.time) stamps: first step done, each epoch's end, the end.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

T_START = time.time()
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402  (standard library only)
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402


def build() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Conv2d(4, 8, 3), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(1152, 128), nn.ReLU(), nn.Linear(128, 10))


def load(kind: str):
    prefix = "train" if kind == "train" else "t10k"
    x = C._load_idx(os.path.join(C.FMNIST_DIR, f"{prefix}-images-idx3-ubyte.gz"))
    y = C._load_idx(os.path.join(C.FMNIST_DIR, f"{prefix}-labels-idx1-ubyte.gz"))
    x = torch.from_numpy((x.reshape(-1, 1, 28, 28) / np.float32(255)).astype(np.float32))
    return x, torch.from_numpy(y.astype(np.int64))


def accuracy(model, x, y, rank, size) -> float:
    model.eval()
    correct = torch.zeros(2, dtype=torch.float64)
    with torch.no_grad():
        xs, ys = x[rank::size], y[rank::size]
        for i in range(0, len(xs), 1000):
            correct[0] += (model(xs[i:i + 1000]).argmax(1) == ys[i:i + 1000]).sum()
        correct[1] = len(xs)
    dist.all_reduce(correct)
    model.train()
    return float(correct[0] / correct[1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--first-step-only", action="store_true")
    ap.add_argument("--test-as-validation", action="store_true",
                    help="train on all 60000 images and validate on the test split "
                         "(benchmarks/cluster.py, as benchmarks/rules.py does)")
    ap.add_argument("--powersgd", type=int, default=0, metavar="RANK",
                    help="register DDP's PowerSGD communication hook with this "
                         "matrix_approximation_rank (0: plain DDP)")
    ap.add_argument("--powersgd-start", type=int, default=10, metavar="STEPS",
                    help="PowerSGD's start_powerSGD_iter: dense all-reduce steps first")
    ap.add_argument("--steps-per-epoch", type=int, default=0,
                    help="train at most this many steps an epoch (0: all; smoke tests)")
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    x, y = load("train")
    x_te, y_te = load("test")
    if args.test_as_validation:
        x_tr, y_tr, x_val, y_val = x, y, x_te, y_te
    else:
        n_val = len(x) - int(len(x) * 0.8)
        x_tr, y_tr, x_val, y_val = x[:-n_val], y[:-n_val], x[-n_val:], y[-n_val:]
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(build())
    if args.powersgd:
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
        state = powersgd.PowerSGDState(process_group=None,
                                       matrix_approximation_rank=args.powersgd,
                                       start_powerSGD_iter=args.powersgd_start)
        model.register_comm_hook(state, powersgd.powerSGD_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    lossf = nn.CrossEntropyLoss()
    stamps = {"start": T_START, "epochs": [], "val_accuracy": []}
    batch = 64
    stamps["train_start"] = time.time()
    stamps["epoch_start"], stamps["epoch_train_end"] = [], []
    for epoch in range(args.epochs):
        stamps["epoch_start"].append(time.time())
        perm = torch.randperm(len(x_tr), generator=torch.Generator().manual_seed(epoch))
        shard = perm[rank::size]
        for b in range(0, len(shard), batch):
            if args.steps_per_epoch and b >= args.steps_per_epoch * batch:
                break
            idx = shard[b:b + batch]
            opt.zero_grad(set_to_none=True)
            lossf(model(x_tr[idx]), y_tr[idx]).backward()
            opt.step()
            if "first_step" not in stamps:
                stamps["first_step"] = time.time()
                if args.first_step_only:
                    break
        if args.first_step_only:
            break
        stamps["epoch_train_end"].append(time.time())
        stamps["val_accuracy"].append(accuracy(model, x_val, y_val, rank, size))
        stamps["epochs"].append(time.time())
    if not args.first_step_only:
        stamps["test_accuracy"] = accuracy(model, x_te, y_te, rank, size)
    stamps["end"] = time.time()
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump(stamps, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
