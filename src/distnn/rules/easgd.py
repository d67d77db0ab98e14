"""``easgd``: Elastic Averaging SGD (Zhang, Choromanska & LeCun 2015; NNLO's and
Theano-MPI's ``EASGD``), asynchronous through a master or synchronous by all-reduce.

Every worker trains its own replica x_i with a local optimizer (``worker_optimizer``, or
the trainer's). Every ``sync_every`` batches (tau) it is pulled toward a centre x~ which is
pulled toward it, with the moving rate ``a = elastic_force * elastic_lr``
(``elastic_lr`` defaults to 1 / number of workers, the paper's beta = p * a)::

    worker:  x_i <- x_i - a * (x_i - x~)
    centre:  v <- elastic_momentum * v + a * (x_i - x~);   x~ <- x~ + v

Asynchronous (default): rank 0 is the master and holds x~; the workers (ranks 1..N-1)
share each global batch and exchange with it one at a time (the worker sends x_i, the
master answers with the x~ it used). Synchronous (``synchronous=True``): every rank is a
worker holding a copy of x~, and one all-reduce of the x_i updates all of them at once,
x~ <- x~ + v with v <- m * v + a * sum_i (x_i - x~).
Validation, checkpoints and the final model use the centre x~. With ``elastic_force=0``
the workers train independently.
"""
from __future__ import annotations

import contextlib

import numpy as np

from .. import distributed as dist
from .base import RuleArgumentError
from ._p2p import (MasterWorker, Traffic, gather_states, local_state, pick_state,
                   restore_local_state, swapped_weights)


