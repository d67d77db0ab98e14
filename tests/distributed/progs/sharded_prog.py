"""Sharded training state under mpiexec: every stage against dense ``data``, for several
optimizers, on the whole world and on a sub-communicator of one rank fewer; sharded
checkpoints resumed on the same and on another number of ranks. Rank 0 prints one JSON
line (its weights per case) for tests/distributed/test_sharded.py."""
from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile

import numpy as np

from distnn import distributed as dist
from distnn.data.base import ArrayDataset, Preprocess
from distnn.nn.activations import ReLU
from distnn.nn.containers import Add, Sequential
from distnn.nn.core import Dense, Flatten
from distnn.optim import get_optimizer
from distnn.rules import DataParallel
from distnn.training import Callback, Trainer
from distnn.training.stopping import TrainingCheckpoint

OPTIMIZERS = {
    "adam_residual": ("adam", dict(lr=1e-2)),  # on model("residual")
    "adam_clip": ("adam", dict(lr=1e-2, clip_grad_norm=0.05)),  # clipped every step
    "sgd_momentum": ("sgd", dict(lr=0.05, momentum=0.9, weight_decay=1e-3)),
    "sgd_nesterov": ("sgd", dict(lr=0.05, momentum=0.9, nesterov=True)),
    "adam": ("adam", dict(lr=1e-2)),
    "adamw": ("adamw", dict(lr=1e-2, weight_decay=0.05)),
    "rmsprop": ("rmsprop", dict(lr=1e-3, momentum=0.5, centered=True)),
    "nadam": ("nadam", dict(lr=1e-2)),
    "adadelta": ("adadelta", dict(lr=1.0, weight_decay=1e-3)),
}
STEPS = 20  # 2 epochs of 10 batches (9 of 11 samples, one of 2: a rank of 3 gets none)


def layers(kind: str = "mlp") -> list:
    if kind == "residual":  # a block whose layers are nested: one unit of stage 3
        return [Flatten(), Dense(7), ReLU(), Add([Dense(7), ReLU()], []), Dense(3)]
    # 6*7+7 + 7*5+5 + 5*3+3 = 107 parameters: not divisible by 2 or 3
    return [Flatten(), Dense(7), ReLU(), Dense(5), ReLU(), Dense(3)]


def model(kind: str = "mlp") -> Sequential:
    return Sequential(layers(kind), input_shape=(2, 3), dtype=np.float64, rng=0)


def sliced_model(comm, kind: str = "mlp") -> Sequential:
    """Built with this rank's slice only; the other ranks draw from other seeds, and
    rank 0's weights (the dense run's) are the ones kept all the same."""
    m = Sequential(layers(kind), dtype=np.float64)
    return dist.build_sliced(m, (2, 3), rng=0 if comm.rank == 0 else 100 + comm.rank,
                             comm=comm)


def dataset() -> ArrayDataset:
    rng = np.random.default_rng(7)
    x = rng.normal(size=(101, 2, 3))
    y = rng.integers(0, 3, size=101)
    return ArrayDataset(x, y, 3, preprocess=Preprocess(dtype=np.float64))


class Probe(Callback):
    """What a rank holds in the middle of training (after each step)."""

    def __init__(self):
        self.seen: dict = {}

    def on_batch_end(self, trainer, step, logs):
        opt, m = trainer.optimizer, trainer.model
        if hasattr(opt, "state_bytes"):
            self.seen = {**opt.state_bytes(), "params_flat": int(m._params_flat.size),
                         "placeholders": all(p.strides == (0,) * p.ndim
                                             for l in m.walk() for p in l.params.values()),
                         "grads_flat": int(m._grads_flat.size), "slice": opt.hi - opt.lo,
                         "calls": opt.allreduce_calls, "grad_norm": opt.grad_norm}


PROBES: dict = {}


def train(comm, opt: str, shard: int, epochs: int = 2, checkpoint: str | None = None,
          resume: str | None = None, bucket_size_mb: float = 0.0,
          sliced: bool = False) -> np.ndarray:
    kind = "residual" if opt.endswith("_residual") else "mlp"
    m = sliced_model(comm, kind) if sliced else model(kind)
    name, kw = OPTIMIZERS[opt]
    kw = dict(kw)
    clip = kw.pop("clip_grad_norm", None)
    probe = PROBES.setdefault((opt, shard, comm.size, bucket_size_mb, sliced), Probe())
    callbacks = [probe] + ([TrainingCheckpoint(checkpoint)] if checkpoint else [])
    rule = DataParallel(shard=shard, bucket_size_mb=bucket_size_mb)
    optimizer = get_optimizer(name, m, **kw)
    optimizer.clip_grad_norm = clip  # as distnn train's --clip_grad_norm sets it
    trainer = Trainer(m, optimizer, comm=comm, rule=rule, progress=False,
                      verbose=False, metrics=(), callbacks=callbacks)
    # 11 samples per global batch: uneven shards on 2 and 3 ranks
    # validation each epoch: stage 3 gathers the whole model for it, then drops it again
    trainer.fit(dataset(), epochs=epochs, global_batch_size=11, resume=resume,
                validation=dataset(), eval_batch_size=16)
    return m.parameters_flat().copy()


