"""Runs fedavg jobs on rule_prog's tiny float64 softmax model and writes, per job and rank,
the initial and final weights, the clients of each round and the dropped ones.
A job's "fail": [round, client] makes that client raise in that round.
Usage: fedavg_prog.py OUT_DIR JOBS_JSON."""
from __future__ import annotations

import json
import sys

import numpy as np
from rule_prog import CLASSES, FEATURES, data

from distnn import distributed as dist
from distnn.data import ArrayDataset, Preprocess
from distnn.nn.containers import Sequential
from distnn.nn.core import Dense
from distnn.optim import SGD
from distnn.rules.fedavg import FedAvg
from distnn.training import Trainer


class Failing(FedAvg):
    """A client that raises in one round, as a crashing client would."""

    def __init__(self, fail, **options):
        super().__init__(**options)
        self.fail = tuple(fail) if fail else None

    def train_client(self, trainer, client, round, w_global):
        if (round, client) == self.fail:
            trainer.model.forward(self.parts[client][0][:2], training=True)  # mid-round
            raise RuntimeError("client lost its connection")
        return super().train_client(trainer, client, round, w_global)


def main() -> None:
    out, jobs = sys.argv[1], json.loads(sys.argv[2])
    comm = dist.init()
    with dist.abort_on_error(comm):
        for job in jobs:
            model = Sequential([Dense(CLASSES)], input_shape=(FEATURES,), dtype=np.float64,
                               rng=0)
            x, y = data(job["n"])
            ds = ArrayDataset(x, y, CLASSES,
                              preprocess=Preprocess(dtype=np.float64, normalize=False))
            rule = Failing(job.get("fail"), **job["options"])
            trainer = Trainer(model, SGD(model, lr=job["lr"], momentum=job["momentum"]),
                              comm=comm, rule=rule, progress=False, verbose=False,
                              seed=job["seed"])
            initial = model.parameters_flat().copy()
            trainer.fit(ds, epochs=job["epochs"], batch_size=job["batch"], shuffle=False)
            name = f"{out}/{job['name']}.rank{comm.rank}"
            np.savez(name + ".npz", initial=initial, final=model.parameters_flat(),
                     local=np.zeros(0))
            with open(name + ".json", "w") as f:
                json.dump({"participants": rule.participants, "dropped": rule.dropped,
                           "stats": rule.stats()}, f)


if __name__ == "__main__":
    main()
