"""``localsgd``: local SGD (periodic model averaging; Stich 2019, "Don't use large
mini-batches, use local SGD").

Every rank trains its own replica with its own optimizer on its share of each global
batch (loss averaged over its own samples) and every ``sync_every`` batches the replicas
are replaced by their average, weighted by the samples each rank trained on since the last
average (so uneven shards count each sample once). Each epoch ends with an average, so
validation, checkpoints and the final model use the averaged model. With
``sync_every=1`` and equal shards it makes exactly the updates of ``data``.
"""
from __future__ import annotations

import numpy as np

from .. import distributed as dist
from ._p2p import Traffic, gather_states, local_state, pick_state, restore_local_state
from .base import Rule


class LocalSGD(Rule):
    """Local steps, then an all-reduce average of the weights every ``sync_every`` batches.

    Args:
        sync_every: k, batches between two averages (1: every step).

    Example:
        Trainer(model, SGD(model, lr=0.01, momentum=0.9), rule=LocalSGD(sync_every=8))
    """

    name = "localsgd"

    def __init__(self, *, sync_every: int | None = None):
        sync_every = 8 if sync_every is None else sync_every
        if isinstance(sync_every, bool) or int(sync_every) != sync_every or sync_every < 1:
            raise ValueError(f"localsgd: sync_every must be an integer >= 1, got {sync_every!r}")
        self.sync_every = int(sync_every)
        self.traffic = Traffic()
        self.averages = 0
        self._states: list = []
        self._resume = None

    def bind(self, trainer, optimizer):
        n = trainer.model.parameters_flat().size
        self._buf = np.zeros(n + 1, trainer.model.dtype)
        self._steps = 0
        self._samples = 0
        return optimizer

    def loss_denominator(self, batch) -> int:
        return len(batch.x)

    def begin(self, trainer) -> None:
        dist.broadcast_parameters(trainer.model, comm=trainer.comm)
        restore_local_state(trainer, pick_state(self.name, self._resume, trainer.comm))
        self._resume = None
        self._steps = 0
        self._samples = 0

    def step(self, trainer) -> None:
        if trainer.batch_samples:
            trainer.optimizer.step()
            self._samples += trainer.batch_samples
        self._steps += 1  # every rank counts every global batch: the all-reduces stay in step
        if self._steps % self.sync_every == 0:
            self._average(trainer)

    def _average(self, trainer) -> None:
        comm = trainer.comm
        x = trainer.model.parameters_flat()
        if comm.size > 1:
            buf = self._buf
            np.multiply(x, self._samples, out=buf[:-1])
            buf[-1] = self._samples
            comm.allreduce_(buf, "sum")
            self.traffic.sent(buf)
            np.divide(buf[:-1], buf[-1], out=x)
            self.averages += 1
        self._samples = 0

    def end_epoch(self, trainer, epoch: int) -> None:
        if self._steps % self.sync_every:
            self._average(trainer)
        self._steps = 0
        # the replicas are equal now; their optimizers are not
        self._states = gather_states(trainer, local_state(trainer, weights=False))

    def state_dict(self):
        return {"averages": self.averages, "ranks": self._states}

    def load_state_dict(self, state):
        self.averages = int(state.get("averages", 0))
        self._resume = state.get("ranks")

    def stats(self):
        out = self.traffic.as_dict()
        out["averages"] = float(self.averages)
        return out

    def __repr__(self) -> str:
        return f"LocalSGD(sync_every={self.sync_every})"
