"""All-to-all and all-gathers posted at once, as point-to-point messages (one round),
for the small exchanges of the compressions: the float16 chunks and sums of
``halfsum.py`` and the top-k pairs of ``compressed_buckets.py``.

Why not MPI's non-blocking collectives: MPICH picks for them algorithms of several
dependent rounds (a pairwise all-to-all: p - 1 rounds; a ring or recursive-doubling
all-gather). With one rank per quarter of a core (8 emulated hosts on 2 cores) each round
waits for a peer that may not be running, and a rank waiting in MPI spins. Measured on
simplecnn, 8 hosts, the 10 Gbit/s link scaled to 2.5: the float16 exchange with MPICH's
``tsp_scattered`` all-to-all and ``tsp_brucks`` all-gather (environment variables) took
46 ms a step against 52-59 with its defaults, and 2.2 against 4.3 ms of CPU a rank spent
waiting. Posting every message at once does the same without the environment: each rank
sends its p - 1 pieces and receives its p - 1 pieces concurrently; the bytes are the
collective's, the result the same bytes.

Messages go on a communicator of their own (``exchange_comm``), with one tag per kind
of exchange; MPI matches the messages of one pair, communicator and tag in the order
they were posted, so every rank must post these exchanges in the same order (as it does
collectives).
"""
from __future__ import annotations

import numpy as np

TAG_CHUNKS, TAG_SUMS, TAG_PAIRS = 431, 432, 433


class RequestSet:
    """Several MPI requests as one: ``Test``/``Wait`` as an mpi4py ``Request``'s."""

    def __init__(self, MPI, requests):
        self._MPI = MPI
        self._requests = list(requests)

    def Test(self) -> bool:  # noqa: N802  (mpi4py's name: _MPIHandle and _poll call it)
        return self._MPI.Request.Testall(self._requests)

    def Wait(self) -> None:  # noqa: N802
        self._MPI.Request.Waitall(self._requests)


def mpi_comm_of(comm):
    """The ``MPIComm`` under ``comm`` (itself, or a ``JoinableComm``'s), else None."""
    from .mpi_comm import MPIComm
    if isinstance(comm, MPIComm):
        return comm
    inner = vars(comm).get("comm") if hasattr(comm, "__dict__") else None
    return inner if isinstance(inner, MPIComm) else None


def exchange_comm(comm):
    """The duplicate of ``comm``'s (an ``MPIComm``) communicator these exchanges use, made
    at the first call (collective: at the same point of every rank's sequence)."""
    dup = getattr(comm, "_direct_comm", None)
    if dup is None:
        dup = comm.comm.Dup()
        comm._direct_comm = dup
    return dup


def _peers(rank: int, size: int):
    """(send-to, receive-from) of each step, spread so no rank gets everyone first."""
    return [((rank + s) % size, (rank - s) % size) for s in range(1, size)]


def post_alltoall(MPI, comm, send: np.ndarray, recv: np.ndarray, tag: int) -> RequestSet:
    """Rank r's row k of ``send`` (p rows of 16-bit words, or bytes) goes to rank k's row r
    of ``recv``; the own row is copied here."""
    rank, size = comm.Get_rank(), comm.Get_size()
    recv[rank] = send[rank]
    peers = _peers(rank, size)
    reqs = [comm.Irecv(recv[src], source=src, tag=tag) for _, src in peers]
    reqs += [comm.Isend(send[dst], dest=dst, tag=tag) for dst, _ in peers]
    return RequestSet(MPI, reqs)


def post_allgather(MPI, comm, rows: np.ndarray, tag: int) -> RequestSet:
    """Every rank's own row of ``rows`` (p rows) to every other rank's same row."""
    rank, size = comm.Get_rank(), comm.Get_size()
    peers = _peers(rank, size)
    reqs = [comm.Irecv(rows[src], source=src, tag=tag) for _, src in peers]
    reqs += [comm.Isend(rows[rank], dest=dst, tag=tag) for dst, _ in peers]
    return RequestSet(MPI, reqs)


def post_allgatherv(MPI, comm, mine: np.ndarray, out: np.ndarray, sizes, tag: int):
    """``out`` (bytes) = every rank's ``mine`` (``sizes[r]`` bytes from rank r) in rank
    order; this rank's is copied here."""
    rank, size = comm.Get_rank(), comm.Get_size()
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    out[starts[rank]:starts[rank + 1]] = mine
    peers = _peers(rank, size)
    reqs = [comm.Irecv(out[starts[src]:starts[src + 1]], source=src, tag=tag)
            for _, src in peers]
    reqs += [comm.Isend(mine, dest=dst, tag=tag) for dst, _ in peers]
    return RequestSet(MPI, reqs)
