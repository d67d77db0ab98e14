"""Shared machinery of the point-to-point rules: message tags, traffic counters, waiting
without burning a core, and the master/worker base class (Downpour, async EASGD, GEM).

Every wait here sleeps between polls (``distributed.coordination``: ``Backoff``,
``wait_all``, ``lazy_barrier``) instead of spinning in MPICH's blocking calls.
"""
from __future__ import annotations

import contextlib
import time
from typing import Any, Callable, Iterator

import numpy as np

from .. import distributed as dist
from ..distributed.coordination import Backoff, lazy_barrier, wait_all
from .base import Message, Rule, RuleArgumentError, RuleStateError, whole_argument
from .groups import WorkerGroup, check_group_size, layout_of
from .masters import MasterTree, check_masters, role_of

TAG_GRAD, TAG_DONE, TAG_REPLY, TAG_GOSSIP = 71, 72, 73, 74


class Traffic:
    """Counters of one rank: messages and bytes sent, seconds spent waiting, and for a
    master the seconds idle (no message), busy (handling one) and CPU seconds serving."""

    def __init__(self):
        self.messages = 0
        self.bytes = 0
        self.received = 0
        self.wait_s = 0.0
        self.idle_s = 0.0
        self.busy_s = 0.0
        self.serve_cpu_s = 0.0
        self.serve_wall_s = 0.0

    def sent(self, arr: np.ndarray) -> None:
        self.messages += 1
        self.bytes += arr.nbytes

    def wait(self, handles, max_sleep: float = 1e-3) -> None:
        """Complete ``handles`` without spinning, counting the seconds waited."""
        self.wait_s += wait_all(handles, max_sleep)

    def as_dict(self) -> dict[str, float]:
        out = {"messages": float(self.messages), "bytes": float(self.bytes),
               "received": float(self.received), "wait_s": self.wait_s}
        if self.serve_wall_s:
            out.update(idle_s=self.idle_s, busy_s=self.busy_s, serve_s=self.serve_wall_s,
                       serve_cpu_s=self.serve_cpu_s)
        return out


def need_ranks(rule: str, comm, least: int) -> None:
    if comm.size < least:
        raise ValueError(f"{rule} needs at least {least} ranks (rank 0 is the "
                         f"master, the others are workers), got {comm.size}; run it under "
                         f"mpiexec -n {max(least, 3)}")


