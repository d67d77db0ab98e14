"""``localsgd``: local SGD (periodic model averaging; Stich 2019, "Don't use large
mini-batches, use local SGD").

Every rank trains its own replica with its own optimizer on its share of each global
batch (loss averaged over its own samples) and every ``sync_every`` batches the replicas
are replaced by their average, weighted by the samples each rank trained on since the last
average (so uneven shards count each sample once). Each epoch ends with an average, so
validation, checkpoints and the final model use the averaged model. With
``sync_every=1`` and equal shards it makes exactly the updates of ``data``.

How the replicas are weighted in an average (``weighting``, PyDTNN's model-sync-algo):
``wavg`` (the default) by the samples each trained since the last average, ``avg`` equally,
``invwavg`` inversely (PyDTNN's inverse weights: a rank that trained n of the samples gets
``min + max - n``, min and max over the ranks taking part, normalized here to sum to 1).
Which ranks take part (``participation``): ``all``, or ``avail2all``: only the ranks that
trained on at least one sample since the last average (a rank whose shard ran out is left
out and takes the average of the others); with fewer than ``min_avail`` of those the round
is skipped (the epoch-end average is never skipped). ``ready``: a rank late for a round is
left out of it and not waited for: every rank sends its replica to rank 0, which averages
as soon as ``min_avail`` replicas (its own among them; at least 1) have arrived, with any
others already there, and sends the average back; a late rank's replica of that round is
dropped and it takes the average when it gets there (``left_out`` counts it). Rank 0
coordinates, so it is never left out; the epoch-end average waits for every rank.
``sync_dtype`` casts each rank's weighted replica to float16/float32 before the all-reduce (PyDTNN's
model-sync-quantize): half the bytes in float16, each rank's contribution rounded.

With ``group_size`` K > 1 a replica is a group of K ranks (``rules/groups.py``): they sum
their gradients every step and take the same local step; the averages run among the
groups' leaders and each group then takes its leader's weights.
"""
from __future__ import annotations

import time

import numpy as np

from ._p2p import LocalReplicas
from .base import Message, RuleArgumentError, whole_argument
from .groups import GroupedReplicas, check_group_size

WEIGHTINGS = ("wavg", "avg", "invwavg")
PARTICIPATIONS = ("all", "avail2all", "ready")
_UP, _DOWN = 7301, 7302  # the tags of ready rounds' replicas (to rank 0) and averages
SYNC_DTYPES = {"none": None, "float16": np.float16, "float32": np.float32,
               "float64": np.float64}


def sync_weights(samples: np.ndarray, weighting: str, taking_part: np.ndarray) -> np.ndarray:
    """Each rank's weight in an average (summing to 1; 0 for a rank not taking part), from
    the samples each trained since the last average.

    Example:
        sync_weights(np.array([3., 2.]), "invwavg", np.array([True, True]))  # [0.4, 0.6]
    """
    n = np.asarray(samples, np.float64)
    part = np.asarray(taking_part, bool)
    if weighting == "avg":
        w = part.astype(np.float64)
    elif weighting == "wavg":
        w = np.where(part, n, 0.0)
    else:  # invwavg: the fewest samples get the weight of the most and the reverse
        lo, hi = n[part].min(), n[part].max()
        w = np.where(part, lo + hi - n, 0.0)
    total = w.sum()
    if total <= 0:  # no rank trained (or all weights 0): an equal average of those taking part
        w, total = part.astype(np.float64), max(part.sum(), 1)
    return w / total


