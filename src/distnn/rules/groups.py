"""A worker that is a group of ranks (NNLO's n-processes): the K ranks train
synchronously, as the ``data`` rule does, and the group's leader (its first rank) takes
part in the rule's exchange (with a master, or with the other leaders) as one worker.

Each rank of a group trains on its share of the group's part of every global batch; the
loss is divided by the group's number of samples and the gradients are summed over the
group (the one ``distributed.Reducer``, op "sum", over the group's communicator), so a
group of K ranks with B samples each makes the updates of one worker with K·B samples
(docs/design.md §Gradient averaging). Every rank then takes the same local step (the
rule's), and after each exchange the leader's weights are broadcast to its group, so the
group's ranks hold the leader's weights and share its position in the batch schedule.
Which ranks make a group (host by host) is ``distributed.groups``'s.
"""
from __future__ import annotations

import numpy as np

from ..distributed import Reducer
from ..distributed.groups import GroupLayoutError, Groups, worker_groups
from .base import RuleArgumentError, whole_argument

__all__ = ["WorkerGroup", "check_group_size", "layout_of"]


def check_group_size(rule: str, group_size) -> int:
    return whole_argument(rule, "group_size", group_size, what=" (ranks per worker)")


def layout_of(rule: str, comm, group_size: int, first: int) -> Groups:
    """The worker groups of ``comm``'s ranks ``first`` and up (collective the first time);
    a host whose ranks do not make whole groups is refused as the rule's argument."""
    try:
        return worker_groups(comm, group_size, first)
    except GroupLayoutError as exc:
        raise RuleArgumentError("group_size", f"{rule}: {exc}") from None


class WorkerGroup:
    """This rank's place in its worker group, and the group's collectives.

    Args:
        groups: the layout (``distributed.groups.worker_groups``); this rank is in a group.
        model: the model, for the size and dtype of the gradient buffer.
    """

    def __init__(self, groups: Groups, model):
        self.groups = groups
        self.comm = groups.comm
        order = groups.order
        self._shares = [order.index(r) for r in groups.mine]
        self._n_shares = len(order)
        grads = model.gradients_flat()
        self._reducer = Reducer(grads, [("gradients", 0, grads.size)], groups.comm, op="sum",
                                bucket_size_mb=0, non_blocking=False)
        self._count = np.zeros(1, np.float64)
        self.reductions = 0

    @property
    def is_leader(self) -> bool:
        return self.groups.is_leader

    def loss_denominator(self, batch) -> int:
        """The group's samples in ``batch`` (its ranks' ``np.array_split`` shares)."""
        q, r = divmod(batch.global_size, self._n_shares)
        return sum(q + (share < r) for share in self._shares)

    def reduce_gradients(self, trainer) -> int:
        """Sum the gradients over the group, in place; return the group's sample count."""
        self._reducer.reduce_(trainer.model.gradients_flat())
        self._count[0] = trainer.batch_samples
        self.comm.allreduce_(self._count, "sum")
        self.reductions += 1
        return int(self._count[0])

    def share_weights(self, trainer) -> None:
        """Every rank of the group takes its leader's weights."""
        self.comm.bcast_(trainer.model.parameters_flat(), 0)

    def share_array(self, arr: np.ndarray) -> None:
        self.comm.bcast_(arr, 0)


class GroupedReplicas:
    """What a rule whose replicas may each be ``group_size`` ranks training synchronously
    (localsgd, gossip) shares: each replica's data shard, its loss denominator (its own
    samples) and, bound, this rank's ``WorkerGroup`` (None with one rank a replica). Mix
    it in before ``Rule``."""

    name: str
    group_size: int
    _group: WorkerGroup | None

    def shard_of(self, comm):
        if self.group_size == 1:
            return comm.rank, comm.size
        order = layout_of(self.name, comm, self.group_size, 0).order
        return order.index(comm.rank), len(order)

    def loss_denominator(self, batch) -> int:
        if self._group is not None:
            return self._group.loss_denominator(batch)
        return len(batch.x)

    def _bind_group(self, trainer) -> None:
        if self.group_size > 1:
            self._group = WorkerGroup(layout_of(self.name, trainer.comm, self.group_size, 0),
                                      trainer.model)

    def _local_step(self, trainer) -> int:
        """This replica's optimizer step on its batch (the group's gradients summed first);
        none when the replica had no samples. Returns its sample count."""
        samples = trainer.batch_samples
        if self._group is not None:
            samples = self._group.reduce_gradients(trainer)
        if samples:
            trainer.optimizer.step()
        return samples
