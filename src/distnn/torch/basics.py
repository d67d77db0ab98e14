"""Horovod's basics on distnn's communicator: init/shutdown, ranks and sizes, what the
build supports, reduction ops, process sets and ``join``.

distnn runs over MPI on CPUs: ``mpi_built()``/``mpi_enabled()`` are True when mpi4py
works; gloo, NCCL, DDL, oneCCL, CUDA and ROCm are not built (False), as on a CPU-only
Horovod build. ``cross_rank``/``cross_size`` are a rank's index and the size of
the group of ranks with its local rank (one per host), as Horovod's cross communicator.
"""
from __future__ import annotations

import time
from typing import Iterable

import numpy as np

from .. import distributed as dist
from ..distributed import Communicator, rank, size
from ..distributed.join import JoinableComm
from .background import make_worker

# Reduction ops: Horovod's names (their values are distnn's op strings).
Average = "average"
Sum = "sum"
Adasum = "adasum"
Min = "min"
Max = "max"
Product = "product"

_state: dict = {"initialized": False, "sets": {}, "next_id": 1, "channels": {}, "worker": None}


def init(comm: Communicator | None = None, process_sets: Iterable | None = None):
    """Start distnn's MPI communicator (Horovod's ``hvd.init``; returns the Communicator).
    ``comm``: a distnn Communicator or an mpi4py communicator (default COMM_WORLD);
    ``process_sets``: ProcessSets (or rank lists) to register now, on every rank alike."""
    if comm is not None and hasattr(comm, "Get_rank"):  # an mpi4py communicator
        comm = dist.MPIComm(comm)
    c = dist.init(comm)
    _state["initialized"] = True
    w = _state["worker"]
    if w is None or w.base is not c:  # every rank calls init: the place to make it
        if w is not None:
            w.stop()
        w = make_worker(c)
        if w is not None:
            w.base = c
        _state["worker"] = w
    for ps in process_sets or []:
        add_process_set(ps)
    return c


def shutdown() -> None:
    """Forget the process sets; MPI itself stays up until the interpreter exits (mpi4py
    finalizes it), so ``init()`` may be called again."""
    for ps in list(_state["sets"].values()):
        remove_process_set(ps)
    if _state["worker"] is not None:
        _state["worker"].stop()
    _state.update(initialized=False, sets={}, next_id=1, channels={}, worker=None)


def is_initialized() -> bool:
    return _state["initialized"]


def _c(comm: Communicator | None) -> Communicator:
    return comm if comm is not None else dist.get_comm()


def cross_rank(comm: Communicator | None = None) -> int:
    """This rank's index among the ranks with its local rank, one per host (Horovod's
    cross communicator); collective: every rank must call it."""
    c = _c(comm)
    if c.size == 1:
        return 0
    locals_ = c.allgather_obj(c.local_rank)
    return sum(1 for r in range(c.rank) if locals_[r] == c.local_rank)


def cross_size(comm: Communicator | None = None) -> int:
    """Number of ranks with this rank's local rank (the number of hosts when every host
    runs as many ranks); collective."""
    c = _c(comm)
    return c.allgather_obj(c.local_rank).count(c.local_rank) if c.size > 1 else 1


def is_homogeneous(comm: Communicator | None = None) -> bool:
    """True when every host runs the same number of ranks (collective)."""
    c = _c(comm)
    return len(set(c.allgather_obj(c.local_size))) == 1


def mpi_built() -> bool:
    return dist.mpi_available()


def mpi_enabled() -> bool:
    return dist.mpi_available()


def mpi_threads_supported() -> bool:
    """True when MPI was initialized with MPI_THREAD_MULTIPLE (distnn does not need it)."""
    if not dist.mpi_available():
        return False
    from ..distributed.comm import _mpi
    MPI = _mpi()
    return MPI.Query_thread() == MPI.THREAD_MULTIPLE


def _not_built() -> bool:
    """False: distnn communicates over MPI only; Horovod's probes for its other backends
    and accelerators all answer no."""
    return False


gloo_built = gloo_enabled = nccl_built = ddl_built = ccl_built = _not_built
cuda_built = rocm_built = _not_built


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Horovod's timeline is not recorded by distnn (use ``distnn.training.Profiler`` or
    the optimizer's counters); accepted and ignored so scripts run unchanged."""


def stop_timeline() -> None:
    """See ``start_timeline``."""


class ProcessSet:
    """A subset of the ranks that collectives can run on (Horovod's ``hvd.ProcessSet``),
    over an MPI sub-communicator made by ``add_process_set`` (or ``init(process_sets=)``).

    Args:
        ranks: the global ranks in the set, or an mpi4py communicator of its members (as
            in Horovod: every rank builds it; ranks outside pass ``MPI.COMM_NULL``).

    Example:
        evens = hvd.add_process_set([0, 2])
        if evens.included(): hvd.allreduce(t, process_set=evens)
    """

    def __init__(self, ranks: Iterable[int] | None = None):
        if ranks is not None and hasattr(ranks, "Get_rank"):  # an mpi4py communicator
            ranks = _members(ranks)
        self.ranks = None if ranks is None else sorted({int(r) for r in ranks})
        self.process_set_id: int | None = None
        self._comm: Communicator | None = None
        self._worker = None

    @property
    def comm(self) -> Communicator:
        if self is global_process_set:
            return dist.get_comm()
        if self.process_set_id is None:
            raise ValueError(f"process set {self.ranks} is not registered: call "
                             "hvd.add_process_set(...) on every rank first")
        if not self.included():
            raise ValueError(f"rank {rank()} is not in process set {self.ranks}: only its "
                             "members may call collectives on it")
        return self._comm

    def included(self) -> bool:
        return self is global_process_set or rank() in (self.ranks or [])

    def size(self) -> int:
        return size() if self is global_process_set else len(self.ranks or [])

    def rank(self) -> int:
        """This rank's index in the set (-1 when it is not a member)."""
        if self is global_process_set:
            return rank()
        return self.ranks.index(rank()) if self.included() else -1

    def __eq__(self, other) -> bool:
        return (isinstance(other, ProcessSet) and (self is other or (
            self is not global_process_set and other is not global_process_set
            and self.ranks == other.ranks)))

    __hash__ = object.__hash__

    def __repr__(self) -> str:
        if self is global_process_set:
            return "ProcessSet(global)"
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks})"


