"""``downpour``: asynchronous parameter server (Downpour SGD, Dean et al. 2012; NNLO's
default mode).

Rank 0, the master, holds the weights and the optimizer (the trainer's). The workers
(ranks 1..N-1) share each global batch among themselves; every ``sync_every`` batches a
worker sends the sum of its gradients since its last message and receives the master's
weights back. The master applies each message as it arrives (one optimizer step per
message), or with ``synchronous`` one step per round with the sample-weighted mean of
every worker's message (with ``sync_every=1`` that is exactly ``data`` on the workers).
"""
from __future__ import annotations

from .. import distributed as dist
from ._p2p import MasterWorker


class Downpour(MasterWorker):
    """Asynchronous SGD through a master (rank 0) that owns the weights and optimizer.

    Args:
        sync_every: batches a worker trains (accumulating gradients, weights fixed)
            between two messages to the master.
        synchronous: the master waits for one message from every worker each round.
        group_size: ranks per worker, training synchronously (``rules/groups.py``).
        masters: sub-masters under a top master (``rules/masters.py``; 1: one master).

    Example:
        Trainer(model, SGD(model, lr=0.01, momentum=0.9), rule=Downpour(sync_every=1))
    """

    name = "downpour"
    plan_order = 4

    def begin(self, trainer) -> None:
        dist.broadcast_parameters(trainer.model, comm=trainer.comm)

    def master_apply(self, trainer, payloads):
        grads = trainer.model.gradients_flat()
        if len(payloads) == 1:
            grads[...] = payloads[0][1]
        else:
            total = sum(s for _, _, s in payloads)
            grads[...] = 0
            for _, g, s in payloads:
                grads += g * (s / total)
        trainer.optimizer.step()
        weights = trainer.model.parameters_flat()
        return {w: weights for w, _, _ in payloads}

    # -- with several masters (rules/masters.py): a sub-master sends how far its weights
    # moved since its last exchange, the top master adds 1/M of it to its own (the top's
    # weights move as the mean of the sub-masters' trajectories: M sub-masters, each with
    # its own optimizer, would otherwise step M times as far as one master)
    def sub_payload(self, trainer, synced):
        return trainer.model.parameters_flat() - synced

    def top_apply(self, trainer, payloads):
        weights = trainer.model.parameters_flat()
        for _, delta, _ in payloads:
            weights += delta / self.masters
        return {sub: weights for sub, _, _ in payloads}

    def sub_apply_reply(self, trainer, reply) -> None:
        trainer.model.parameters_flat()[...] = reply

    def end_epoch(self, trainer, epoch: int) -> None:
        super().end_epoch(trainer, epoch)
        # The workers' weights are a copy of the master's: refresh them for validation.
        trainer.comm.bcast_(trainer.model.parameters_flat(), 0)

    def end(self, trainer) -> None:
        trainer.comm.bcast_(trainer.model.parameters_flat(), 0)

    def __repr__(self) -> str:
        return (f"Downpour(sync_every={self.sync_every}, synchronous={self.synchronous}, "
                f"group_size={self.group_size}, masters={self.masters})")
