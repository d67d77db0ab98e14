"""Worker groups: several ranks that train as one worker (NNLO's ``--n-processes``).

The ranks from ``first`` on are cut into groups of ``size`` ranks. A group never spans two
hosts: the ranks are taken host by host (a rank's host is its hostname, which the launcher
sets per node; the emulated cluster's namespaces have their own), in rank order, and each
host's ranks are cut into groups, so when the launcher places ranks by node a group sits on
one node and only its leader (its first rank) talks across the network. Inside a group the
ranks share one sub-communicator (``Groups.comm``); between groups the leaders talk, on
their own communicator (``Groups.leaders_comm``) or point to point on the parent one.

``worker_groups`` is collective the first time it is called for a communicator (it
gathers the hostnames and splits the communicator) and remembered afterwards, so a rule
may ask for it before the trainer exists (which share of the data files a rank reads) and
again when it binds.
"""
from __future__ import annotations

import socket
import weakref
from dataclasses import dataclass
from typing import Any

__all__ = ["Groups", "GroupLayoutError", "plan_groups", "worker_groups"]

_MEMO: "weakref.WeakKeyDictionary[Any, dict]" = weakref.WeakKeyDictionary()


class GroupLayoutError(ValueError):
    """The ranks of a host do not make whole groups."""


def plan_groups(hosts: list[str], size: int, first: int = 1) -> tuple[tuple[int, ...], ...]:
    """The groups (tuples of ranks, leader first) of the ranks ``first..len(hosts)-1``,
    ``hosts[r]`` being rank r's host: host by host in order of first appearance, each
    host's ranks in rank order cut into groups of ``size``."""
    if size < 1:
        raise GroupLayoutError(f"group size must be >= 1, got {size}")
    by_host: dict[str, list[int]] = {}
    for rank in range(first, len(hosts)):
        by_host.setdefault(hosts[rank], []).append(rank)
    groups: list[tuple[int, ...]] = []
    for host, ranks in by_host.items():
        if len(ranks) % size:
            raise GroupLayoutError(
                f"host {host} has {len(ranks)} worker rank(s) ({', '.join(map(str, ranks))}), "
                f"which do not make whole groups of {size}; start a multiple of {size} "
                f"worker ranks on every host")
        groups += [tuple(ranks[i:i + size]) for i in range(0, len(ranks), size)]
    if not groups:
        raise GroupLayoutError(f"no worker ranks to group (ranks {first} and up)")
    return tuple(groups)


@dataclass(frozen=True)
class Groups:
    """The worker groups of a communicator, as seen from one of its ranks.

    Attributes:
        size: ranks per group.
        groups: each group's ranks (of the parent communicator), leader first.
        rank: this rank (of the parent communicator).
        comm: this rank's group communicator (a rank outside every group: its own, size 1).
        leaders_comm: the leaders' communicator (on other ranks: one of their own).
    """

    size: int
    groups: tuple[tuple[int, ...], ...]
    rank: int
    comm: Any
    leaders_comm: Any

    @property
    def leaders(self) -> tuple[int, ...]:
        return tuple(g[0] for g in self.groups)

    @property
    def order(self) -> tuple[int, ...]:
        """Every grouped rank, group after group (a rank's data share is its place here)."""
        return tuple(r for g in self.groups for r in g)

    def group_of(self, rank: int) -> int | None:
        """The index of the group ``rank`` is in, None if none."""
        for i, group in enumerate(self.groups):
            if rank in group:
                return i
        return None

    @property
    def mine(self) -> tuple[int, ...]:
        index = self.group_of(self.rank)
        return () if index is None else self.groups[index]

    @property
    def is_leader(self) -> bool:
        return self.rank in self.leaders

    def share(self, rank: int) -> int | None:
        """``rank``'s data share among the grouped ranks (None: it is in no group)."""
        order = self.order
        return order.index(rank) if rank in order else None


def worker_groups(comm, size: int, first: int = 1) -> Groups:
    """The groups of ``size`` ranks of ``comm``'s ranks ``first`` and up (collective on the
    first call for ``comm``; see the module's docstring). Raises ``GroupLayoutError``
    when a host's ranks do not make whole groups (on every rank alike)."""
    memo = _MEMO.setdefault(comm, {})
    key = (int(size), int(first))
    if key in memo:
        return memo[key]
    hosts = comm.allgather_obj(socket.gethostname())
    groups = plan_groups(list(hosts), int(size), int(first))
    mine = next((i for i, g in enumerate(groups) if comm.rank in g), None)
    # every rank takes part in both splits; ranks outside a group get a colour of their own
    colour = mine if mine is not None else len(groups) + comm.rank
    group_comm = comm.split(colour, comm.rank)
    leader = any(comm.rank == g[0] for g in groups)
    leaders_comm = comm.split(0 if leader else 1 + comm.rank, comm.rank)
    memo[key] = Groups(int(size), groups, comm.rank, group_comm, leaders_comm)
    return memo[key]
