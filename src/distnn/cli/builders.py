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
def threads(cfg: RunConfig, comm):
    """``--threads`` for the run: the BLAS pools (threadpoolctl) and the compiled kernels'
    loops; 0 means this rank's cores shared among the ranks of its node that use them
    (``distributed.default_threads``)."""
    from threadpoolctl import threadpool_limits

    from .. import kernels
    from ..distributed import default_threads
    n = cfg.parallel.threads or default_threads(comm)
    before = kernels.get_num_threads()
    kernels.set_num_threads(n)
    try:
        with threadpool_limits(limits=n):
            yield
    finally:
        kernels.set_num_threads(before)
