"""``gossip``: GoSGD (Blot et al. 2016; Theano-MPI's ``GOSGD``): decentralized
asynchronous gossip averaging, no master.

Every rank trains its replica x_i with its own optimizer and holds a mixing weight
alpha_i (initially ``alpha``, default 1/N: the weights sum to 1). After each step it
pushes, with probability ``probability``, to one random other rank::

    sender:    alpha_i <- alpha_i / 2;  send (x_i, alpha_i) to j
    receiver:  x_j <- (alpha_j x_j + alpha_i x_i) / (alpha_j + alpha_i);  alpha_j += alpha_i

Asynchronous (default): a rank merges whatever pushes have arrived after each of its steps
and never waits for a peer. ``synchronous=True`` draws every rank's push from one shared
random stream (seeded by the trainer's seed and the step), so each rank knows which pushes
reach it this step and merges exactly those, in rank order: the result is deterministic
(2 ranks, probability 1, alpha 1/2: both replicas become their exact average every step).
Each epoch ends with the pushes still in flight merged and a consensus average
sum_i alpha_i x_i on every rank (alphas reset), which validation, checkpoints and the final
model use.

With ``group_size`` K > 1 a replica is a group of K ranks (``rules/groups.py``): they sum
their gradients every step and take the same local step; the groups' leaders gossip among
themselves (ranks, N and 1/N above count leaders) and each group then takes its leader's
weights.
"""
from __future__ import annotations

import numpy as np

from ..distributed.coordination import Backoff
from ._p2p import TAG_GOSSIP, LocalReplicas
from .base import Message, RuleArgumentError
from .groups import GroupedReplicas, check_group_size