class MasterWorker(Rule):
    """Rank 0 (the master) holds the reported weights and serves ranks 1..N-1 (workers),
    which share each global batch among themselves.

    Each worker trains ``sync_every`` batches, then sends one message (tag TAG_GRAD, a
    flat array of ``send_size`` elements plus the sample count) and receives the master's
    reply into ``reply`` (``reply_size`` elements). At the end of its epoch it sends what it
    still holds and TAG_DONE. The master answers each message as it arrives (asynchronous)
    or, with ``synchronous``, one round at a time: it waits for one message from every
    worker still training, combines them and answers all. Subclasses define the arithmetic:
    ``worker_accumulate``, ``worker_payload``, ``worker_apply_reply``, ``master_apply``.
    A worker may be a group of ranks (``group_size``, rules/groups.py) and the master a
    top master over sub-masters (``masters``, rules/masters.py).
    """

    default_period = 1
    plan_format = "{name} (every {period})"

    @classmethod
    def step_messages(cls, *, size, itemsize, period, probability):
        # each worker, every k steps: its update to the master and the weights back
        return [Message("to/from master", size * itemsize, 1 / period, "master")]

    def __init__(self, *, sync_every: int | None = None, synchronous: bool = False,
                 max_sleep: float = 2e-3, group_size: int = 1, masters: int = 1):
        self.sync_every = whole_argument(self.name, "sync_every", sync_every,
                                         default=self.default_period)
        self.synchronous = bool(synchronous)
        if isinstance(max_sleep, bool) or not isinstance(max_sleep, (int, float)) \
                or not max_sleep > 0:
            raise RuleArgumentError("max_sleep", f"{self.name}: max_sleep (the longest sleep "
                                    f"between two polls, in seconds) must be a number > 0, "
                                    f"got {max_sleep!r}")
        self.max_sleep = float(max_sleep)
        self.traffic = Traffic()
        self.updates = 0           # master: updates applied to its weights
        self.messages_applied = 0  # master: worker messages folded into the weights
        self.pushes = 0            # worker: messages sent to the master (not counting DONE)
        self.group_size = check_group_size(self.name, group_size)
        self.masters = check_masters(self.name, masters, self.synchronous)
        self._group: WorkerGroup | None = None
        self._tree: MasterTree | None = None

    # -- layout: rank 0 the master (with masters=M > 1: the top master, ranks 1..M the
    # sub-masters), the workers after them, each a rank or a group of ranks (rules/groups.py)
    @property
    def first_worker(self) -> int:
        return 1 if self.masters == 1 else 1 + self.masters

    @property
    def min_ranks(self) -> int:
        return self.first_worker + self.group_size * self.masters

    def _worker_order(self, comm) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(the leaders, every worker rank in data-share order)."""
        if self.group_size == 1:
            ranks = tuple(range(self.first_worker, comm.size))
            return ranks, ranks
        groups = layout_of(self.name, comm, self.group_size, self.first_worker)
        return groups.leaders, groups.order

    # -- roles ---------------------------------------------------------------------------
    role = role_of

    def is_master(self, trainer) -> bool:
        """The master, or with several masters any of them."""
        return trainer.comm.rank < self.first_worker

    def shard_of(self, comm):
        need_ranks(self.name, comm, self.min_ranks)
        if self.group_size == 1 and self.masters == 1:
            return (None if comm.rank == 0 else comm.rank - 1), comm.size - 1
        order = self._worker_order(comm)[1]
        return (order.index(comm.rank) if comm.rank in order else None), len(order)

    def loss_denominator(self, batch) -> int:
        if self._group is not None:
            return self._group.loss_denominator(batch)
        return len(batch.x)

    def bind(self, trainer, optimizer):
        self._model = trainer.model
        comm = trainer.comm
        leaders, _ = self._worker_order(comm)
        self._leaders = leaders
        if self.group_size > 1:
            groups = layout_of(self.name, comm, self.group_size, self.first_worker)
            if comm.rank in groups.order:
                self._group = WorkerGroup(groups, trainer.model)
        if self.masters > 1:
            self._tree = MasterTree(self, comm, leaders)
        n = trainer.model.parameters_flat().size
        self._out = np.zeros(self.send_size(n) + 1, trainer.model.dtype)
        self._acc = np.zeros(self.send_size(n), trainer.model.dtype)
        self._pending = 0       # batches accumulated since the last message
        self._samples = 0
        return optimizer

    # -- what subclasses define -------------------------------------------------------------
    def send_size(self, n_params: int) -> int:
        return n_params

    def reply_size(self, n_params: int) -> int:
        return n_params

    def worker_accumulate(self, trainer) -> None:
        """After each batch of a worker (gradients in ``model.gradients_flat()``)."""
        self._acc += trainer.model.gradients_flat()

    def worker_payload(self, trainer) -> np.ndarray:
        """The array sent to the master (``send_size`` elements)."""
        return self._acc

    def worker_apply_reply(self, trainer, reply: np.ndarray) -> None:
        """Use the master's reply (default: the master's weights)."""
        trainer.model.parameters_flat()[...] = reply

    def worker_reply_buffer(self, trainer) -> np.ndarray:
        """Where the reply is received (default: straight into the weights)."""
        return trainer.model.parameters_flat()

    def master_apply(self, trainer, payloads: list[tuple[int, np.ndarray, int]]
                     ) -> dict[int, np.ndarray]:
        """Fold the workers' messages ``[(worker rank, payload, samples)]`` into the master's
        state and return the reply to each of them."""
        raise NotImplementedError

    # -- worker side ---------------------------------------------------------------------
    def master_of(self, rank: int) -> int:
        """The rank that serves worker ``rank`` (a leader): the master or its sub-master."""
        return 0 if self._tree is None else self._tree.master_of(rank)

    def n_workers(self, comm) -> int:
        """The workers that share this rank's master (a group counts as one)."""
        return len(self._leaders) if self._tree is None else self._tree.n_workers(comm.rank)

    def step(self, trainer) -> None:
        samples = trainer.batch_samples
        if self._group is not None:
            samples = self._group.reduce_gradients(trainer)
        if samples == 0:
            return  # nothing learned from an empty share of the last global batch
        self.worker_accumulate(trainer)
        self._pending += 1
        self._samples += samples
        if self._pending >= self.sync_every:
            self._exchange(trainer)

    def _exchange(self, trainer) -> None:
        comm = trainer.comm
        if self._group is None or self._group.is_leader:
            reply_buf = self.push(comm, self.master_of(comm.rank), self.worker_payload(trainer),
                                  self._samples, self.worker_reply_buffer(trainer))
            self.pushes += 1
            self.worker_apply_reply(trainer, reply_buf)
        if self._group is not None:
            self._group.share_weights(trainer)
        self._acc[...] = 0
        self._pending = 0
        self._samples = 0

    def push(self, comm, master: int, payload, samples: int, reply_buf):
        """Send ``payload`` and ``samples`` to ``master``; return its reply, in ``reply_buf``."""
        self._out[:-1] = payload
        self._out[-1] = samples
        recv = comm.irecv_(reply_buf, master, TAG_REPLY)  # posted first: the reply never waits
        send = comm.isend_(self._out, master, TAG_GRAD)
        self.traffic.sent(self._out)
        self.traffic.wait([send, recv], self.max_sleep)
        self.traffic.received += 1
        return reply_buf

    def send_done(self, comm, master: int, dtype) -> None:
        done = np.zeros(1, dtype)
        handle = comm.isend_(done, master, TAG_DONE)
        self.traffic.sent(done)
        self.traffic.wait([handle], self.max_sleep)

    def _finish_epoch(self, trainer) -> None:
        if self._pending:
            self._exchange(trainer)
        if self._group is None or self._group.is_leader:
            self.send_done(trainer.comm, self.master_of(trainer.comm.rank), trainer.model.dtype)

    # -- master side ---------------------------------------------------------------------
    def serve(self, trainer, epoch: int, progress: Callable[[int], Any] | None = None) -> None:
        if self._tree is not None:
            self._tree.serve(trainer, progress)
        else:
            self.serve_clients(trainer, self._leaders, self.master_apply, progress)

    def serve_clients(self, trainer, clients, apply, progress=None) -> None:
        """Answer the messages of ``clients`` (ranks) with ``apply`` (``master_apply``'s
        signature) until each of them has sent TAG_DONE."""
        comm = trainer.comm
        n = trainer.model.parameters_flat().size
        dtype = trainer.model.dtype
        if not hasattr(self, "_inbox"):
            self._inbox = {w: np.zeros(self.send_size(n) + 1, dtype) for w in clients}
            self._replies = {w: np.zeros(self.reply_size(n), dtype) for w in clients}
            self._reply_handles: dict[int, Any] = {}
        self._apply = apply
        active = set(clients)
        waiting: dict[int, tuple[np.ndarray, int]] = {}
        done_buf = np.zeros(1, dtype)
        t = self.traffic
        wall0, cpu0 = time.perf_counter(), time.process_time()
        backoff = Backoff(self.max_sleep)
        while active:
            t_poll = time.perf_counter()
            msg = comm.iprobe(-1, -1)
            if msg is None:
                backoff.pause()
                t.idle_s += time.perf_counter() - t_poll
                continue
            backoff.reset()
            source, tag, _ = msg
            if tag == TAG_DONE:
                comm.recv_(done_buf, source, TAG_DONE)
                active.discard(source)
            elif tag == TAG_GRAD:
                inbox = self._inbox[source]
                comm.recv_(inbox, source, TAG_GRAD)
                t.received += 1
                samples = int(inbox[-1])
                if progress is not None:
                    progress(samples)
                waiting[source] = (inbox[:-1], samples)
            else:
                raise RuntimeError(f"{self.name} master: unexpected message tag {tag} from "
                                   f"rank {source}; every rank must run the same rule")
            # Asynchronous: answer every message at once. Synchronous: answer when every
            # worker still training has sent its message of this round.
            if waiting and (not self.synchronous or set(waiting) >= active):
                self._answer(trainer, waiting)
                waiting = {}
            t.busy_s += time.perf_counter() - t_poll
        if waiting:
            self._answer(trainer, waiting)
        t.wait(list(self._reply_handles.values()), self.max_sleep)
        self._reply_handles = {}
        t.serve_wall_s += time.perf_counter() - wall0
        t.serve_cpu_s += time.process_time() - cpu0

    def _answer(self, trainer, waiting: dict[int, tuple[np.ndarray, int]]) -> None:
        comm = trainer.comm
        payloads = [(w, g, s) for w, (g, s) in sorted(waiting.items())]
        replies = self._apply(trainer, payloads)
        self.updates += 1
        self.messages_applied += len(payloads)
        if self._tree is not None:
            self._tree.after_update(trainer, sum(s for _, _, s in payloads))
        for w, reply in replies.items():
            old = self._reply_handles.pop(w, None)
            if old is not None:  # the worker got it before it sent again: already complete
                self.traffic.wait([old], self.max_sleep)
            buf = self._replies[w]
            buf[...] = reply
            self._reply_handles[w] = comm.isend_(buf, w, TAG_REPLY)
            self.traffic.sent(buf)

    # -- epoch boundaries ------------------------------------------------------------------
    def end_epoch(self, trainer, epoch: int) -> None:
        if not self.is_master(trainer):
            self._finish_epoch(trainer)
        self.traffic.wait_s += lazy_barrier(trainer.comm, 2e-3)
        average_buffers(trainer)

    def stats(self) -> dict[str, float]:
        out = self.traffic.as_dict()
        out.update(updates=float(self.updates), messages_applied=float(self.messages_applied),
                   pushes=float(self.pushes))
        if self._group is not None:
            out["group_reductions"] = float(self._group.reductions)
        return out if self._tree is None else {**out, **self._tree.stats()}

    def state_dict(self) -> dict[str, Any]:
        return {"updates": self.updates, "messages_applied": self.messages_applied}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.updates = int(state.get("updates", 0))
        self.messages_applied = int(state.get("messages_applied", 0))


