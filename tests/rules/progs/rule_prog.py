"""Runs training jobs under one rule each on a tiny float64 softmax model and writes what
the tests of distnn.rules check: weights (initial, final, each rank's last local ones), the
rule's counters, the history. Usage: rule_prog.py OUT_DIR JOBS_JSON (a list of jobs)."""
from __future__ import annotations

import json
import sys
import time

import numpy as np

from distnn import distributed as dist
from distnn.data import ArrayDataset, Preprocess
from distnn.nn.containers import Sequential
from distnn.nn.core import Dense
from distnn.optim import SGD
from distnn.rules import get_rule
from distnn.training import Callback, Trainer

FEATURES, CLASSES = 6, 4


def data(n: int, seed: int = 5):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, FEATURES))
    y = rng.integers(0, CLASSES, size=n)
    return x, y


class Record(Callback):
    """Keeps this rank's weights after its last step and slows one rank down."""

    def __init__(self, slow_rank: int | None, factor: float, fail_rank: int | None = None):
        self.slow_rank, self.factor, self.fail_rank = slow_rank, factor, fail_rank
        self.local = None

    def on_batch_begin(self, trainer, step):
        self._t0 = time.perf_counter()

    def on_batch_end(self, trainer, step, logs):
        if trainer.comm.rank == self.slow_rank:
            time.sleep((self.factor - 1) * (time.perf_counter() - self._t0) + 2e-3)
        self.local = trainer.model.parameters_flat().copy()
        if trainer.comm.rank == self.fail_rank and step == 3:
            raise RuntimeError("worker failed on purpose")


def run(job: dict, comm, out: str) -> None:
    model = Sequential([Dense(CLASSES)], input_shape=(FEATURES,), dtype=np.float64,
                       rng=job.get("seed", 0))
    x, y = data(job["n"])
    ds = ArrayDataset(x, y, CLASSES, preprocess=Preprocess(dtype=np.float64, normalize=False))
    opt = SGD(model, lr=job.get("lr", 0.1), momentum=job.get("momentum", 0.0))
    rule = get_rule(job["rule"], **job.get("options", {}))
    record = Record(job.get("slow_rank"), job.get("slow_factor", 5.0), job.get("fail_rank"))
    trainer = Trainer(model, opt, comm=comm, rule=rule, callbacks=[record], progress=False,
                      verbose=False, seed=job.get("seed", 0))
    initial = model.parameters_flat().copy()
    if job.get("kill_rank") == comm.rank:  # dies as a lost host's process does: SIGKILL
        import os
        import signal
        import threading
        with open(f"{out}/pid.rank{comm.rank}", "w") as f:
            f.write(str(os.getpid()))
        threading.Timer(job.get("kill_after", 1.0),
                        lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
    checkpoint = job.get("checkpoint")
    if checkpoint:
        from distnn.training import TrainingCheckpoint
        trainer.callbacks.append(TrainingCheckpoint(checkpoint, 1))
    trainer.fit(ds, epochs=job.get("epochs", 1), batch_size=job.get("batch", 4),
                shuffle=job.get("shuffle", False), resume=job.get("resume"))
    name = f"{out}/{job['name']}.rank{comm.rank}"
    np.savez(name + ".npz", initial=initial, final=model.parameters_flat(),
             local=record.local if record.local is not None else np.zeros(0))
    with open(name + ".json", "w") as f:
        json.dump({"stats": rule.stats(), "history": trainer.history.records,
                   "size": comm.size}, f)


def serve(run_job) -> None:
    """Run every job of argv's JSON list with ``run_job(job, comm, out_dir)``, a failure on
    one rank aborting all (the test programs of this folder share this loop)."""
    out, jobs = sys.argv[1], json.loads(sys.argv[2])
    comm = dist.init()
    with dist.abort_on_error(comm):
        for job in jobs:
            run_job(job, comm, out)


if __name__ == "__main__":
    serve(run)