class LocalSGD(GroupedReplicas, LocalReplicas):
    """Local steps, then an all-reduce average of the weights every ``sync_every`` batches.

    Args:
        sync_every: k, batches between two averages (1: every step).
        group_size: ranks per replica, training synchronously.
        weighting: wavg | avg | invwavg, the weights of the replicas in an average.
        participation: all | avail2all, which ranks take part in an average.
        min_avail: skip an average that fewer ranks than this take part in.
        sync_dtype: none | float16 | float32 | float64, the dtype the replicas are
            all-reduced in (none: the model's).

    Example:
        Trainer(model, SGD(model, lr=0.01, momentum=0.9), rule=LocalSGD(sync_every=8))
    """

    name = "localsgd"
    default_period = 8
    plan_format = "localsgd (every {period})"
    plan_order = 2

    @classmethod
    def step_messages(cls, *, size, itemsize, period, probability):
        # every k steps: the weights and a sample count
        return [Message("weights" if period > 1 else "chunk", (size + 1) * itemsize,
                        1 / period, "allreduce")]

    def __init__(self, *, sync_every: int | None = None, group_size: int = 1,
                 weighting: str = "wavg", participation: str = "all", min_avail: int = 0,
                 sync_dtype: str = "none"):
        self.sync_every = whole_argument(self.name, "sync_every", sync_every,
                                         default=self.default_period)
        for arg, value, choices in (("weighting", weighting, WEIGHTINGS),
                                    ("participation", participation, PARTICIPATIONS),
                                    ("sync_dtype", sync_dtype, tuple(SYNC_DTYPES))):
            if value not in choices:
                raise RuleArgumentError(arg, f"localsgd: {arg} must be one of "
                                        f"{', '.join(choices)}, got {value!r}")
        self.min_avail = whole_argument(self.name, "min_avail", min_avail, least=0)
        self.weighting, self.participation = weighting, participation
        self.sync_dtype = sync_dtype
        self.skipped = 0
        self.left_out = 0
        self._stale = False
        self.group_size = check_group_size(self.name, group_size)
        self._group = None
        super().__init__("averages")

    def bind(self, trainer, optimizer):
        self._p2p = None
        if self.participation == "ready":
            if self.group_size > 1:
                raise ValueError("localsgd: participation 'ready' runs with one rank per "
                                 "replica (group_size 1)")
            # its own communicator: the point-to-point rounds cannot meet other messages
            self._p2p = trainer.comm.split(0, trainer.comm.rank) if trainer.comm.size > 1 \
                else None
            self._round, self._pending = 0, []
            self._received = [0] * trainer.comm.size
        n = trainer.model.parameters_flat().size
        self._buf = np.zeros(n + 1, trainer.model.dtype)
        self._steps = 0
        self._samples = 0
        self._bind_group(trainer)
        return optimizer

    def begin(self, trainer) -> None:
        self.resume_replica(trainer)
        self._steps = 0
        self._samples = 0

    def step(self, trainer) -> None:
        self._samples += self._local_step(trainer)
        self._steps += 1  # every rank counts every global batch: the all-reduces stay in step
        if self._steps % self.sync_every == 0:
            self._average(trainer)

    @property
    def _plain(self) -> bool:
        """The one all-reduce of samples-weighted replicas and the sample count suffices."""
        return (self.weighting, self.participation, self.min_avail, self.sync_dtype) \
            == ("wavg", "all", 0, "none")

    def _average(self, trainer, final: bool = False) -> None:
        comm = trainer.comm
        group = self._group
        if group is not None:
            comm = group.groups.leaders_comm if group.is_leader else None
        x = trainer.model.parameters_flat()
        averaged = True
        if comm is not None and comm.size > 1 and self.participation == "ready" and not final:
            self._ready_round(x)
        elif comm is not None and comm.size > 1 and not self._plain:
            averaged = self._weighted_average(comm, x, final)
        elif comm is not None and comm.size > 1:
            buf = self._buf
            np.multiply(x, self._samples, out=buf[:-1])
            buf[-1] = self._samples
            comm.allreduce_(buf, "sum")
            self.traffic.sent(buf)
            np.divide(buf[:-1], buf[-1], out=x)
            self.averages += 1
        if group is not None:  # a skipped round leaves the group's ranks as they were: equal
            group.share_weights(trainer)
        if averaged:
            self._samples = 0
        self._stale = not averaged

    def _weighted_average(self, comm, x: np.ndarray, final: bool) -> bool:
        """Average ``x`` in place with ``sync_weights``' weights (one all-gather of the
        sample counts, then one all-reduce in ``sync_dtype``); False: the round is skipped
        (fewer than ``min_avail`` ranks take part)."""
        samples = comm.allgather(np.array([self._samples], np.float64)).reshape(-1)
        self.traffic.sent(np.empty(1, np.float64))
        part = samples > 0 if self.participation == "avail2all" else np.ones(len(samples), bool)
        if not part.any():
            part[:] = True
        if part.sum() < self.min_avail and not final:
            self.skipped += 1
            return False
        weight = sync_weights(samples, self.weighting, part)[comm.rank]
        dtype = SYNC_DTYPES[self.sync_dtype] or x.dtype
        buf = (x * weight).astype(dtype)
        comm.allreduce_(buf, "sum")
        self.traffic.sent(buf)
        x[...] = buf
        self.averages += 1
        return True

    # -- ready: rounds that wait for the first min_avail ranks only -------------------------
    def _ready_round(self, x: np.ndarray) -> None:
        comm, n = self._p2p, x.size
        self._round += 1
        mine = np.empty(n + 2, np.float64)
        mine[:n], mine[n], mine[n + 1] = x, self._samples, self._round
        if comm.rank != 0:
            self._pending.append(comm.isend_(mine, 0, _UP))
            self.traffic.sent(mine)
            reply = comm.irecv_(np.empty(n, np.float64), 0, _DOWN)
            self.traffic.wait([reply])
            x[...] = reply.wait().astype(x.dtype)
            self._pending = [h for h in self._pending if not h.test()]
            self.averages += 1
            return
        came = {0: mine}
        quorum = min(max(self.min_avail, 1), comm.size)
        while True:
            found = comm.iprobe(-1, _UP)
            if found is None:
                if len(came) >= quorum:
                    break
                time.sleep(2e-4)
                continue
            buf = comm.recv_(np.empty(n + 2, np.float64), found[0], _UP)
            self._received[found[0]] += 1
            if int(buf[n + 1]) == self._round:
                came[found[0]] = buf
            # else: a late replica of an earlier round, which was averaged without it
        samples = np.zeros(comm.size)
        part = np.zeros(comm.size, bool)
        for r, buf in came.items():
            samples[r], part[r] = buf[n], True
        c = sync_weights(samples, self.weighting, part)
        avg = sum(c[r] * buf[:n] for r, buf in came.items())
        self.left_out += comm.size - len(came)
        for r in range(1, comm.size):
            out = avg.copy()
            self._pending.append(comm.isend_(out, r, _DOWN))
            self.traffic.sent(out)
        self._pending = [h for h in self._pending if not h.test()]
        x[...] = avg.astype(x.dtype)
        self.averages += 1

    def _ready_drain(self, n: int) -> None:
        """Before the epoch end's collective: rank 0 takes (and drops) the late replicas
        still on their way, and every rank completes its sends."""
        comm = self._p2p
        if comm.rank == 0:
            for r in range(1, comm.size):
                while self._received[r] < self._round:
                    comm.recv_(np.empty(n + 2, np.float64), r, _UP)
                    self._received[r] += 1
        self.traffic.wait(self._pending)
        self._pending = []

    def end_epoch(self, trainer, epoch: int) -> None:
        if self.participation == "ready" and self._p2p is not None:
            self._ready_drain(trainer.model.parameters_flat().size)
        if self._steps % self.sync_every or self._stale or self.participation == "ready":
            self._average(trainer, final=True)
        self._steps = 0
        self.keep_states(trainer)

    def stats(self):
        out = super().stats()
        if self.skipped:
            out["skipped"] = float(self.skipped)
        if self.participation == "ready":
            out["left_out"] = float(self.left_out)
        return out

    def __repr__(self) -> str:
        return (f"LocalSGD(sync_every={self.sync_every}, group_size={self.group_size}, "
                f"weighting={self.weighting!r}, participation={self.participation!r}, "
                f"min_avail={self.min_avail}, sync_dtype={self.sync_dtype!r})")