def _members(mpi_comm) -> list[int]:
    """The global ranks of an mpi4py communicator's members (collective over all ranks, so
    that ranks outside it, holding COMM_NULL, learn them too)."""
    world = dist.get_comm()
    inside = mpi_comm != world.MPI.COMM_NULL
    key = None
    if inside:
        key = tuple(dist.MPIComm(mpi_comm).allgather_obj(world.rank))
    keys = world.allgather_obj(key)
    mine = key if inside else None
    if mine is None:  # outside: the set is the members' one, if there is only one
        sets = {k for k in keys if k is not None}
        if len(sets) != 1:
            raise ValueError("ProcessSet(comm): ranks outside the communicator cannot tell "
                             f"which of the sets {sorted(sets)} it is; pass the rank list")
        mine = sets.pop()
    return list(mine)


global_process_set = ProcessSet()
global_process_set.process_set_id = 0


def add_process_set(process_set: ProcessSet | Iterable[int]) -> ProcessSet:
    """Register a process set (collective over all ranks, same order everywhere)."""
    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    world = dist.get_comm()
    if not ps.ranks or any(r < 0 or r >= world.size for r in ps.ranks):
        raise ValueError(f"process set ranks must be in [0, {world.size}), got {ps.ranks}")
    if ps.process_set_id is not None:
        raise ValueError(f"{ps} is already registered")
    if any(other.ranks == ps.ranks for other in _state["sets"].values()):
        raise ValueError(f"a process set with ranks {ps.ranks} is already registered")
    member = world.rank in ps.ranks
    # color by the set's first rank: sets built from communicators (ProcessSet(comm)) may
    # differ between ranks, each rank registering its own
    sub = world.split(ps.ranks[0] if member else world.size, world.rank)
    ps._comm = sub if member else None
    ps._worker = make_worker(sub) if member else None
    ps.process_set_id = _state["next_id"]
    _state["next_id"] += 1
    _state["sets"][ps.process_set_id] = ps
    return ps


def remove_process_set(process_set: ProcessSet) -> bool:
    """Unregister a process set (every rank alike); False if it was not registered."""
    if process_set is global_process_set or process_set.process_set_id is None:
        return False
    _state["sets"].pop(process_set.process_set_id, None)
    process_set.process_set_id = None
    process_set._comm = None
    if process_set._worker is not None:
        process_set._worker.stop()
        process_set._worker = None
    return True


def worker(process_set=None):
    """The background Worker of a process set (None: its queued collectives run when
    called)."""
    if process_set is None or process_set is global_process_set:
        return _state["worker"] if _state["initialized"] else None
    return process_set._worker


def channel(comm: Communicator | None = None, process_set: ProcessSet | None = None):
    """The communicator a collective runs on: ``comm`` if given, else the process set's;
    the global one is wrapped in a ``JoinableComm`` so ``join()`` can serve it."""
    if comm is None:
        ps = process_set if process_set is not None else global_process_set
        comm = ps.comm
        if ps is not global_process_set:
            return comm
    if comm is dist.get_comm() and comm.size > 1:
        key = id(comm)
        if key not in _state["channels"] or _state["channels"][key].comm is not comm:
            _state["channels"][key] = JoinableComm(comm)
        return _state["channels"][key]
    return comm


def join(device: int = -1) -> int:
    """This rank is out of data: take part, with zeros, in the all-reduces of the ranks
    still training (their averages stay divided by the full size) until every rank has
    joined; returns the rank that joined last, on every rank. ``device`` is accepted for
    Horovod's signature (CPU only)."""
    c = channel()
    if not isinstance(c, JoinableComm):
        return c.rank
    entered = time.time()
    w = worker()
    queued = w.submit(lambda wc: wc.join()) if w is not None else None  # the async ones
    last = c.join()
    if queued is None:
        return last
    queued.wait()
    # two channels joined: the last rank is the one that entered join() last
    times = c.comm.allgather_obj(entered)
    return max(range(len(times)), key=lambda r: (times[r], r))


def barrier(process_set: ProcessSet | None = None) -> None:
    """Wait for every rank of the set; the ``*_async`` collectives every rank had queued
    before it have then run too (as in Horovod, whose barrier is queued after them)."""
    c = channel(process_set=process_set)
    c.barrier()
    w = worker(process_set)
    if w is not None:
        low = np.array([-w.submitted], dtype=np.int64)
        c.allreduce_(low, "max")  # join-safe: joined ranks count as no bound
        w.wait_completed(min(-int(low[0]), w.submitted))