@contextlib.contextmanager
def swapped_weights(model, weights: np.ndarray) -> Iterator[None]:
    """Within it ``model`` holds ``weights``; its own are put back afterwards."""
    flat = model.parameters_flat()
    own = flat.copy()
    flat[...] = weights
    try:
        yield
    finally:
        flat[...] = own


def average_buffers(trainer, train_ranks: bool = True) -> None:
    """Average the model's buffers (batch-norm running statistics) over the ranks that
    train, so a master or centre evaluated with them sees the workers' statistics."""
    comm = trainer.comm
    buffers = [value for layer in trainer.model.walk() for value in layer.buffers.values()
               if np.issubdtype(np.asarray(value).dtype, np.floating)]
    if comm.size == 1 or not buffers:
        return
    trains = trainer.rule.data_shard(trainer)[0] is not None
    n = comm.allreduce_obj(int(trains), "sum")
    for value in buffers:
        tmp = np.ascontiguousarray(value, dtype=np.float64) * (1.0 if trains else 0.0)
        comm.allreduce_(tmp, "sum")
        value[...] = tmp / max(n, 1)


# -- per-rank state in checkpoints ----------------------------------------------------------
# A checkpoint is written by rank 0 from rank 0's objects. Rules whose ranks hold different
# state (local replicas, local optimizers) gather every rank's state at the end of each
# epoch (collective) so that rank 0's ``state_dict`` holds all of them, and each rank takes
# its own back when a run resumes.
def local_state(trainer, *, weights: bool, **extra: Any) -> dict[str, Any]:
    """This rank's optimizer state (and weights) for ``gather_states``."""
    opt = getattr(trainer.optimizer, "optimizer", trainer.optimizer)
    out: dict[str, Any] = {"optim": opt.state_dict(), **extra}
    if weights:
        out["weights"] = trainer.model.parameters_flat().copy()
    return out


