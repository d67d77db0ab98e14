"""``localsgd``: local SGD (periodic model averaging; Stich 2019, "Don't use large
mini-batches, use local SGD").

Every rank trains its own replica with its own optimizer on its share of each global
batch (loss averaged over its own samples) and every ``sync_every`` batches the replicas
are replaced by their average, weighted by the samples each rank trained on since the last
average (so uneven shards count each sample once). Each epoch ends with an average, so
validation, checkpoints and the final model use the averaged model. With
``sync_every=1`` and equal shards it makes exactly the updates of ``data``.

With ``group_size`` K > 1 a replica is a group of K ranks (``rules/groups.py``): they sum
their gradients every step and take the same local step; the averages run among the
groups' leaders and each group then takes its leader's weights.
"""
from __future__ import annotations

import numpy as np

from .. import distributed as dist
from ._p2p import Traffic, gather_states, local_state, pick_state, restore_local_state
from .base import Message, Rule
from .groups import WorkerGroup, check_group_size, layout_of


class LocalSGD(Rule):
    """Local steps, then an all-reduce average of the weights every ``sync_every`` batches.

    Args:
        sync_every: k, batches between two averages (1: every step).
        group_size: ranks per replica, training synchronously.

    Example:
        Trainer(model, SGD(model, lr=0.01, momentum=0.9), rule=LocalSGD(sync_every=8))
    """

    name = "localsgd"
    default_period = 8

    @classmethod
    def plan_label(cls, period, probability):
        return f"localsgd (every {period})"

    @classmethod
    def step_messages(cls, *, size, itemsize, period, probability):
        # every k steps: the weights and a sample count
        return [Message("weights" if period > 1 else "chunk", (size + 1) * itemsize,
                        1 / period, "allreduce")]

    def __init__(self, *, sync_every: int | None = None, group_size: int = 1):
        sync_every = self.default_period if sync_every is None else sync_every
        if isinstance(sync_every, bool) or int(sync_every) != sync_every or sync_every < 1:
            raise ValueError(f"localsgd: sync_every must be an integer >= 1, got {sync_every!r}")
        self.sync_every = int(sync_every)
        self.group_size = check_group_size(self.name, group_size)
        self._group: WorkerGroup | None = None
        self.traffic = Traffic()
        self.averages = 0
        self._states: list = []
        self._resume = None

    def bind(self, trainer, optimizer):
        n = trainer.model.parameters_flat().size
        self._buf = np.zeros(n + 1, trainer.model.dtype)
        self._steps = 0
        self._samples = 0
        if self.group_size > 1:
            self._group = WorkerGroup(layout_of(self.name, trainer.comm, self.group_size, 0),
                                      trainer.model)
        return optimizer

    def shard_of(self, comm):
        if self.group_size == 1:
            return comm.rank, comm.size
        order = layout_of(self.name, comm, self.group_size, 0).order
        return order.index(comm.rank), len(order)

    def loss_denominator(self, batch) -> int:
        if self._group is not None:
            return self._group.loss_denominator(batch)
        return len(batch.x)

    def begin(self, trainer) -> None:
        dist.broadcast_parameters(trainer.model, comm=trainer.comm)
        restore_local_state(trainer, pick_state(self.name, self._resume, trainer.comm))
        self._resume = None
        self._steps = 0
        self._samples = 0

    def step(self, trainer) -> None:
        samples = trainer.batch_samples
        if self._group is not None:
            samples = self._group.reduce_gradients(trainer)
        if samples:
            trainer.optimizer.step()
            self._samples += samples
        self._steps += 1  # every rank counts every global batch: the all-reduces stay in step
        if self._steps % self.sync_every == 0:
            self._average(trainer)

    def _average(self, trainer) -> None:
        comm = trainer.comm
        group = self._group
        if group is not None:
            comm = group.groups.leaders_comm if group.is_leader else None
        x = trainer.model.parameters_flat()
        if comm is not None and comm.size > 1:
            buf = self._buf
            np.multiply(x, self._samples, out=buf[:-1])
            buf[-1] = self._samples
            comm.allreduce_(buf, "sum")
            self.traffic.sent(buf)
            np.divide(buf[:-1], buf[-1], out=x)
            self.averages += 1
        if group is not None:
            group.share_weights(trainer)
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
        return f"LocalSGD(sync_every={self.sync_every}, group_size={self.group_size})"
