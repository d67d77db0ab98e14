"""Runs --parallel partial jobs on sklearn's digits (float64 softmax regression, no shuffle)
and writes what tests/rules/test_partial.py checks: every rank's weights after every step,
the final weights, the rule's counters and position. Usage: partial_prog.py OUT JOBS_JSON."""
from __future__ import annotations

import json
import sys

import numpy as np

from distnn import distributed as dist
from distnn.data import load_dataset
from distnn.nn.containers import Sequential
from distnn.nn.core import Dense, Flatten
from distnn.optim import SGD
from distnn.rules import PartialUpdate
from distnn.training import Callback, Trainer, TrainingCheckpoint

CLASSES = 10


def digits():
    """The training split the tests use (the last 20% held out, as the command does)."""
    return load_dataset("digits", dtype=np.float64, validation_split=0.2).train


class Steps(Callback):
    """This rank's weights after every step (after the rule's chunk average)."""

    def __init__(self):
        self.weights = []

    def on_batch_end(self, trainer, step, logs):
        self.weights.append(trainer.model.parameters_flat().copy())


def run(job: dict, comm, train, out: str) -> None:
    model = Sequential([Flatten(), Dense(CLASSES)], input_shape=train.input_shape,
                       dtype=np.float64, rng=job.get("seed", 0))
    opt = SGD(model, lr=job["lr"], momentum=job["momentum"])
    rule = PartialUpdate(chunks=job["chunks"])
    steps = Steps()
    callbacks = [steps]
    if job.get("checkpoint"):
        callbacks.append(TrainingCheckpoint(job["checkpoint"], 1))
    trainer = Trainer(model, opt, comm=comm, rule=rule, callbacks=callbacks, progress=False,
                      verbose=comm.rank == 0, seed=0)
    initial = model.parameters_flat().copy()
    trainer.fit(train, epochs=job["epochs"], global_batch_size=job["gbs"], shuffle=False,
                resume=job.get("resume"))
    name = f"{out}/{job['name']}.rank{comm.rank}"
    np.savez(name + ".npz", initial=initial, final=model.parameters_flat(),
             steps=np.array(steps.weights) if steps.weights else np.zeros((0, initial.size)))
    with open(name + ".json", "w") as f:
        json.dump({"stats": rule.stats(), "position": rule.position, "size": comm.size,
                   "steps_per_epoch": trainer.steps_per_epoch}, f)


def main() -> None:
    out, jobs = sys.argv[1], json.loads(sys.argv[2])
    comm = dist.init()
    with dist.abort_on_error(comm):
        train = digits()
        for job in jobs:
            run(job, comm, train, out)


if __name__ == "__main__":
    main()
