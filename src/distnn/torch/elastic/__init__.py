"""Horovod's elastic API for ``distnn.torch`` (``hvd.elastic``): ``run``, ``State``,
``ObjectState``, ``TorchState``, ``ElasticSampler``, ``HostsUpdatedInterrupt``.

The state is committed in memory (``state.commit()``) and restored from that commit after a
reset. How the worlds change (docs/horovod.md, "Elastic training"): MPICH cannot shrink or
grow a running world, so ``distnn launch`` (``launch/elastic.py``) restarts the whole world
when a rank or host dies or the host discovery script adds or removes hosts. Rank 0 hands
every commit to the supervisor, whose memory carries the last one into the next world;
there the first call of a ``@hvd.elastic.run`` function loads it on rank 0, runs the reset
callbacks and broadcasts it (``sync``), so the job goes on from its last commit, with no
file written by the user. Under plain ``mpiexec`` commits and restores work the same, but
a lost rank ends the job and ``check_host_updates()`` never raises.

Example (Horovod's, with the import changed)::

    import distnn.torch as hvd
    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            ...; state.commit()
    state = hvd.elastic.TorchState(model, optimizer, epoch=0, batch=0)
    train(state)          # distnn launch --host_discovery_script ./hosts.sh -- python x.py
"""
from __future__ import annotations

import functools
import os
import sys
from typing import Callable

from ...launch.commits import ENV_WORLD, EXIT_RESET
from ..basics import init, shutdown
from .sampler import ElasticSampler
from .state import HorovodInternalError, HostsUpdatedInterrupt, ObjectState, State, link
from .torch_state import TorchState

__all__ = ["run", "State", "ObjectState", "TorchState", "ElasticSampler",
           "HostsUpdatedInterrupt", "HorovodInternalError"]


def run(func: Callable) -> Callable:
    """Decorate the training function ``func(state, ...)``: it starts from the state that
    rank 0 holds (``state.sync()``), and after a reset goes on from the last commit.

    - ``HorovodInternalError`` raised inside: every rank restores the last commit, the
      reset callbacks run, ``func`` is called again.
    - ``HostsUpdatedInterrupt`` (at ``commit()``/``check_host_updates()``): under
      ``distnn launch``, rank 0 hands the current state to the supervisor and every rank
      exits (status ``EXIT_RESET``) so that the world restarts on the new hosts; without
      it, the reset happens in place as in Horovod.
    - In a restarted world (``distnn launch``), the first call loads the last commit of
      the previous world on rank 0 and runs the reset callbacks before syncing.

    Collectives must not be called between the start of the script and this function's
    sync on some ranks only (as in Horovod).
    """
    @functools.wraps(func)
    def wrapper(state: State, *args, **kwargs):
        reset = _carry_in(state)
        skip_sync = False
        while True:
            if reset:
                state.on_reset()
            try:
                if not skip_sync:
                    state.sync()
                return func(state, *args, **kwargs)
            except HorovodInternalError:
                state.restore()
                skip_sync = False
            except HostsUpdatedInterrupt as exc:
                if link().supervised:
                    _restart_world(state)
                skip_sync = exc.skip_sync
            shutdown()
            init()
            reset = True
    return wrapper


def _carry_in(state: State) -> bool:
    """Once per process, under ``distnn launch``: rank 0 loads the commit an earlier world
    left with the supervisor. Whether one came, on every rank."""
    lk = link()
    if not lk.supervised or getattr(lk, "carried", False):
        return False
    lk.carried = True
    came = False
    if state._rank() == 0:
        payload = lk.client().get()
        if payload is not None:
            state._loads(payload)
            came = True
            scalars = ", ".join(f"{k}={v!r}" for k, v in vars(state).items()
                                if not k.startswith("_") and type(v) in (int, float, bool))
            print(f"hvd.elastic: world {os.environ.get(ENV_WORLD, '?')} starts from the "
                  f"last commit ({len(payload):,} bytes) held by distnn launch"
                  + (f": {scalars}" if scalars else ""), file=sys.stderr, flush=True)
    return bool(state._bcast_object(came))


def _restart_world(state: State) -> None:
    """Hosts changed under ``distnn launch``: rank 0 hands the current state over, then
    every rank exits so that the supervisor starts the next world."""
    state.save()
    if state._rank() == 0:
        link().client().put(state._dumps())
    state._bcast_object(None)  # no rank leaves before the state is with the supervisor
    raise SystemExit(EXIT_RESET)