class EASGD(MasterWorker):
    """Elastic averaging between worker replicas and a centre.

    Args:
        elastic_force: rho in [0, 1]; the moving rate is elastic_force * elastic_lr.
        elastic_lr: eta in (0, 1] (None: 1 / number of workers).
        elastic_momentum: momentum of the centre's moves, in [0, 1).
        worker_optimizer: optimizer name for the workers' local steps (None: the
            trainer's optimizer), built with the trainer's learning rate.
        sync_every: tau, local batches between two elastic exchanges.
        synchronous: all-reduce based synchronous EASGD instead of a master.
        group_size, masters: as for ``Downpour``.

    Example:
        Trainer(model, SGD(model, lr=0.01, momentum=0.9), rule=EASGD(sync_every=4))
    """

    name = "easgd"
    default_period = 4
    plan_order = 3

    def __init__(self, *, elastic_force: float = 0.9, elastic_lr: float | None = None,
                 elastic_momentum: float = 0.0, worker_optimizer: str | None = None,
                 sync_every: int | None = None, synchronous: bool = False,
                 group_size: int = 1, masters: int = 1):
        super().__init__(sync_every=sync_every, synchronous=synchronous, group_size=group_size,
                         masters=masters)
        if synchronous and self.group_size > 1:
            raise RuleArgumentError("group_size", f"easgd: group_size={group_size} groups the "
                                    "workers of a master; synchronous=True has none: drop one "
                                    "of them")
        if not 0 <= elastic_force <= 1:
            raise ValueError(f"easgd: elastic_force must be in [0, 1], got {elastic_force!r}")
        if elastic_lr is not None and not 0 < elastic_lr <= 1:
            raise ValueError(f"easgd: elastic_lr must be in (0, 1] (None: 1 / workers), got "
                             f"{elastic_lr!r}")
        if not 0 <= elastic_momentum < 1:
            raise ValueError(f"easgd: elastic_momentum must be in [0, 1), got "
                             f"{elastic_momentum!r}")
        self.elastic_force = float(elastic_force)
        self.elastic_lr = None if elastic_lr is None else float(elastic_lr)
        self.elastic_momentum = float(elastic_momentum)
        self.worker_optimizer = worker_optimizer
        self._velocity: np.ndarray | None = None
        self._centre: np.ndarray | None = None
        self._states: list = []
        self._resume = None

    # -- roles ---------------------------------------------------------------------------
    @property
    def min_ranks(self) -> int:
        return 1 if self.synchronous else super().min_ranks

    def shard_of(self, comm):
        if self.synchronous:
            return comm.rank, comm.size
        return super().shard_of(comm)

    def is_master(self, trainer) -> bool:
        return not self.synchronous and super().is_master(trainer)

    def moving_rate(self, comm) -> float:
        """a = elastic_force * elastic_lr, elastic_lr 1 / (workers of this rank's master)."""
        workers = comm.size if self.synchronous else self.n_workers(comm)
        lr = self.elastic_lr if self.elastic_lr is not None else 1.0 / max(workers, 1)
        return self.elastic_force * lr

    def bind(self, trainer, optimizer):
        optimizer = super().bind(trainer, optimizer)
        if self.worker_optimizer:
            from ..optim import get_optimizer
            optimizer = get_optimizer(self.worker_optimizer, trainer.model, lr=optimizer.lr)
        n = trainer.model.parameters_flat().size
        self._reply = np.zeros(n, trainer.model.dtype)
        self._velocity = np.zeros(n, trainer.model.dtype)
        return optimizer

    def begin(self, trainer) -> None:
        dist.broadcast_parameters(trainer.model, comm=trainer.comm)
        if self.synchronous and self._centre is None:
            self._centre = trainer.model.parameters_flat().copy()
        # a resumed run: every worker takes back its own replica and optimizer
        restore_local_state(trainer, pick_state(self.name, self._resume, trainer.comm))
        self._resume = None
        self._steps = 0

    # -- the local steps and the exchange ---------------------------------------------------
    def step(self, trainer) -> None:
        if not self.synchronous:
            super().step(trainer)
            return
        if trainer.batch_samples:
            trainer.optimizer.step()
        self._steps += 1  # every rank counts every global batch: the all-reduce stays in step
        if self._steps % self.sync_every == 0:
            self._elastic_allreduce(trainer)

    def worker_accumulate(self, trainer) -> None:
        trainer.optimizer.step()

    def worker_payload(self, trainer):
        return trainer.model.parameters_flat()

    def worker_reply_buffer(self, trainer):
        return self._reply

    def worker_apply_reply(self, trainer, centre) -> None:
        x = trainer.model.parameters_flat()
        x -= self.moving_rate(trainer.comm) * (x - centre)

    def master_apply(self, trainer, payloads):
        centre = trainer.model.parameters_flat()
        a = self.moving_rate(trainer.comm)
        replies = {}
        for worker, x, _ in payloads:
            replies[worker] = centre.copy()
            self._velocity *= self.elastic_momentum
            self._velocity += a * (x - centre)
            centre += self._velocity
        return replies

    # -- with several masters (rules/masters.py): a sub-master's centre is an elastic worker
    # of the top master's centre
    def sub_payload(self, trainer, synced):
        return trainer.model.parameters_flat()

    def top_apply(self, trainer, payloads):
        return self.master_apply(trainer, payloads)

    def sub_apply_reply(self, trainer, centre) -> None:
        lr = self.elastic_lr if self.elastic_lr is not None else 1.0 / self.masters
        x = trainer.model.parameters_flat()
        x -= self.elastic_force * lr * (x - centre)

    def _elastic_allreduce(self, trainer) -> None:
        comm = trainer.comm
        x = trainer.model.parameters_flat()
        total = x.copy()
        comm.allreduce_(total, "sum")
        self.traffic.messages += 1
        self.traffic.bytes += total.nbytes
        a = self.moving_rate(comm)
        centre = self._centre
        x -= a * (x - centre)
        self._velocity *= self.elastic_momentum
        self._velocity += a * (total - comm.size * centre)
        centre += self._velocity

    # -- epochs: validation and the final model use the centre ------------------------------
    def end_epoch(self, trainer, epoch: int) -> None:
        if not self.synchronous:
            super().end_epoch(trainer, epoch)
        self._states = gather_states(trainer, local_state(trainer, weights=True))

    def _centre_everywhere(self, trainer) -> np.ndarray:
        if self.synchronous:
            return self._centre
        centre = trainer.model.parameters_flat().copy()
        trainer.comm.bcast_(centre, 0)
        return centre

    @contextlib.contextmanager
    def evaluation_weights(self, trainer):
        with swapped_weights(trainer.model, self._centre_everywhere(trainer)):
            yield

    def end(self, trainer) -> None:
        trainer.model.parameters_flat()[...] = self._centre_everywhere(trainer)

    # -- state ------------------------------------------------------------------------------
    def state_dict(self):
        out = super().state_dict()
        out["velocity"] = self._velocity.copy()
        out["ranks"] = self._states
        if self.synchronous:
            out["centre"] = self._centre.copy()
        return out

    def load_state_dict(self, state):
        super().load_state_dict(state)
        if "velocity" in state:
            self._velocity[...] = state["velocity"]
        if self.synchronous and "centre" in state:
            self._centre = np.array(state["centre"], dtype=self._velocity.dtype)
        self._resume = state.get("ranks")

    def stats(self):
        out = super().stats()
        if self.synchronous:
            out = Traffic.as_dict(self.traffic)
        return out

    def __repr__(self) -> str:
        return (f"EASGD(elastic_force={self.elastic_force}, elastic_lr={self.elastic_lr}, "
                f"elastic_momentum={self.elastic_momentum}, "
                f"worker_optimizer={self.worker_optimizer!r}, sync_every={self.sync_every}, "
                f"synchronous={self.synchronous}, group_size={self.group_size}, "
                f"masters={self.masters})")
