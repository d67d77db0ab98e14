"""MPI test program for failure behaviour.

Usage: mpiexec -n N python fail_prog.py raise|mismatch
  raise:    rank 1 raises mid-training inside abort_on_error; the job must abort.
  mismatch: rank 1 builds a different model; DistributedOptimizer must raise everywhere.
  steps:    rank 1 has a longer dataset (more steps per epoch); Trainer.fit must raise
            everywhere before the first step.
"""
import sys

import numpy as np

from distnn import distributed as dist
from distnn.nn.containers import Sequential
from distnn.nn.core import Dense, Flatten
from distnn.optim import SGD

import common


def train_until_failure(comm) -> None:
    model = common.build_model("mlp", np.float64, seed=0)
    dist.broadcast_parameters(model, comm=comm)
    opt = dist.DistributedOptimizer(SGD(model, lr=0.1), model, comm=comm)
    x, y = common.data()
    for step in range(1000):
        if comm.rank == 1 and step == 3:
            raise ValueError("boom: simulated failure at step 3")
        _, d = common.cross_entropy(model.forward(x[:8], training=True), y[:8], 8)
        model.backward(d)
        opt.step()


def mismatched_models(comm) -> None:
    width = 16 if comm.rank != 1 else 17
    model = Sequential([Flatten(), Dense(width), Dense(common.CLASSES)],
                       input_shape=common.INPUT_SHAPE, dtype=np.float64, rng=0)
    dist.DistributedOptimizer(SGD(model, lr=0.1), model, comm=comm)


def mismatched_steps(comm) -> None:
    from distnn.data import load_dataset
    from distnn.training import Trainer
    samples = 64 if comm.rank != 1 else 96
    train = load_dataset("synthetic", input_shape=common.INPUT_SHAPE,
                         num_classes=common.CLASSES, num_samples=samples).train
    model = common.build_model("mlp", np.float64, seed=0)
    Trainer(model, SGD(model, lr=0.1), comm=comm, progress=False, verbose=False).fit(
        train, epochs=1, batch_size=8)


if __name__ == "__main__":
    comm = dist.init()
    if sys.argv[1] == "raise":
        with dist.abort_on_error(comm):
            train_until_failure(comm)
    elif sys.argv[1] == "steps":
        mismatched_steps(comm)
    else:
        mismatched_models(comm)