def main() -> None:
    world = dist.init()
    rank, size = world.rank, world.size
    smaller = world.split(0 if rank < size - 1 else 1, rank)
    out: dict = {"size": size, "cases": {}, "resume": {}}
    folder = world.bcast_obj(tempfile.mkdtemp() if rank == 0 else None)
    for opt in OPTIMIZERS:
        stages = (0, 1, 2, 3) if opt in ("sgd_momentum", "adam") else (0, 3)
        for stage in stages:
            w = train(world, opt, stage)
            same = world.allgather_obj(w.tobytes())
            out["cases"][f"{opt}/{stage}/{size}"] = {
                "w": w.tolist(), "ranks_agree": all(s == same[0] for s in same),
                "held": world.allgather_obj(PROBES[(opt, stage, size, 0.0, False)].seen)}
    # stage 3 on a model built sliced (build_sliced): every rank allocated its slice only
    out["sliced"] = {}
    for opt in ("adam", "sgd_momentum", "adam_residual"):
        for comm in (world, smaller):
            if comm is smaller and rank == size - 1:
                continue
            w = train(comm, opt, 3, sliced=True)
            out["sliced"][f"{opt}/{comm.size}"] = {
                "w": w.tolist(), "held": comm.allgather_obj(
                    PROBES[(opt, 3, comm.size, 0.0, True)].seen)}
        world.barrier()
    # sliced, checkpointed and resumed (a resume loads into the slice)
    ck = os.path.join(folder, "sliced.npz")
    train(world, "adam", 3, epochs=1, checkpoint=ck, sliced=True)
    out["sliced"]["adam/resumed"] = {"w": train(world, "adam", 3, resume=ck,
                                                sliced=True).tolist()}
    # stages 2 and 3 with units of several layers: 5e-4 MiB (65 float64s) makes the
    # Dense(7) and Dense(5) layers one unit (49 + 40 parameters), Dense(3) another
    out["bucketed"] = {}
    for opt in ("sgd_momentum", "adam"):
        for stage in (2, 3):
            w = train(world, opt, stage, bucket_size_mb=5e-4)
            out["bucketed"][f"{opt}/{stage}"] = {
                "w": w.tolist(), "calls": PROBES[(opt, stage, size, 5e-4, False)].seen["calls"],
                "calls_per_layer": PROBES[(opt, stage, size, 0.0, False)].seen["calls"]}
    # the whole run on size - 1 ranks (the others idle), and resumes across rank counts
    for opt in ("sgd_momentum", "adam"):
        for stage in (1, 2, 3):
            ck_small = os.path.join(folder, f"{opt}{stage}_small.npz")
            ck_world = os.path.join(folder, f"{opt}{stage}_world.npz")
            if rank < size - 1:
                w = train(smaller, opt, stage)
                out["cases"][f"{opt}/{stage}/{size - 1}"] = {"w": w.tolist(), "ranks_agree": True}
                train(smaller, opt, stage, epochs=1, checkpoint=ck_small)
            world.barrier()
            train(world, opt, stage, epochs=1, checkpoint=ck_world)
            key, resumed = f"{opt}/{stage}", out["resume"]
            # same rank count, and size - 1 -> size
            resumed[f"{key}/{size}->{size}"] = train(world, opt, stage, resume=ck_world).tolist()
            resumed[f"{key}/{size - 1}->{size}"] = train(world, opt, stage,
                                                         resume=ck_small).tolist()
            if rank < size - 1:  # size -> size - 1
                resumed[f"{key}/{size}->{size - 1}"] = train(smaller, opt, stage,
                                                             resume=ck_world).tolist()
            world.barrier()
    if rank == 0:  # one line (several ranks' long lines would interleave)
        out["files"] = sorted(os.listdir(folder))
        shutil.rmtree(folder, ignore_errors=True)
        print(json.dumps(out))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