class Gossip(GroupedReplicas, LocalReplicas):
    """Gossip averaging of replicas between random pairs of ranks.

    Args:
        probability: chance that a rank pushes after a step, in (0, 1].
        alpha: initial mixing weight of every rank (None: 1 / number of ranks).
        synchronous: shared push schedule (deterministic) instead of merging what arrived.
        group_size: ranks per replica, training synchronously.

    Example:
        Trainer(model, SGD(model, lr=0.01, momentum=0.9), rule=Gossip(probability=0.25))
    """

    name = "gossip"
    plan_format = "gossip (p={probability:g})"
    plan_order = 5

    @classmethod
    def step_messages(cls, *, size, itemsize, period, probability):
        # the weights pushed to one peer with probability p, while the rank computes on
        return [Message("push", size * itemsize, probability, "push")]

    def __init__(self, *, probability: float = 0.25, alpha: float | None = None,
                 synchronous: bool = False, group_size: int = 1):
        if not 0 < probability <= 1:
            raise RuleArgumentError("probability", f"gossip: probability must be in (0, 1], "
                                    f"got {probability!r}")
        if alpha is not None and not 0 < alpha <= 1:
            raise RuleArgumentError("alpha", f"gossip: alpha must be in (0, 1] (None: 1 / "
                                    f"ranks), got {alpha!r}")
        self.probability = float(probability)
        self.alpha0 = None if alpha is None else float(alpha)
        self.synchronous = bool(synchronous)
        self.group_size = check_group_size(self.name, group_size)
        self._group = None
        super().__init__("pushes", "merges")

    def _peers(self, trainer):
        """The communicator of the replicas that gossip: every rank, or the leaders."""
        return trainer.comm if self._group is None else self._group.groups.leaders_comm

    def bind(self, trainer, optimizer):
        self._bind_group(trainer)
        comm = self._peers(trainer)
        n = trainer.model.parameters_flat().size
        self._n = n
        self._dtype = trainer.model.dtype
        self._inbox = np.zeros(n + 1, np.float64 if self._dtype == np.float64 else self._dtype)
        self._sending: list[tuple[object, np.ndarray]] = []
        self._free: list[np.ndarray] = []
        self._sent_to = np.zeros(comm.size, np.int64)
        self._received = 0
        self._rng = np.random.default_rng([trainer.seed, 0x6055, trainer.comm.rank])
        return optimizer

    def begin(self, trainer) -> None:
        mine = self.resume_replica(trainer)
        if mine:
            self._rng.bit_generator.state = mine["rng"]
        self.alpha = self.alpha0 if self.alpha0 is not None else 1.0 / self._peers(trainer).size

    # -- pushing and merging ----------------------------------------------------------------
    def _push(self, trainer, peer: int) -> None:
        self._reap()
        buf = self._free.pop() if self._free else np.empty(self._n + 1, self._inbox.dtype)
        self.alpha /= 2
        buf[:-1] = trainer.model.parameters_flat()
        buf[-1] = self.alpha
        self._sending.append((self._peers(trainer).isend_(buf, peer, TAG_GOSSIP), buf))
        self._sent_to[peer] += 1
        self.traffic.sent(buf)
        self.pushes += 1

    def _reap(self) -> None:
        still = []
        for handle, buf in self._sending:
            if handle.test():
                self._free.append(buf)
            else:
                still.append((handle, buf))
        self._sending = still

    def _receive(self, trainer, source: int) -> None:
        comm = self._peers(trainer)
        handle = comm.irecv_(self._inbox, source, TAG_GOSSIP)
        self.traffic.wait([handle])
        self._received += 1
        self.traffic.received += 1
        x = trainer.model.parameters_flat()
        a_in = float(self._inbox[-1])
        total = self.alpha + a_in
        x *= self.alpha / total
        x += (a_in / total) * self._inbox[:-1]
        self.alpha = total
        self.merges += 1

    def _merge_arrived(self, trainer) -> None:
        while True:
            msg = self._peers(trainer).iprobe(-1, TAG_GOSSIP)
            if msg is None:
                return
            self._receive(trainer, msg[0])

    def step(self, trainer) -> None:
        self._local_step(trainer)
        self._as_group(trainer, self._gossip)

    def _as_group(self, trainer, work) -> None:
        """work(trainer) on this rank, or, in a group of ranks, on its leader, whose
        weights the group then shares."""
        if self._group is None:
            work(trainer)
            return
        if self._group.is_leader:
            work(trainer)
        self._group.share_weights(trainer)

    def _gossip(self, trainer) -> None:
        comm = self._peers(trainer)
        if comm.size == 1:
            return
        if self.synchronous:
            rng = np.random.default_rng([trainer.seed, 0x6055, trainer.global_step])
            pushes = rng.random(comm.size) < self.probability
            peers = (np.arange(comm.size) + 1 + rng.integers(0, comm.size - 1, comm.size)) \
                % comm.size
            if pushes[comm.rank]:
                self._push(trainer, int(peers[comm.rank]))
            for source in np.flatnonzero(pushes & (peers == comm.rank)):
                self._receive(trainer, int(source))
        else:
            self._merge_arrived(trainer)
            if self._rng.random() < self.probability:
                peer = int(self._rng.integers(0, comm.size - 1))
                self._push(trainer, peer + (peer >= comm.rank))

    # -- epoch end: drain, then consensus ---------------------------------------------------
    def end_epoch(self, trainer, epoch: int) -> None:
        self._as_group(trainer, self._consensus)
        if self._group is not None:
            self.keep_states(trainer, rng=self._rng.bit_generator.state)

    def _consensus(self, trainer) -> None:
        comm = self._peers(trainer)
        if comm.size == 1:
            return
        counts = self._sent_to.copy()
        comm.allreduce_(counts, "sum")
        expected = int(counts[comm.rank])
        backoff = Backoff(2e-3)
        while self._received < expected:
            msg = comm.iprobe(-1, TAG_GOSSIP)
            if msg is None:
                backoff.pause()
                continue
            self._receive(trainer, msg[0])
        self.traffic.wait([h for h, _ in self._sending])
        self._reap()
        x = trainer.model.parameters_flat()
        buf = np.empty(self._n + 1, self._inbox.dtype)
        buf[:-1] = x * self.alpha
        buf[-1] = self.alpha
        comm.allreduce_(buf, "sum")
        self.traffic.sent(buf)
        np.divide(buf[:-1], buf[-1], out=x)
        self.alpha = self.alpha0 if self.alpha0 is not None else 1.0 / comm.size
        self._sent_to[...] = 0
        self._received = 0
        if self._group is None:
            self.keep_states(trainer, rng=self._rng.bit_generator.state)

    def __repr__(self) -> str:
        return (f"Gossip(probability={self.probability}, alpha={self.alpha0}, "
                f"synchronous={self.synchronous}, group_size={self.group_size})")
