"""``partial``: partial parameter averaging (SINGA's ``DistOpt.backward_and_partial_update``).

Every rank steps its own optimizer on its own gradients (loss averaged over its own samples,
as under ``localsgd``). After each step one of ``chunks`` contiguous chunks of the flat
parameter buffer is averaged over the ranks (one all-reduce of that slice), the chunks
taking turns in order, so every parameter is averaged once every ``chunks`` steps and a
step sends 1/``chunks`` of the weights. A chunk's average is weighted by the samples each
rank trained on since that chunk's previous average (an uneven or empty share of the last
global batch counts each sample once). Each epoch ends with an average of every chunk (as
SINGA's examples synchronize the parameters before evaluating), so validation, checkpoints
and the final model use the average. With ``chunks=1`` it makes exactly the updates of
``localsgd`` with ``sync_every=1``.

The turn runs on across epochs: the checkpoint keeps the position, with every rank's
optimizer state, so a resume on the same number of ranks continues exactly. On another
number of ranks the weights (averaged at the checkpoint) and the position carry over and
every rank starts from rank 0's optimizer state (momentum), said on rank 0. A resume with
another ``chunks`` starts the turns at chunk 0.
"""
from __future__ import annotations

import numpy as np

from .. import distributed as dist
from ._p2p import LocalReplicas, restore_local_state
from .base import Message, RuleArgumentError, whole_argument


def chunk_edges(n: int, chunks: int) -> np.ndarray:
    """Offsets of ``chunks`` contiguous chunks of ``n`` elements (``np.array_split``'s
    sizes: the first ``n % chunks`` chunks one element longer); ``chunks + 1`` values."""
    sizes = np.full(chunks, n // chunks, np.int64)
    sizes[:n % chunks] += 1
    return np.concatenate([[0], np.cumsum(sizes)])


class PartialUpdate(LocalReplicas):
    """Local steps; after each, one chunk of the weights is averaged, in turn.

    Args:
        chunks: K, contiguous chunks of the flat weights (1: average all after every step;
            at most the number of weights).

    Example:
        Trainer(model, SGD(model, lr=0.01, momentum=0.9), rule=PartialUpdate(chunks=4))
    """

    name = "partial"
    default_period = 4
    plan_format = "partial ({period} chunks)"
    plan_order = 1

    @classmethod
    def step_messages(cls, *, size, itemsize, period, probability):
        # every step: the largest chunk and its sample count
        return [Message("chunk", (-(-size // period) + 1) * itemsize, 1.0, "allreduce")]
    # Not lockstep: mid-epoch the replicas differ, so a step checkpoint of rank 0's weights
    # could not resume them (checkpoints are taken at epoch ends, after the full average).
    lockstep = False

    def __init__(self, *, chunks: int = 4):
        self.chunks = whole_argument(self.name, "chunks", chunks)
        self.position = 0   # the chunk averaged after the next step
        super().__init__("averages")  # chunk averages (an epoch end's full one counts once)
        self._resume_chunks = self.chunks

    def bind(self, trainer, optimizer):
        n = trainer.model.parameters_flat().size
        if self.chunks > n:
            raise RuleArgumentError("chunks", f"partial: chunks must be at most the number of "
                                    f"weights of the model ({n}), got {self.chunks}; use fewer "
                                    "chunks")
        self._edges = chunk_edges(n, self.chunks)
        self._buf = np.zeros(int(np.diff(self._edges).max()) + 1, trainer.model.dtype)
        self._samples = np.zeros(self.chunks, np.int64)  # this rank's, since each average
        self._steps = np.zeros(self.chunks, np.int64)    # steps since each chunk's average
        return optimizer

    def loss_denominator(self, batch) -> int:
        return len(batch.x)

    def begin(self, trainer) -> None:
        comm = trainer.comm
        dist.broadcast_parameters(trainer.model, comm=comm)
        states = self._resume
        if states:
            if len(states) != comm.size:
                trainer.print(f"partial: the checkpoint holds the optimizer states of "
                              f"{len(states)} ranks, this run has {comm.size}: every rank "
                              "starts from rank 0's (the averaged weights and the chunk "
                              "position carry over)")
            restore_local_state(trainer, states[comm.rank if len(states) == comm.size else 0])
        if self._resume_chunks != self.chunks:
            trainer.print(f"partial: the checkpoint was written with {self._resume_chunks} "
                          f"chunks, this run has {self.chunks}: the turns start at chunk 0")
            self.position = 0
        self._resume = None
        self._resume_chunks = self.chunks
        self._samples[...] = 0
        self._steps[...] = 0

    def step(self, trainer) -> None:
        if trainer.batch_samples:
            trainer.optimizer.step()
            self._samples += trainer.batch_samples
        self._steps += 1
        c = self.position
        self.position = (c + 1) % self.chunks
        lo, hi = int(self._edges[c]), int(self._edges[c + 1])
        x = trainer.model.parameters_flat()[lo:hi]
        self._average(trainer, [(x, int(self._samples[c]))], self._buf[:hi - lo + 1])
        self._samples[c] = 0
        self._steps[c] = 0

    def _average(self, trainer, parts, buf: np.ndarray) -> None:
        """Replace each slice of ``parts`` ([(slice of the weights, this rank's samples)]) by
        its sample-weighted average over the ranks: one all-reduce of ``buf`` (the weighted
        slices, then one count per slice)."""
        comm = trainer.comm
        if comm.size == 1:
            return
        counts = buf[len(buf) - len(parts):]
        at = 0
        for i, (x, samples) in enumerate(parts):
            np.multiply(x, samples, out=buf[at:at + x.size])
            counts[i] = samples
            at += x.size
        comm.allreduce_(buf, "sum")
        self.traffic.sent(buf)
        at = 0
        for i, (x, _) in enumerate(parts):
            # no rank trained since this slice's last average: the replicas still agree
            if counts[i] > 0:
                np.divide(buf[at:at + x.size], counts[i], out=x)
            at += x.size
        self.averages += 1

    def end_epoch(self, trainer, epoch: int) -> None:
        # Every rank counts every step, so all agree whether a chunk is behind.
        if self._steps.any():
            flat = trainer.model.parameters_flat()
            parts = [(flat[lo:hi], int(s)) for lo, hi, s
                     in zip(self._edges[:-1], self._edges[1:], self._samples)]
            buf = np.zeros(flat.size + self.chunks, flat.dtype)
            self._average(trainer, parts, buf)
        self._samples[...] = 0
        self._steps[...] = 0
        if trainer.comm.size > 1:
            self.keep_states(trainer)

    def state_dict(self):
        return {"position": self.position, "chunks": self.chunks, **super().state_dict()}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.position = int(state.get("position", 0))
        self._resume_chunks = int(state.get("chunks", self.chunks))

    def __repr__(self) -> str:
        return f"PartialUpdate(chunks={self.chunks})"
