"""The stall inspector's interruptible waits (distnn search's blocks), on every rank: the
polled collectives give what the blocking ones give; a rank that fails ends the others'
wait with PeerFailed; the ranks then go on over a new communicator (subgroup)."""
import json
import sys

import numpy as np

from distnn import distributed as dist
from distnn.distributed.stall import PeerFailed, watch_stalls

world = dist.init()
comm = world.split(0, world.rank)  # the "block": its failure leaves world sound
rank, size = comm.rank, comm.size
out = {}


def collectives() -> dict:
    """One call of each collective of ``comm`` and what it returned here."""
    return {"allreduce_": comm.allreduce_(np.arange(5.0) * (rank + 1)).tolist(),
            "bcast_": comm.bcast_(np.full(3, float(rank)), root=size - 1).tolist(),
            "allgather": comm.allgather(np.array([rank, 2 * rank])).tolist(),
            "bcast_obj": comm.bcast_obj({"r": rank, "s": "x" * (rank * 1000)}, root=1),
            "allgather_obj": comm.allgather_obj(("rank", rank, [rank] * rank)),
            "sum": comm.allreduce_obj(rank + 1, "sum"), "max": comm.allreduce_obj(rank, "max"),
            "min": comm.allreduce_obj(rank - 7, "min")}


plain = collectives()
inspector = watch_stalls(comm, warning=30)
inspector.interruptible = True
polled = collectives()
comm.barrier()
# the inspector reaches MPI through its communicator: the comm watches for it, and every
# rank's published slots are read through the communicator's window
out["watched"] = comm.stall is inspector
inspector.phase("forward", step=10 + rank)
comm.barrier()
slots = inspector.read(range(size))
out["steps"] = [int(slots[r][0]) for r in range(size)]
comm.barrier()
handle = comm.iallreduce_(np.ones(4))
out["handle"] = handle.wait().tolist()
out["same"] = json.dumps(plain, sort_keys=True) == json.dumps(polled, sort_keys=True)
# a rank can leave a collective before the others have (its last message still on the
# way): the world's barrier makes sure every rank is done with the block's ones first
world.barrier()
# the last rank fails; the others are (or will be) waiting in a collective it never joins
if rank == size - 1:
    inspector.fail()
    out["raised"] = None
else:
    try:
        comm.allreduce_(np.ones(1000))
        out["raised"] = "completed?!"
    except PeerFailed as exc:
        out["raised"] = exc.rank
new = world.subgroup(range(size), tag=1)  # made over the sound parent, as search does
inspector.close()
out["unwatched"] = comm.stall is None
out["after"] = new.allreduce_(np.ones(2)).tolist()
with open(f"{sys.argv[1]}/r{rank}.json", "w") as f:
    json.dump(out, f)
