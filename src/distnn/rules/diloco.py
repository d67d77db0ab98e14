"""``diloco``: DiLoCo (Douillard et al. 2023, "DiLoCo: Distributed Low-Communication
Training of Language Models").

Every rank trains its own replica with its own *inner* optimizer (AdamW by default, at the
run's learning rate) on its share of each global batch (loss averaged over its own
samples). Every ``sync_every`` batches (H, the inner steps of a round) the ranks make the
*outer* step together: the average over the ranks of (the round's start weights - the
weights now) is an outer gradient, applied to the start weights by Nesterov SGD (outer
learning rate 0.7, momentum 0.9, the paper's); every rank then holds the new start
weights, equal on all ranks, and the next round begins from them. Each epoch ends with an
outer step (over the inner steps since the last one), so validation, checkpoints and the
final model use weights every rank shares. Each rank's inner optimizer keeps its state
across rounds (the paper's workers do).

With ``outer_lr=1``, ``outer_momentum=0`` a round's outer step is plain averaging of the
replicas (local SGD with the inner optimizer); with one rank and ``sync_every=1`` too, it
is the inner optimizer's own training.
"""
from __future__ import annotations

import numpy as np

from ..optim import OPTIMIZERS, get_optimizer, sgd_update_
from ._p2p import LocalReplicas
from .base import Message, RuleArgumentError, whole_argument


class DiLoCo(LocalReplicas):
    """H inner steps of each rank's own optimizer, then one outer Nesterov step on the
    average of the ranks' moves.

    Args:
        sync_every: H, inner steps (batches) of a round.
        outer_lr: learning rate of the outer Nesterov SGD, > 0.
        outer_momentum: its momentum, in [0, 1).
        inner_optimizer: name of each rank's inner optimizer (``distnn.optim``): the
            trainer's own when it is of that kind, else one built at the trainer's learning
            rate; ``"none"``: the trainer's own optimizer whatever its kind.

    Example:
        Trainer(model, SGD(model, lr=1e-3), rule=DiLoCo(sync_every=50))
    """

    name = "diloco"
    default_period = 50
    plan_format = "diloco (every {period})"
    plan_order = 6

    @classmethod
    def step_messages(cls, *, size, itemsize, period, probability):
        # every H steps: each rank's move since the round's start, all-reduced
        return [Message("weights" if period > 1 else "chunk", size * itemsize, 1 / period,
                        "allreduce")]

    def __init__(self, *, sync_every: int | None = None, outer_lr: float = 0.7,
                 outer_momentum: float = 0.9, inner_optimizer: str = "adamw"):
        self.sync_every = whole_argument(self.name, "sync_every", sync_every,
                                         what=" (H, inner steps of a round)",
                                         default=self.default_period)
        if isinstance(outer_lr, bool) or not isinstance(outer_lr, (int, float)) \
                or not outer_lr > 0:
            raise RuleArgumentError("outer_lr", f"diloco: outer_lr must be a number > 0, got "
                                    f"{outer_lr!r}")
        if isinstance(outer_momentum, bool) or not isinstance(outer_momentum, (int, float)) \
                or not 0 <= outer_momentum < 1:
            raise RuleArgumentError("outer_momentum", f"diloco: outer_momentum must be in "
                                    f"[0, 1), got {outer_momentum!r}")
        names = ("none", *sorted(OPTIMIZERS))
        if not isinstance(inner_optimizer, str) or inner_optimizer.lower() not in names:
            raise RuleArgumentError("inner_optimizer", f"diloco: inner_optimizer must be one "
                                    f"of {', '.join(names)}, got {inner_optimizer!r}")
        self.outer_lr, self.outer_momentum = float(outer_lr), float(outer_momentum)
        self.inner_optimizer = inner_optimizer.lower()
        super().__init__("outer_steps")
        self._steps = 0

    def bind(self, trainer, optimizer):
        inner = OPTIMIZERS.get(self.inner_optimizer)
        if self.inner_optimizer != "none" and type(optimizer) is not inner:
            # another kind than the trainer's: a new one at its learning rate (the trainer's
            # own, of that kind, keeps its hyper-parameters)
            optimizer = get_optimizer(self.inner_optimizer, trainer.model, lr=optimizer.lr)
        n = trainer.model.parameters_flat().size
        self._start = np.zeros(n, trainer.model.dtype)
        self._delta = np.zeros(n, trainer.model.dtype)
        self._momentum = np.zeros(n, trainer.model.dtype)
        self._first = True
        return optimizer

    def loss_denominator(self, batch) -> int:
        return len(batch.x)  # each rank steps on its own samples' mean

    def begin(self, trainer) -> None:
        state = self.resume_replica(trainer)
        if state and "outer_momentum_buffer" in state:
            self._momentum[...] = state["outer_momentum_buffer"]
            self._first = False
        self._start[...] = trainer.model.parameters_flat()
        self._steps = 0

    def step(self, trainer) -> None:
        if trainer.batch_samples:
            trainer.optimizer.step()
        self._steps += 1  # every rank counts every global batch: the outer steps stay in step
        if self._steps % self.sync_every == 0:
            self._outer_step(trainer)

    def _outer_step(self, trainer) -> None:
        """start <- Nesterov SGD step of start along mean over ranks (start - x); x <- start
        (collective)."""
        x, comm = trainer.model.parameters_flat(), trainer.comm
        np.subtract(self._start, x, out=self._delta)
        if comm.size > 1:
            comm.allreduce_(self._delta, "sum")
            self.traffic.sent(self._delta)
            self._delta /= comm.size
        sgd_update_(self._start, self._delta, self._momentum, lr=self.outer_lr,
                    momentum=self.outer_momentum, nesterov=self.outer_momentum > 0,
                    first_step=self._first)
        self._first = False
        x[...] = self._start
        self.outer_steps += 1

    def end_epoch(self, trainer, epoch: int) -> None:
        if self._steps % self.sync_every:
            self._outer_step(trainer)
        self._steps = 0
        self.keep_states(trainer, outer_momentum_buffer=self._momentum.copy())

    def __repr__(self) -> str:
        return (f"DiLoCo(sync_every={self.sync_every}, outer_lr={self.outer_lr}, "
                f"outer_momentum={self.outer_momentum}, "
                f"inner_optimizer={self.inner_optimizer!r})")
