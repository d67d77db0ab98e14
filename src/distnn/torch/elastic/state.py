"""Elastic state: what a job commits (in memory) and restores after a failure or a change
of hosts, as Horovod's ``State`` and ``ObjectState``.

``commit()`` keeps a copy of the state in this process's memory and, when the job runs
under ``distnn launch`` (the environment names its commit store), rank 0 also hands the
committed bytes to the supervisor, whose memory carries them into the next world (MPICH
cannot shrink a world, so a world that lost a rank is restarted; see ``launch/elastic.py``).
``commit()`` then checks for host updates: rank 0 learns from the supervisor whether hosts
were added or removed and broadcasts it, so every rank raises ``HostsUpdatedInterrupt`` at
the same commit.
"""
from __future__ import annotations

import copy
import io
import os
import pickle
from typing import Any, Callable, Iterable

from ...launch.commits import ENV_STORE, ENV_VERSION, StoreClient

__all__ = ["State", "ObjectState", "HostsUpdatedInterrupt", "HorovodInternalError"]


class HorovodInternalError(RuntimeError):
    """Horovod's error type for failed collectives: ``hvd.elastic.run`` restores the last
    commit and runs the function again (distnn's own collectives raise RuntimeError and its
    subclasses; a rank that dies ends the MPI world, which ``distnn launch`` restarts)."""


class HostsUpdatedInterrupt(RuntimeError):
    """Hosts were added or removed: raised on every rank at the same ``commit()`` or
    ``check_host_updates()``. ``skip_sync``: only removals (Horovod's meaning)."""

    def __init__(self, skip_sync: bool = False):
        super().__init__("hosts were added or removed" if not skip_sync else
                         "hosts were removed")
        self.skip_sync = skip_sync


class _Link:
    """This process's view of the supervisor: rank 0 holds the connection."""

    def __init__(self):
        self.supervised = bool(os.environ.get(ENV_STORE))
        self.start_version = int(os.environ.get(ENV_VERSION, "0") or 0)
        self._client: StoreClient | None = None

    def client(self) -> StoreClient:
        if self._client is None:
            self._client = StoreClient.from_env()
        return self._client


_LINK: list[_Link] = []


def link() -> _Link:
    if not _LINK:
        _LINK.append(_Link())
    return _LINK[0]


def _default_bcast(obj: Any) -> Any:
    from ..functions import broadcast_object
    return broadcast_object(obj, 0)


def _default_rank() -> int:
    from ...distributed import rank
    return rank()


class State:
    """State kept across workers and resets (Horovod's ``State``).

    Args:
        bcast_object: ``f(obj) -> obj``: rank 0's object on every rank (default:
            ``distnn.torch.broadcast_object`` from rank 0).
        get_rank: ``f() -> int``, this process's rank (default ``distnn.torch.rank``).

    Subclasses define ``save``, ``restore``, ``sync`` and how the committed state travels
    as bytes (``_dumps``/``_loads``).
    """

    def __init__(self, bcast_object: Callable | None = None, get_rank: Callable | None = None):
        self._bcast_object = bcast_object or _default_bcast
        self._rank = get_rank or _default_rank
        self._reset_callbacks: list[Callable[[], Any]] = []

    def register_reset_callbacks(self, callbacks: Iterable[Callable[[], Any]]) -> None:
        """Functions called after every reset (a world restarted, or hosts changed), e.g.
        to scale the learning rate to the new number of ranks."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def commit(self) -> None:
        """Keep the state in memory (rank 0 also hands it to ``distnn launch``), then check
        for host updates (raises ``HostsUpdatedInterrupt`` on every rank when hosts
        changed)."""
        self.save()
        news = self._hand_over() if link().supervised and self._rank() == 0 else None
        self.check_host_updates(news)

    def _hand_over(self) -> tuple[int, str]:
        """Rank 0: the committed state to the supervisor; its (hosts version, change)."""
        return link().client().put(self._dumps())

    def check_host_updates(self, _news: tuple[int, str] | None = None) -> None:
        """Raise ``HostsUpdatedInterrupt`` on every rank when the supervisor reported hosts
        added or removed since this world started (without ``distnn launch``, never: the
        hosts cannot change)."""
        lk = link()
        if not lk.supervised:
            return
        if self._rank() == 0 and _news is None:
            _news = lk.client().poll()
        version, kind = self._bcast_object(_news)
        if version > lk.start_version and kind:
            raise HostsUpdatedInterrupt(skip_sync=kind == "removed")

    def save(self) -> None:
        """Keep the current state in this process's memory."""
        raise NotImplementedError

    def restore(self) -> None:
        """Go back to the last committed state."""
        raise NotImplementedError

    def sync(self) -> None:
        """Rank 0's state on every rank."""
        raise NotImplementedError

    def reset(self) -> None:
        """Called after a reset, before ``sync`` (for subclasses)."""

    def _dumps(self) -> bytes:
        raise NotImplementedError

    def _loads(self, payload: bytes) -> None:
        """Make ``payload`` (an earlier world's commit) the committed state, and restore
        it."""
        raise NotImplementedError


class ObjectState(State):
    """State of plain Python objects, given as keyword arguments and kept as attributes
    (Horovod's ``ObjectState``; commits are deep copies, so restoring also undoes changes
    made in place, e.g. to a list).

    Example:
        state = ObjectState(epoch=0, losses=[])
        state.epoch = 3; state.commit(); state.epoch = 4; state.restore()   # epoch 3
    """

    def __init__(self, bcast_object: Callable | None = None, get_rank: Callable | None = None,
                 **kwargs):
        self._saved_state = copy.deepcopy(kwargs)
        self._set_attrs()
        super().__init__(bcast_object=bcast_object, get_rank=get_rank)

    def save(self) -> None:
        self._saved_state = {k: copy.deepcopy(getattr(self, k)) for k in self._saved_state}

    def restore(self) -> None:
        self._set_attrs()

    def sync(self) -> None:
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state)
            self._set_attrs()

    def _set_attrs(self) -> None:
        for name, value in self._saved_state.items():
            object.__setattr__(self, name, copy.deepcopy(value))

    def _dumps(self) -> bytes:
        buf = io.BytesIO()
        pickle.dump(self._saved_state, buf, protocol=pickle.HIGHEST_PROTOCOL)
        return buf.getvalue()

    def _loads(self, payload: bytes) -> None:
        self._saved_state = pickle.loads(payload)
        self.restore()
