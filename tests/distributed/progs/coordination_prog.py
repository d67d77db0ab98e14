"""distributed.coordination on N ranks: prints one JSON line per rank with what on_ranks
raised (every rank), the result of a root-only call and that the lazy waits complete."""
import json
import sys

import numpy as np

from distnn import distributed as dist
from distnn.distributed.coordination import Backoff, lazy_barrier, on_ranks, wait_all

comm = dist.init()
out = {"rank": comm.rank}


def fail_on(ranks):
    def fn():
        if comm.rank in ranks:
            raise ValueError(f"bad value on rank {comm.rank}")
        return comm.rank
    return fn


for key, ranks, root in (("one", {1}, None), ("all", set(range(comm.size)), None),
                         ("root", {0}, 0)):
    try:
        on_ranks(comm, fail_on(ranks), root=root, lazy=root is not None)
        out[key] = None
    except ValueError as exc:
        out[key] = [str(exc), exc.rank, exc.ranks]
out["result"] = on_ranks(comm, lambda: comm.rank + 10, root=0)
out["fine"] = on_ranks(comm, lambda: comm.rank)
waited = lazy_barrier(comm)
wait_all([comm.iallreduce_(np.ones(1))])
backoff = Backoff(1e-3)
backoff.pause()
out["waits"] = [waited >= 0, backoff.delay > backoff.min_sleep]
sys.stdout.write(json.dumps(out) + "\n")
