"""Job-level behaviour: failing fast on every rank, and describing the MPI set-up."""
from __future__ import annotations

import contextlib
import os
import socket
import sys
import time
import traceback
from typing import Iterator

from .comm import Communicator, get_comm
from .comm import node_cores, threads_per_rank


def _report(comm: Communicator, exc: BaseException) -> None:
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    prefix = f"[rank {comm.rank}] "
    sys.stderr.write("".join(prefix + line + "\n" for line in text.rstrip("\n").split("\n")))
    sys.stderr.write(f"{prefix}aborting all {comm.size} ranks\n")
    sys.stderr.flush()
    # mpiexec forwards a rank's stderr asynchronously and MPI_Abort kills the forwarder
    # too: on a loaded machine the message was lost. Give the forwarder a moment.
    time.sleep(0.3)


@contextlib.contextmanager
def abort_on_error(comm: Communicator | None = None) -> Iterator[Communicator]:
    """Run a block so that an exception on any rank ends the whole job at once.

    The traceback is printed to stderr with every line prefixed ``[rank R]`` and
    ``comm.abort(1)`` (MPI_Abort) kills every rank, so the job exits non-zero within
    seconds instead of the other ranks hanging in their next collective. ``SystemExit``
    with a non-zero code aborts with that code (without traceback); exit code 0 passes.
    On a single process the exception simply propagates.

    Example:
        with dist.abort_on_error(comm):
            main()
    """
    comm = comm if comm is not None else get_comm()
    try:
        yield comm
    except SystemExit as exc:
        code = exc.code
        if comm.size == 1 or code in (0, None):
            raise
        if not isinstance(code, int):
            sys.stderr.write(f"[rank {comm.rank}] {code}\n")
            sys.stderr.flush()
            time.sleep(0.3)  # see _report
            code = 1
        comm.abort(code)
    except BaseException as exc:
        if comm.size == 1:
            raise
        _report(comm, exc)
        comm.abort(1)


def install_abort_handler(comm: Communicator | None = None) -> None:
    """Make an uncaught exception anywhere in the program abort every rank (through
    ``sys.excepthook``), with the ``[rank R]`` traceback of ``abort_on_error``."""
    comm = comm if comm is not None else get_comm()
    previous = sys.excepthook

    def hook(exc_type, exc, tb):
        if comm.size == 1 or issubclass(exc_type, SystemExit):
            previous(exc_type, exc, tb)
            return
        _report(comm, exc.with_traceback(tb))
        comm.abort(1)

    sys.excepthook = hook


def _threads() -> dict[str, int]:
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return {}
    out: dict[str, int] = {}
    for pool in threadpool_info():
        key = f"{pool.get('internal_api')}"
        out[key] = max(out.get(key, 0), int(pool.get("num_threads", 0)))
    return out


def describe(comm: Communicator | None = None, asked: int = 0) -> str:
    """A multi-line report of the parallel set-up (collective: every rank must call it):
    MPI library and mpi4py versions, ranks, hosts, ranks per host and threads per rank
    (``threads_per_rank(comm, asked)``, what a run uses; ``asked``: ``--threads``)."""
    comm = comm if comm is not None else get_comm()
    mine = {"host": socket.gethostname(), "pid": os.getpid(), "threads": _threads(),
            "local": (comm.local_rank, comm.local_size), "cores": node_cores(),
            "train_threads": threads_per_rank(comm, asked)}
    everyone = comm.allgather_obj(mine)
    library = getattr(comm, "library_version", None)
    lines = [f"communicator: {type(comm).__name__}",
             f"MPI library: {library() if library else 'none (mpi4py not installed or unused)'}",
             f"mpi4py: {getattr(comm, 'mpi4py_version', lambda: 'not used')()}",
             f"ranks: {comm.size}"]
    hosts: dict[str, list[int]] = {}
    for r, info in enumerate(everyone):
        hosts.setdefault(info["host"], []).append(r)
    lines.append(f"hosts: {len(hosts)}")
    for host, ranks in hosts.items():
        lines.append(f"  {host}: ranks {ranks}")
    for r, info in enumerate(everyone):
        threads = ", ".join(f"{k}={v}" for k, v in sorted(info["threads"].items())) or "unknown"
        lines.append(f"  rank {r}: pid {info['pid']}, local rank {info['local'][0]}/"
                     f"{info['local'][1]}, cores {info['cores']}, train threads "
                     f"{info['train_threads']}, threads now {threads}")
    return "\n".join(lines)
