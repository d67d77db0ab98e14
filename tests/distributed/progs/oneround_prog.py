"""The all-at-once exchanges of oneround.py against what MPI's collectives deliver, on
every rank: each rank draws its data from a generator seeded by its rank, so every rank
rebuilds every other rank's data. Rank 0 pickles the checks.
Usage: oneround_prog.py OUT_DIR"""
from __future__ import annotations

import pickle
import sys

import numpy as np

from distnn import distributed as dist
from distnn.distributed import oneround
from distnn.distributed.join import JoinableComm


def rows(rank: int, p: int, m: int, rep: int) -> np.ndarray:
    rng = np.random.default_rng([rank, p, m, rep])
    return rng.integers(0, 1 << 16, (p, m)).astype(np.uint16)


def payload(rank: int, rep: int) -> np.ndarray:
    size = (rank * 7 + rep * 3) % 11  # 0 bytes for some ranks
    return np.random.default_rng([rank, rep, 9]).integers(0, 256, size).astype(np.uint8)


def main() -> None:
    comm = dist.init()
    with dist.abort_on_error(comm):
        checks(comm)


def checks(comm) -> None:
    MPI, rank, p = comm.MPI, comm.rank, comm.size
    out = {"size": p}
    dup = oneround.exchange_comm(comm)
    out["one_dup"] = oneround.exchange_comm(comm) is dup and dup != comm.comm
    out["comm_of"] = (oneround.mpi_comm_of(comm) is comm
                      and oneround.mpi_comm_of(JoinableComm(comm)) is comm
                      and oneround.mpi_comm_of(dist.LocalComm()) is None)
    # two of each posted before any wait, same tags: matched in the order posted
    for m in (0, 1, 5, 4099):
        sends = [rows(rank, p, m, rep) for rep in range(2)]
        recvs = [np.empty((p, m), np.uint16) for _ in range(2)]
        reqs = [oneround.post_alltoall(MPI, dup, s, r, oneround.TAG_CHUNKS)
                for s, r in zip(sends, recvs)]
        gathers = [rows(rank, p, m, rep + 5) for rep in range(2)]
        greqs = [oneround.post_allgather(MPI, dup, g, oneround.TAG_SUMS) for g in gathers]
        for r in reversed(reqs + greqs):
            while not r.Test():
                pass
            r.Wait()  # completed requests: returns at once
        out[f"alltoall_{m}"] = all(
            np.array_equal(recvs[rep][src], rows(src, p, m, rep)[rank])
            for rep in range(2) for src in range(p))
        out[f"allgather_{m}"] = all(
            np.array_equal(gathers[rep][src], rows(src, p, m, rep + 5)[src])
            for rep in range(2) for src in range(p))
    mine = [payload(rank, rep) for rep in range(3)]
    sizes = [[payload(r, rep).size for r in range(p)] for rep in range(3)]
    outs = [np.empty(sum(s), np.uint8) for s in sizes]
    reqs = [oneround.post_allgatherv(MPI, dup, m, o, s, oneround.TAG_PAIRS)
            for m, o, s in zip(mine, outs, sizes)]
    for r in reqs:
        r.Wait()
    out["allgatherv"] = all(
        np.array_equal(o, np.concatenate([payload(r, rep) for r in range(p)]))
        for rep, o in enumerate(outs))
    everyone = comm.allgather_obj(out)
    if rank == 0:
        with open(f"{sys.argv[1]}/results.pkl", "wb") as f:
            pickle.dump(everyone, f)


if __name__ == "__main__":
    main()
