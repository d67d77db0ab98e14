"""SINGA's distributed CNN example (examples/cnn: train_mpi.py + train_cnn.py, model/cnn.py)
in distnn's words: the same model, optimizer, augmentation, partitioning, metrics and log
lines, with ``from distnn.torch import opt`` in place of ``from singa import opt`` and the
model written as a torch module. On Fashion-MNIST (MNIST's file format; MNIST itself with
``--data mnist``).

    mpiexec -n 2 python examples/singa_mnist_cnn.py cnn mnist            # SINGA's command
    mpiexec -n 2 python examples/singa_mnist_cnn.py -d half              # fp16 all-reduce
    python examples/singa_mnist_cnn.py -m 1 --steps 50                   # a quick look

Prints SINGA's lines per epoch and a final ``RESULT {...}`` JSON line (benchmarks/singa_cnn.py
reads it).
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch
import torch.nn.functional as F

from distnn.data import RandomCrop, RandomFlip, load_dataset
from distnn.torch import opt


class CNN(torch.nn.Module):
    """SINGA's model/cnn.py: conv 20 (5x5, ReLU), max-pool 2, conv 50 (5x5, ReLU), max-pool 2,
    linear 500, ReLU, linear classes."""

    def __init__(self, num_classes=10, num_channels=1):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(num_channels, 20, 5)
        self.conv2 = torch.nn.Conv2d(20, 50, 5)
        self.linear1 = torch.nn.Linear(50 * 4 * 4, 500)
        self.linear2 = torch.nn.Linear(500, num_classes)

    def forward(self, x):
        y = F.max_pool2d(F.relu(self.conv1(x)), 2, 2)
        y = F.max_pool2d(F.relu(self.conv2(y)), 2, 2)
        return self.linear2(F.relu(self.linear1(torch.flatten(y, 1))))


# SINGA's augmentation: symmetric padding by 4, a random 28x28 crop, a random flip
AUGMENT = [RandomCrop(4, padding_mode="symmetric"), RandomFlip(0.5)]


def augmentation(x, rng):
    for transform in AUGMENT:
        x = transform(x, rng)
    return x


def partition(global_rank, world_size, *arrays):
    """SINGA's: contiguous equal blocks, the remainder left out."""
    out = []
    for a in arrays:
        per_rank = a.shape[0] // world_size
        out.append(a[global_rank * per_rank:(global_rank + 1) * per_rank])
    return out


def reduce_variable(variable, sgd):
    """SINGA's: sum a NumPy metric over the ranks with all_reduce + wait."""
    reducer = torch.from_numpy(np.array(variable, dtype=np.float64).reshape(-1))
    sgd.all_reduce(reducer)
    sgd.wait()
    return reducer.numpy()


