"""Several masters (NNLO's n-masters): a top master and M sub-masters.

With M > 1, rank 0 is the top master, ranks 1..M are sub-masters and the workers (ranks
M+1 and up, each a rank or a group of ranks) are split among the sub-masters in contiguous
blocks. Each sub-master serves its workers exactly as the one master does (the rule's
``master_apply``); after every ``sync_every`` of its own updates, and when its workers
have finished the epoch, it exchanges with the top master as one worker of it: it sends
``rule.sub_payload`` (downpour: how far its weights moved since the last exchange; easgd:
its centre), the top master folds it in with ``rule.top_apply`` and answers with its
weights, which the sub-master takes with ``rule.sub_apply_reply``. Validation, checkpoints
and the final model use the top master's weights. The top master receives one message per
``sync_every`` sub-master updates instead of one per worker message (``stats()``:
``top_received`` on rank 0, ``ups`` on a sub-master).
"""
from __future__ import annotations

import numpy as np

from .base import RuleArgumentError, whole_argument

__all__ = ["MasterTree", "check_masters", "role_of"]


def check_masters(rule: str, masters, synchronous: bool) -> int:
    masters = whole_argument(rule, "masters", masters)
    if masters > 1 and synchronous:
        raise RuleArgumentError("masters", f"{rule}: several masters serve asynchronous "
                                f"workers; masters={masters} with synchronous=True is not "
                                "built: drop one of them")
    return masters


def _ranks(ranks) -> str:
    """'1,2' or, for three and more in a row, '3-9'."""
    runs: list[list[int]] = []
    for r in ranks:
        if runs and r == runs[-1][-1] + 1:
            runs[-1].append(r)
        else:
            runs.append([r])
    return ",".join(f"{run[0]}-{run[-1]}" if len(run) > 2 else ",".join(map(str, run))
                    for run in runs)


def role_of(rule, rank: int) -> str:
    """This rank's (``rank``'s) role under a bound master/worker ``rule``
    (``Rule.role``): the master, the top master, a sub-master and whom it serves, a worker
    (in a group) and who serves it."""
    tree, leaders, many = rule._tree, rule._leaders, rule.group_size > 1

    def workers(ranks) -> str:
        s = "s" * (len(ranks) > 1)
        return (f"worker group{s} led by rank{s} " if many else f"worker{s} ") + _ranks(ranks)

    if rank == 0:
        return "top master" if tree is not None else f"master of {workers(leaders)}"
    if tree is not None and rank in tree.clients:
        return (f"sub-master of {workers(tree.clients[rank])} (master group {rank - 1} of "
                f"{len(tree.clients)})")
    group = rule._group.groups.mine if rule._group is not None else (rank,)
    served = "" if tree is None else f", served by sub-master {tree.master_of(group[0])}"
    return (f"worker in group {_ranks(group)}" if many else "worker") + served


class MasterTree:
    """Who serves whom with M sub-masters, and a sub-master's exchange with the top.

    Args:
        rule: the ``MasterWorker`` rule (its arithmetic and its point-to-point helpers).
        comm: the run's communicator.
        leaders: the workers' ranks (a group's leader stands for its group).
    """

    def __init__(self, rule, comm, leaders: tuple[int, ...]):
        m = rule.masters
        if len(leaders) < m:
            raise RuleArgumentError("masters", f"{rule.name}: {m} sub-masters need at least "
                                    f"{m} workers, this run has {len(leaders)}; start more "
                                    "ranks or fewer masters")
        self.rule = rule
        self.rank = comm.rank
        parts = np.array_split(np.asarray(leaders, dtype=np.int64), m)
        self.clients = {1 + s: tuple(int(r) for r in part) for s, part in enumerate(parts)}
        self._master = {r: sub for sub, ranks in self.clients.items() for r in ranks}
        self._since = 0      # sub-master: updates since its last exchange with the top
        self._samples = 0
        self._synced: np.ndarray | None = None
        self._reply: np.ndarray | None = None
        self.ups = 0         # sub-master: exchanges with the top master
        self.top_received = 0

    @property
    def subs(self) -> tuple[int, ...]:
        return tuple(self.clients)

    def master_of(self, rank: int) -> int:
        return self._master[rank]

    def n_workers(self, rank: int) -> int:
        """The clients of ``rank``'s master (rank 0: the sub-masters)."""
        if rank == 0:
            return len(self.clients)
        return len(self.clients[rank if rank in self.clients else self._master[rank]])

    def serve(self, trainer, progress=None) -> None:
        rule, comm = self.rule, trainer.comm
        if comm.rank == 0:
            before = rule.traffic.received
            rule.serve_clients(trainer, self.subs, rule.top_apply, progress)
            self.top_received += rule.traffic.received - before
            return
        weights = trainer.model.parameters_flat()
        if self._reply is None:
            self._reply = np.zeros(rule.reply_size(weights.size), weights.dtype)
        self._synced = weights.copy()  # every epoch starts from the top master's weights
        rule.serve_clients(trainer, self.clients[comm.rank], rule.master_apply, None)
        if self._since:
            self._exchange(trainer)
        rule.send_done(comm, 0, weights.dtype)

    def after_update(self, trainer, samples: int) -> None:
        """Called by a master after each of its updates."""
        if trainer.comm.rank == 0:
            return
        self._since += 1
        self._samples += samples
        if self._since >= self.rule.sync_every:
            self._exchange(trainer)

    def _exchange(self, trainer) -> None:
        rule = self.rule
        payload = rule.sub_payload(trainer, self._synced)
        reply = rule.push(trainer.comm, 0, payload, self._samples, self._reply)
        rule.sub_apply_reply(trainer, reply)
        self._synced[...] = trainer.model.parameters_flat()
        self.ups += 1
        self._since = 0
        self._samples = 0

    def stats(self) -> dict[str, float]:
        if self.rank == 0:
            return {"top_received": float(self.top_received)}
        if self.rank in self.clients:
            return {"ups": float(self.ups)}
        return {}
