"""Which checkpoint ``--resume`` continues from, agreed by every rank.

Shared storage (the default): every rank reads the same file; when the newest will not
load (truncated, corrupt, missing) all of them take the previous one kept beside it
(``ck.prev.npz``, ``training.checkpoint.load_latest``), and rank 0 says so in one line.

Node-local checkpoints (``--every_rank_writes``, PyDTNN's ``--shared_storage false``): each
node reads its own copy, and the copies may differ: one node's disk filled (its write
failed while the others' succeeded), one node's file is corrupt, or a host that was
dropped and taken back holds an older copy (or none). The ranks then agree on the newest
global step any rank can load, and the ranks whose copy is older, missing or corrupt get
that checkpoint from the lowest rank holding it (one broadcast over MPI): every rank
resumes from the same state, and their nodes' next checkpoint replaces the stale copy.
"""
from __future__ import annotations

import socket
import sys
from typing import Any

from .errors import RunError, agreed

__all__ = ["load_resume"]


def load_resume(comm, path: str, per_node: bool) -> Any:
    """The ``Checkpoint`` this rank resumes from; rank 0 prints one warning line on stderr
    when it is not the newest file (even under --quiet: work is redone).

    Raises:
        RunError on every rank ("--resume: ...") when no rank can load a checkpoint.
    """
    from ..training.checkpoint import load_latest
    if not per_node or comm.size == 1:
        state = agreed(comm, "--resume", lambda: load_latest(path))
        _warn(comm, [state.fallback_note(path)])
        return state
    state, error = None, None
    try:
        state = load_latest(path)
    except (OSError, ValueError) as exc:
        error = str(exc)
    mine = (state.global_step if state is not None else -1, error,
            state.fallback_note(path) if state is not None else None, socket.gethostname())
    everyone = comm.allgather_obj(mine)
    hosts = [h for *_, h in everyone]
    everyone = [(step, e, n) for step, e, n, _ in everyone]
    best = max(step for step, _, _ in everyone)
    if best < 0:
        first = next(e for _, e, _ in everyone if e)
        raise RunError(f"--resume: no rank could load its node's checkpoint: [rank 0] {first}"
                       if error is None or error == first else f"--resume: {error}")
    source = min(r for r, (step, _, _) in enumerate(everyone) if step == best)
    stale = [r for r, (step, _, _) in enumerate(everyone) if step != best]
    notes = [f"[rank {r}] {n}" for r, (step, _, n) in enumerate(everyone)
             if n and step == best]
    if stale:
        sent = comm.bcast_obj((state.path, state.meta, state.arrays)
                              if comm.rank == source else None, source)
        if comm.rank in stale:
            from ..training.checkpoint import Checkpoint
            state = Checkpoint(sent[0], sent[1], sent[2])
        where = (lambda r: f"rank {r} on host {hosts[r]}") if len(set(hosts)) > 1 else \
            (lambda r: f"rank {r}")
        why = ", ".join(f"{where(r)}: " + (e.split("; ")[0] if step < 0 else
                                           f"global step {step}")
                        for r, (step, e, _) in enumerate(everyone) if r in stale)
        notes.append(f"node-local checkpoints differ ({why}); every rank resumes from "
                     f"global step {best}, rank {source}'s copy, sent over MPI to rank"
                     f"{'s' * (len(stale) > 1)} {','.join(map(str, stale))}")
    _warn(comm, notes)
    return state


def _warn(comm, notes) -> None:
    if comm.rank == 0:
        for note in notes:
            if note:
                print(f"warning: --resume: {note}", file=sys.stderr, flush=True)
