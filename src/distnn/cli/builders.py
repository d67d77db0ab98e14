"""The command's own set-up around a run: the communicator of ``--parallel``, and the
threads put back when the command ends (the run builder, ``distnn.run.build_run``, decides
and applies them: ``distnn.distributed.threads_per_rank``)."""
from __future__ import annotations

import contextlib
from typing import Iterator

from ..run import RunConfig, threads_scope


def make_comm(parallel: str):
    """LocalComm for 'sequential'; the MPI world (size 1 without mpiexec) otherwise."""
    from .. import distributed as dist
    if parallel == "sequential":
        return dist.init(dist.LocalComm())
    return dist.init()


@contextlib.contextmanager
def threads(cfg: RunConfig, comm) -> Iterator[None]:
    """Around a command: the threads of the compiled kernels, BLAS and torch as they were
    before it, afterwards (for callers in the same process). Its runs apply their own
    threads per rank (``--threads``, else the node's cores shared among its ranks)."""
    with threads_scope():
        yield
