"""``gem``: Gradient Energy Matching (Hermans & Louppe, arXiv:1805.08469; NNLO's ``gem``).

Asynchronous workers push gradients to a master (rank 0) like ``downpour``; the master
rescales each one so that the movement of the central weights matches the "energy" of
a momentum SGD run instead of piling the implicit momentum of staleness on top of it.

For a message of worker i with gradient g (the sum of its last ``sync_every`` batches):

* proxy:  m_i <- mu * m_i + eta * g, the momentum worker i would have on its own;
* staleness: d_i = |w - w_i|, how far the central weights w moved since they were sent
  to worker i (the momentum asynchrony already adds);
* factor: pi = clip((kappa * |m_i| - d_i) / (eta * |g| + eps), 0, kappa / (1 - mu)),
  element-wise, and w <- w - pi * eta * g.

With one worker d_i = 0 and the steps have the size of momentum SGD's (kappa = 1).
``eta`` is ``gem_lr`` or, when None, the trainer's scheduled learning rate.
"""
from __future__ import annotations

import numpy as np

from .. import distributed as dist
from ._p2p import MasterWorker

EPS = 1e-12


class GEM(MasterWorker):
    """Asynchronous SGD with per-parameter rescaling by gradient energy matching.

    Args:
        gem_lr: eta (None: the optimizer's learning rate, as schedules set it).
        gem_momentum: mu of the momentum proxy, in [0, 1).
        gem_kappa: kappa > 0, the proxy amplification.
        sync_every, synchronous, group_size: as for ``Downpour``.

    Example:
        Trainer(model, SGD(model, lr=0.01), rule=GEM(gem_momentum=0.9))
    """

    name = "gem"

    def __init__(self, *, gem_lr: float | None = None, gem_momentum: float = 0.9,
                 gem_kappa: float = 1.0, sync_every: int | None = None,
                 synchronous: bool = False, group_size: int = 1):
        super().__init__(sync_every=sync_every, synchronous=synchronous, group_size=group_size)
        if gem_lr is not None and not (np.isfinite(gem_lr) and gem_lr > 0):
            raise ValueError(f"gem: gem_lr must be a number > 0 (or None: the optimizer's "
                             f"learning rate), got {gem_lr!r}")
        if not 0 <= gem_momentum < 1:
            raise ValueError(f"gem: gem_momentum must be in [0, 1), got {gem_momentum!r}")
        if not gem_kappa > 0:
            raise ValueError(f"gem: gem_kappa must be > 0, got {gem_kappa!r}")
        self.gem_lr = None if gem_lr is None else float(gem_lr)
        self.gem_momentum = float(gem_momentum)
        self.gem_kappa = float(gem_kappa)
        self._moments: dict[int, np.ndarray] = {}

    def begin(self, trainer) -> None:
        dist.broadcast_parameters(trainer.model, comm=trainer.comm)
        self._sent = {}

    def master_apply(self, trainer, payloads):
        w = trainer.model.parameters_flat()
        eta = self.gem_lr if self.gem_lr is not None else float(trainer.lr)
        mu, kappa = self.gem_momentum, self.gem_kappa
        for worker, g, _ in payloads:
            m = self._moments.get(worker)
            if m is None:
                m = self._moments[worker] = np.zeros_like(w)
            m *= mu
            m += eta * g
            sent = self._sent.get(worker)
            stale = np.abs(w - sent) if sent is not None else 0.0
            step = eta * np.abs(g)
            pi = (kappa * np.abs(m) - stale) / (step + EPS)
            np.clip(pi, 0.0, kappa / (1.0 - mu), out=pi)
            w -= pi * eta * g
        for worker, _, _ in payloads:
            self._sent[worker] = w.copy()
        return {worker: w for worker, _, _ in payloads}

    def end_epoch(self, trainer, epoch: int) -> None:
        super().end_epoch(trainer, epoch)
        trainer.comm.bcast_(trainer.model.parameters_flat(), 0)
        # every worker now holds the master's weights
        self._sent = {wk: trainer.model.parameters_flat().copy() for wk in self._moments}

    def end(self, trainer) -> None:
        trainer.comm.bcast_(trainer.model.parameters_flat(), 0)

    def state_dict(self):
        out = super().state_dict()
        out["moments"] = {str(k): v for k, v in self._moments.items()}
        return out

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self._moments = {int(k): np.array(v) for k, v in state.get("moments", {}).items()}

    def __repr__(self) -> str:
        return (f"GEM(gem_lr={self.gem_lr}, gem_momentum={self.gem_momentum}, "
                f"gem_kappa={self.gem_kappa}, sync_every={self.sync_every}, "
                f"synchronous={self.synchronous})")
