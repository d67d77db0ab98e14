"""The world of a search: one coordinator and blocks of ranks, and how they talk.

World rank 0 is the coordinator; ranks ``1 + b*S .. S + b*S`` form block ``b`` (``S`` =
block size), a sub-communicator from ``Communicator.split`` that trains one candidate at a
time, data-parallel. Each block's first rank (its *leader*) shares a two-rank
communicator with the coordinator, a ``Channel`` for request/reply messages.

Nobody spins while waiting: MPICH's blocking calls busy-poll a core, which on a machine
with fewer cores than ranks would steal it from the blocks that train. A rank that may
wait long posts a non-blocking all-reduce of one number as a signal and tests it between
short sleeps (``distributed.coordination.lazy_barrier``); the blocking object broadcast
that follows only runs once the other side is known to be there.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..distributed.coordination import lazy_barrier

__all__ = ["LayoutError", "BlockLayout", "Channel", "block_count"]

POLL_S = 0.005


class LayoutError(ValueError):
    """The number of ranks does not split into one coordinator and whole blocks."""


def block_count(size: int, block_size: int) -> int:
    """Number of blocks of ``block_size`` ranks next to the coordinator on ``size`` ranks
    (a single process runs the trials itself: 1 block, no coordinator rank).

    Raises:
        LayoutError: the ranks do not split; the message says which counts do.
    """
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise LayoutError(f"--block_size must be an integer >= 1, got {block_size!r}")
    if size == 1 and block_size == 1:
        return 1
    workers = size - 1
    if workers < block_size or workers % block_size:
        fits = ", ".join(str(1 + block_size * n) for n in range(1, 4))
        raise LayoutError(
            f"--block_size {block_size}: {size} rank{'s do' if size != 1 else ' does'} not "
            f"split into 1 "
            f"coordinator + blocks of {block_size} rank{'s' * (block_size != 1)} "
            f"({workers} left for blocks); start 1 + a multiple of {block_size} ranks "
            f"(mpiexec -n {fits}, ...) or change --block_size")
    return workers // block_size


class Channel:
    """Request/reply messages between a block leader and the coordinator over a
    communicator of two ranks (coordinator = rank 0, leader = rank 1).

    Every exchange is the same sequence of collectives on both sides: signal (the
    leader's message is ready), broadcast from the leader, signal (the reply is ready),
    broadcast from the coordinator.
    """

    def __init__(self, comm):
        if comm.size != 2:
            raise ValueError(f"a Channel needs a communicator of 2 ranks, got {comm.size}")
        self.comm = comm
        self._signal = None

    # -- the leader's side ------------------------------------------------------------
    def request(self, message: Any) -> Any:
        """Send ``message`` to the coordinator and return its reply (leader only)."""
        lazy_barrier(self.comm, POLL_S)
        self.comm.bcast_obj(message, root=1)
        lazy_barrier(self.comm, POLL_S)
        return self.comm.bcast_obj(None, root=0)

    # -- the coordinator's side -------------------------------------------------------
    def listen(self) -> None:
        """Post the signal of the next request (coordinator only)."""
        self._signal = self.comm.iallreduce_(np.zeros(1))

    def ready(self) -> bool:
        """True once the leader has sent a request (drives MPI progress)."""
        if self._signal is None:
            return False
        test = getattr(self._signal, "test", None)
        return True if test is None else bool(test())

    def receive(self) -> Any:
        """The pending request (after ``ready()`` returned True)."""
        self._signal.wait()
        self._signal = None
        return self.comm.bcast_obj(None, root=1)

    def reply(self, message: Any) -> None:
        """Answer the request ``receive`` returned."""
        self.comm.iallreduce_(np.zeros(1)).wait()
        self.comm.bcast_obj(message, root=0)


def watch_stalls_like(comm, inspector):
    """A stall inspector on ``comm`` with the settings of ``inspector``."""
    from ..distributed.stall import watch_stalls
    return watch_stalls(comm, inspector.warning, inspector.timeout, inspector.hint)


class BlockLayout:
    """This rank's place in a search world (made collectively by every rank).

    Attributes:
        world: the whole communicator.
        block_size, n_blocks: ranks per block and number of blocks.
        block: this rank's block number, None on the coordinator.
        comm: this rank's block communicator (None on the coordinator).
        is_leader: rank 0 of its block.
        channel: the leader's ``Channel`` to the coordinator.
        channels: the coordinator's ``Channel`` per block.
        sequential: one process that runs the trials itself (world size 1).
    """

    def __init__(self, world, block_size: int):
        self.world = world
        self.block_size = block_size
        self.n_blocks = block_count(world.size, block_size)
        self.sequential = world.size == 1
        self.channel: Channel | None = None
        self.channels: list[Channel] = []
        self.inspector = None  # the stall inspector watching ``comm`` (see watch)
        self._left: list = []  # block communicators given up (see renew)
        self._renewals = 0
        if self.sequential:
            self.block, self.comm, self.is_leader = 0, world, True
            return
        rank = world.rank
        self.block = None if rank == 0 else (rank - 1) // block_size
        color = 0 if self.block is None else 1 + self.block
        comm = world.split(color, rank)
        self.comm = None if self.block is None else comm
        self.is_leader = self.block is not None and self.comm.rank == 0
        for b in range(self.n_blocks):
            leader = 1 + b * block_size
            member = rank in (0, leader)
            pair = world.split(0 if member else 1, rank)
            if member and rank == 0:
                self.channels.append(Channel(pair))
            elif member:
                self.channel = Channel(pair)

    def watch(self) -> None:
        """Install the stall inspector on this rank's block communicator, its waits made
        interruptible: a trial that fails on some ranks only ends its block's waits with
        ``PeerFailed`` instead of a hang (``driver.execute_trial``)."""
        if self.comm is None or self.comm.size < 2:
            return
        from ..distributed.stall import watch_stalls
        inspector = watch_stalls(self.comm)  # build_run sets --stall_warning/_timeout
        if inspector is not None:
            inspector.interruptible = True
        self.inspector = inspector

    def renew(self):
        """A new block communicator for the next trial, after one failed on some of the
        block's ranks: the old one may hold collectives that will never complete, so it is
        left (with its requests) and the block's ranks make a new one by themselves
        (``MPI_Comm_create_group``: the coordinator and the other blocks take no part)."""
        old, inspector = self.comm, self.inspector
        self._left.append((old, inspector))
        self._renewals += 1
        first = 1 + self.block * self.block_size
        self.comm = self.world.subgroup(range(first, first + self.block_size), self._renewals)
        if inspector is not None:
            inspector.close()  # collective on its own duplicate communicator, still sound
            new = watch_stalls_like(self.comm, inspector)
            new.interruptible = True
            self.inspector = new
        return self.comm

    @property
    def is_coordinator(self) -> bool:
        return self.sequential or self.block is None

    def __repr__(self) -> str:
        role = "coordinator" if self.block is None else f"block {self.block}"
        return (f"BlockLayout({role}, {self.n_blocks} block(s) of {self.block_size}, "
                f"world {self.world.size})")
