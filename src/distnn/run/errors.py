"""The errors a run reports to its user: ``RunError`` (one line naming the option, the same
on every rank) and ``agreed``, which turns a step's errors on any rank into one on all.
"""
from __future__ import annotations

from typing import Any, Callable

from ..distributed.coordination import on_ranks

__all__ = ["RunError", "TrainingDiverged", "agreed", "rank_path"]


class RunError(ValueError):
    """A run cannot be built or written as configured (a bad file, a missing split...): one
    line naming the option, the same on every rank (exit status 2 in the command)."""

    exit_code = 2


class TrainingDiverged(RunError):
    """The loss became NaN/inf (exit status 3 in the command, one line). ``error``: the
    Trainer's ``NonFiniteLossError`` (where and at which learning rate)."""

    exit_code = 3

    def __init__(self, message: str, error: BaseException | None = None):
        super().__init__(message)
        self.error = error


def agreed(comm, what: str | None, fn: Callable[[], Any], *, root: int | None = None,
           describe: Callable[[BaseException], str] = str, lazy: bool = False) -> Any:
    """``fn()`` on every rank (or on ``root``), its errors caused by the configuration
    (``ValueError``, ``OSError``, ``KeyError``, ``DatasetError``) agreed on by all ranks
    (``distributed.coordination.on_ranks``) and raised as one ``RunError`` on every rank:
    "what: message" (``describe(exc)`` gives the message), "[rank r] ..." on the ranks
    that did not fail themselves when not all did, "[rank r on host h] ..." on every rank
    when the job spans several hosts and not all ranks failed."""
    from ..data import DatasetError
    try:
        return on_ranks(comm, fn, root=root, lazy=lazy,
                        catch=(DatasetError, ValueError, OSError, KeyError))
    except (DatasetError, ValueError, OSError, KeyError) as exc:
        text = f"missing entry {exc}" if isinstance(exc, KeyError) else describe(exc)
        message = text if what is None or text.startswith((what, "--")) else f"{what}: {text}"
        ranks = getattr(exc, "ranks", [comm.rank])
        hosts = getattr(exc, "hosts", [])
        where = (f"on host {exc.host} " if len(set(hosts)) > 1 else "")
        if root is None and len(ranks) < comm.size and (where or comm.rank not in ranks):
            # Across hosts a file one host lacks is the usual cause: name the host.
            message = f"[rank {exc.rank} {where}]".replace(" ]", "]") + f" {message}"
        raise RunError(message) from None


def rank_path(path: str, rank: int) -> str:
    """``path`` with '{rank}' replaced by ``rank`` (files every rank writes)."""
    return path.replace("{rank}", str(rank))