def gather_states(trainer, state: dict[str, Any]) -> list[dict[str, Any]]:
    """Every rank's ``state`` (collective)."""
    return trainer.comm.allgather_obj(state)


def pick_state(rule: str, states: list, comm) -> dict[str, Any] | None:
    """This rank's entry of a resumed checkpoint's per-rank states."""
    if not states:
        return None
    if len(states) != comm.size:
        raise RuleStateError(f"the checkpoint holds the {rule} state of {len(states)} ranks, "
                             f"this run has {comm.size}; resume under mpiexec -n {len(states)}")
    return states[comm.rank]


def restore_local_state(trainer, state: dict[str, Any] | None) -> None:
    if not state:
        return
    if "weights" in state:
        trainer.model.parameters_flat()[...] = state["weights"]
    opt = getattr(trainer.optimizer, "optimizer", trainer.optimizer)
    opt.load_state_dict(state["optim"])


class LocalReplicas(Rule):
    """Base of the rules whose ranks train replicas of their own between exchanges and
    make them equal at each epoch end (localsgd, partial, gossip, diloco): their traffic,
    their counters (int attributes, named by the subclass's ``super().__init__(*counters)``,
    0 at the start, kept in checkpoints and reported with the traffic by ``stats``) and
    every rank's optimizer state, gathered at each epoch end (``keep_states``, collective)
    and taken back by each rank when a run resumes (``resume_replica``)."""

    def __init__(self, *counters: str) -> None:
        self.counters = counters
        self.traffic = Traffic()
        for counter in self.counters:
            setattr(self, counter, 0)
        self._states: list = []
        self._resume = None

    def resume_replica(self, trainer) -> dict[str, Any] | None:
        """Every rank takes rank 0's weights, then, in a resumed run, its own optimizer
        state (collective); returns this rank's resumed state (None in a fresh run)."""
        dist.broadcast_parameters(trainer.model, comm=trainer.comm)
        state = pick_state(self.name, self._resume, trainer.comm)
        restore_local_state(trainer, state)
        self._resume = None
        return state

    def keep_states(self, trainer, **extra: Any) -> None:
        """Gather every rank's optimizer state (and ``extra``) for the checkpoints
        (collective): the replicas are equal now, their optimizers are not."""
        self._states = gather_states(trainer, local_state(trainer, weights=False, **extra))

    def state_dict(self):
        return {**{c: getattr(self, c) for c in self.counters}, "ranks": self._states}

    def load_state_dict(self, state):
        for counter in self.counters:
            setattr(self, counter, int(state.get(counter, 0)))
        self._resume = state.get("ranks")

    def stats(self):
        out = self.traffic.as_dict()
        out.update({c: float(getattr(self, c)) for c in self.counters})
        return out
