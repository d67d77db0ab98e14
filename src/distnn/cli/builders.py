"""The command's own set-up around a run: the communicator of ``--parallel`` and the threads
of ``--threads`` (the run itself is built by ``distnn.run``)."""
from __future__ import annotations

import contextlib

from ..run import RunConfig


def make_comm(parallel: str):
    """LocalComm for 'sequential'; the MPI world (size 1 without mpiexec) otherwise."""
    from .. import distributed as dist
    if parallel == "sequential":
        return dist.init(dist.LocalComm())
    return dist.init()


@contextlib.contextmanager
def threads(cfg: RunConfig, size: int):
    """``--threads`` for the run: the BLAS pools (threadpoolctl) and the compiled kernels'
    loops; 0 means 1 per rank with several ranks, else the libraries' defaults."""
    n = cfg.parallel.threads or (1 if size > 1 else 0)
    if not n:
        yield
        return
    from threadpoolctl import threadpool_limits

    from .. import kernels
    before = kernels.get_num_threads()
    kernels.set_num_threads(n)
    try:
        with threadpool_limits(limits=n):
            yield
    finally:
        kernels.set_num_threads(before)
