"""Secure aggregation over real MPI with a communicator that records everything this rank
sends (arrays and objects): writes OUT_DIR/rank<r>.pkl with the sends, this rank's
clients' updates, and the secure and plain sums (all clients, and without client 1).

python secagg_prog.py OUT_DIR CLIENTS  (under mpiexec -n N)
"""
import pickle
import sys

import numpy as np

from distnn import distributed as dist
from distnn.distributed.secagg import FRACTION_BITS, SecureAggregator


class Recording:
    """A communicator that keeps a copy of every buffer and object it is given."""

    def __init__(self, comm):
        self.comm, self.sent = comm, []
        self.rank, self.size = comm.rank, comm.size

    def allreduce_(self, arr, op="sum"):
        self.sent.append(("allreduce_", arr.copy()))
        return self.comm.allreduce_(arr, op)

    def allgather(self, arr):
        self.sent.append(("allgather", np.array(arr, copy=True)))
        return self.comm.allgather(arr)

    def allgather_obj(self, obj):
        self.sent.append(("allgather_obj", pickle.loads(pickle.dumps(obj))))
        return self.comm.allgather_obj(obj)

    def __getattr__(self, name):
        raise AssertionError(f"secure aggregation used comm.{name}, which is not recorded")


comm = dist.init()
out, k = sys.argv[1], int(sys.argv[2])
owners = [c % comm.size for c in range(k)]
n = 1000
grid = 2.0 ** -FRACTION_BITS
updates = {}
for c in range(k):
    rng = np.random.default_rng([11, c])
    # values on the fixed-point grid (exact sums) and a few large ones
    u = rng.integers(-2 ** 40, 2 ** 40, size=n) * grid
    u[:5] = rng.integers(-2 ** 20, 2 ** 20, size=5)
    if owners[c] == comm.rank:
        updates[c] = u
rec = Recording(comm)
agg = SecureAggregator(rec, owners)
secure = agg.sum(updates, range(k), 0, n)
without_1 = agg.sum({c: u for c, u in updates.items() if c != 1}, [c for c in range(k) if c != 1],
                    1, n)
plain = np.zeros(n)
for u in updates.values():
    plain += u
comm.allreduce_(plain, "sum")
plain_without_1 = np.zeros(n)
for c, u in updates.items():
    if c != 1:
        plain_without_1 += u
comm.allreduce_(plain_without_1, "sum")
with open(f"{out}/rank{comm.rank}.pkl", "wb") as f:
    pickle.dump({"sent": rec.sent, "updates": updates, "secure": secure, "plain": plain,
                 "secure_without_1": without_1, "plain_without_1": plain_without_1}, f)
