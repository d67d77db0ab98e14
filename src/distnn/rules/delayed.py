"""``pipeline``: delayed SGD with a staleness of one step (PyDTNN's parallel pipeline).

Each step starts the all-reduce of this step's gradient and applies the one of the
previous step, whose all-reduce had the whole of this step's forward and backward to
complete: communication is hidden behind compute, at the price of gradients one step
stale. The update is

    w_{t+1} = w_t - lr * g(w_{t-1}),    g = the gradient of the global batch,

with no update at the first step of an epoch (nothing is pending) and the last step's
gradient applied at the epoch's end (so every gradient is applied once, the replicas are
equal at every epoch end, and a checkpoint holds nothing in flight). With the optimizer's
momentum or Adam state the optimizer is fed the stale gradients in the same order.
"""
from __future__ import annotations

import time

import numpy as np

from .. import distributed as dist
from ._p2p import Traffic
from .base import Message, Rule


class DelayedSGD(Rule):
    """One-step-stale synchronous SGD: this step's gradient all-reduce overlaps the next
    step, and the step applies the previous step's averaged gradient.

    Example:
        Trainer(model, SGD(model, lr=0.01), rule=DelayedSGD())
    """

    name = "pipeline"
    lockstep = True

    @classmethod
    def step_messages(cls, *, size, itemsize, period, probability):
        # the whole gradient, all-reduced while the next step computes
        return [Message("gradients, one step stale", size * itemsize, 1.0, "behind")]

    def __init__(self) -> None:
        self.traffic = Traffic()
        self._pending = None
        self.applied = 0

    def bind(self, trainer, optimizer):
        n = trainer.model.gradients_flat().size
        dtype = trainer.model.gradients_flat().dtype
        self._bufs = [np.zeros(n, dtype), np.zeros(n, dtype)]
        self._turn = 0
        return optimizer

    def begin(self, trainer) -> None:
        dist.broadcast_parameters(trainer.model, comm=trainer.comm)
        self._pending = None

    def step(self, trainer) -> None:
        buf = self._bufs[self._turn]
        self._turn ^= 1
        # The gradients are sums over this rank's samples / the global batch: their sum
        # over the ranks is the global batch's gradient.
        np.copyto(buf, trainer.model.gradients_flat())
        handle = trainer.comm.iallreduce_(buf, "sum")
        self.traffic.sent(buf)
        self._apply(trainer)
        self._pending = (handle, buf)

    def _apply(self, trainer) -> None:
        """Apply the pending (previous) gradient, once its all-reduce completes."""
        if self._pending is None:
            return
        handle, buf = self._pending
        t0 = time.perf_counter()
        handle.wait()
        self.traffic.wait_s += time.perf_counter() - t0
        np.copyto(trainer.model.gradients_flat(), buf)
        trainer.optimizer.step()
        self._pending = None
        self.applied += 1

    def end_epoch(self, trainer, epoch: int) -> None:
        self._apply(trainer)

    def stats(self) -> dict[str, float]:
        out = self.traffic.as_dict()
        out["updates"] = float(self.applied)
        return out