def run(args):
    torch.set_num_threads(1)
    torch.manual_seed(0)
    np.random.seed(0)
    sgd = opt.SGD(lr=args.lr, momentum=0.9, weight_decay=1e-5)
    sgd = opt.DistOpt(sgd)
    rank, world_size = sgd.global_rank, sgd.world_size

    data = "fashion_mnist" if args.data == "mnist" and not args.real_mnist else args.data
    splits = load_dataset(data, path=args.data_path)
    train_x, train_y = splits.train.arrays()
    val_x, val_y = splits.test.arrays()
    train_x, train_y, val_x, val_y = partition(rank, world_size, train_x, train_y, val_x,
                                               val_y)
    model = CNN(num_classes=10, num_channels=train_x.shape[1])
    # the same starting weights everywhere: their average over the ranks, as SINGA's
    # distributed-training guide synchronizes them (all_reduce, then divide)
    with torch.no_grad():
        for p in model.parameters():
            sgd.all_reduce(p.data)
        sgd.wait()
        for p in model.parameters():
            p.div_(world_size)

    batch_size = args.batch_size
    num_train_batch = train_x.shape[0] // batch_size
    num_val_batch = val_x.shape[0] // batch_size
    if args.steps:
        num_train_batch = min(num_train_batch, args.steps)
    idx = np.arange(train_x.shape[0], dtype=np.int32)
    rng = np.random.default_rng([0, rank])
    update = {"plain": sgd.backward_and_update, "half": sgd.backward_and_update_half,
              "partialUpdate": sgd.backward_and_partial_update,
              "sparseTopK": lambda loss: sgd.backward_and_sparse_update(
                  loss, topK=True, spars=args.spars),
              "sparseThreshold": lambda loss: sgd.backward_and_sparse_update(
                  loss, topK=False, spars=args.spars)}[args.dist_option]
    epoch_times, train_times, accuracies = [], [], []
    for epoch in range(args.max_epoch):
        start = time.perf_counter()
        np.random.shuffle(idx)
        if rank == 0:
            print(f"Starting Epoch {epoch}:", flush=True)
        train_correct = np.zeros(1)
        train_loss = np.zeros(1)
        model.train()
        for b in range(num_train_batch):
            ids = idx[b * batch_size:(b + 1) * batch_size]
            x = augmentation(train_x[ids].copy(), rng)
            y = torch.from_numpy(train_y[ids])
            out = model(torch.from_numpy(x))
            loss = F.cross_entropy(out, y)
            update(loss)
            train_correct += int((out.argmax(1) == y).sum())
            train_loss += float(loss.detach())
        train_time = time.perf_counter() - start
        train_correct = reduce_variable(train_correct, sgd)
        train_loss = reduce_variable(train_loss, sgd)
        if rank == 0:
            print("Training loss = %f, training accuracy = %f" % (
                train_loss[0], train_correct[0] / (num_train_batch * batch_size * world_size)),
                flush=True)
        model.eval()
        test_correct = np.zeros(1)
        with torch.no_grad():
            for b in range(num_val_batch):
                x = torch.from_numpy(val_x[b * batch_size:(b + 1) * batch_size])
                y = torch.from_numpy(val_y[b * batch_size:(b + 1) * batch_size])
                test_correct += int((model(x).argmax(1) == y).sum())
        test_correct = reduce_variable(test_correct, sgd)
        accuracy = test_correct[0] / (num_val_batch * batch_size * world_size)
        elapsed = time.perf_counter() - start
        if rank == 0:
            print("Evaluation accuracy = %f, Elapsed Time = %fs" % (accuracy, elapsed),
                  flush=True)
        epoch_times.append(elapsed)
        train_times.append(train_time)
        accuracies.append(float(accuracy))
    mean_train = reduce_variable(train_times, sgd) / world_size
    if rank == 0:
        print("RESULT " + json.dumps({
            "ranks": world_size, "epochs": args.max_epoch, "batch_size": batch_size,
            "steps_per_epoch": num_train_batch, "dist_option": args.dist_option,
            "dataset": data, "accuracy": accuracies[-1], "accuracies": accuracies,
            "train_seconds": [float(t) for t in mean_train],
            "epoch_seconds": epoch_times}), flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description="SINGA's CNN example on distnn")
    parser.add_argument("model", nargs="?", choices=["cnn"], default="cnn")
    parser.add_argument("data", nargs="?", choices=["mnist", "fashion_mnist"],
                        default="mnist", help="mnist means Fashion-MNIST unless --real_mnist")
    parser.add_argument("-m", "--max-epoch", type=int, default=10, dest="max_epoch")
    parser.add_argument("-b", "--batch-size", type=int, default=64, dest="batch_size")
    parser.add_argument("-l", "--learning-rate", type=float, default=0.005, dest="lr")
    parser.add_argument("-d", "--dist-option", default="plain", dest="dist_option",
                        choices=["plain", "half", "partialUpdate", "sparseTopK",
                                 "sparseThreshold"])
    parser.add_argument("-s", "--sparsification", type=float, default=0.05, dest="spars",
                        help="sparseTopK: fraction sent; sparseThreshold: |g| threshold")
    parser.add_argument("--steps", type=int, default=0,
                        help="at most this many steps per epoch (0: all)")
    parser.add_argument("--real_mnist", action="store_true")
    parser.add_argument("--data_path", default=None)
    run(parser.parse_args(argv))


if __name__ == "__main__":
    main()
