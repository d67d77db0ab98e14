"""The Reducer's float16 exchange of gradient buckets (``compression="fp16"``) over an
``MPIComm``, without a user-defined MPI op: a reduce-scatter done as an all-to-all of
float16 chunks, a local sum in float32, and an all-gather of the float16 sums.

A bucket of n elements is padded with zeros to p * m elements (p ranks, m = ceil(n / p));
rank k owns chunk k (elements k*m to (k+1)*m). One exchange:

1. phase 1 (an all-to-all of 16-bit words): every rank sends chunk k of its float16
   bucket to rank k and receives its own chunk from every rank;
2. rank k adds the p chunks in float32, in rank order (``float32(x_0) + x_1 + ... +
   x_{p-1}``, each addition rounded to float32), and rounds the sum to float16 once
   (``distnn.kernels.half``: compiled with the numba backend, NumPy's arithmetic);
3. phase 2 (an all-gather of 16-bit words): every rank receives every chunk's float16
   sum.

Both phases are point-to-point messages posted at once (``oneround.py``: one round each,
where MPICH's ``Ialltoall`` and ``Iallgather`` take several dependent rounds; 8 emulated
hosts on 2 cores: 46 against 52-59 ms a step), on a duplicate of the communicator.

A small bucket (the other ranks' float16 copies of it at most ``GATHER_BYTES``) skips the
chunks: phase 1 all-gathers the whole bucket and every rank adds all p copies as in 2;
there is no phase 2. So every element of the result is ``float16(sum in rank order, in
float32, of the ranks' float16 values)``, the same on every rank, for any p; with chunks
each rank sends and receives 2 (p-1)/p times the float16 bucket (a float32 ring
all-reduce moves twice that).

Phase 1 of a bucket is started where the Reducer would have started its all-reduce
(during backward, buckets in order). Phase 2 starts, buckets strictly in order, as soon as
this rank sees its phase 1 complete (``test``, called by the Reducer during backward) or at
``wait``; the phases have tags of their own, so ranks may interleave the two phases of
different buckets differently. The stall inspector numbers one collective per bucket.
"""
from __future__ import annotations

import numpy as np

from ..kernels.half import sum_halves
from .comm_base import _DoneHandle
from .oneround import TAG_CHUNKS, TAG_SUMS, post_allgather, post_alltoall
from .mpi_comm import MPIComm
from .mpi_requests import _MPIHandle


def half_exchange_for(comm, sizes):
    """The float16 exchange of buckets of ``sizes`` elements over ``comm``: a
    ``HalfSumExchange`` on an ``MPIComm`` of two or more ranks, the communicator's own
    ``half_exchange`` (``JoinableComm``: its joined ranks serve it), else None (the
    caller all-reduces its float16 buckets)."""
    if isinstance(comm, MPIComm):
        return HalfSumExchange(comm, sizes) if comm.size > 1 else None
    make = getattr(type(comm), "half_exchange", None)
    return make(comm, sizes) if make is not None else None


def half_sum_reference(values: list[np.ndarray]) -> np.ndarray:
    """The exchange's result for the ranks' float16 ``values`` (in rank order), in NumPy."""
    acc = np.asarray(values[0], dtype=np.float16).astype(np.float32)
    for v in values[1:]:
        np.add(acc, np.asarray(v, dtype=np.float16), out=acc, dtype=np.float32)
    return acc.astype(np.float16)


# A bucket whose whole float16 copies from the other ranks are at most this many bytes is
# all-gathered whole and summed by every rank (one collective instead of two).
GATHER_BYTES = 64 << 10


class _Bucket:
    """Buffers of one bucket: ``wire`` (padded float16 send/result), ``recv`` (the p
    chunks this rank sums), ``acc`` (their float32 sum); ``whole``: the chunk is the
    whole bucket (all-gathered, no phase 2)."""

    def __init__(self, n: int, p: int):
        self.whole = 2 * n * (p - 1) <= GATHER_BYTES
        self.n, self.m = n, n if self.whole else -(-n // p)
        self.padded = np.zeros(n if self.whole else p * self.m, np.float16)
        self.wire = self.padded[:n]
        self.recv = np.empty((p, self.m), np.float16)
        self.acc = np.empty(self.m, np.float32)

    def rows(self) -> np.ndarray:
        """The padded bucket as p chunks of 16-bit words (what phase 1 sends)."""
        return self.padded.view(np.uint16).reshape(-1, self.m)


class _HalfHandle:
    """A started exchange of one bucket: ``test()`` advances it, ``wait()`` completes it."""

    def __init__(self, owner: "HalfSumExchange", bucket: _Bucket, request, keep, seq):
        self._owner, self._bucket, self._seq = owner, bucket, seq
        self._first = _MPIHandle(request, bucket.recv, 1, keep=keep, watch=self._watch())
        self._second: _MPIHandle | None = None

    def _gather(self) -> None:  # phase 1 is complete: sum, start phase 2
        owner, bk = self._owner, self._bucket
        if bk.whole:
            sum_halves(bk.recv, bk.wire, bk.acc)
            self._second = _DoneHandle(bk.wire)
            return
        k = owner.comm.rank
        sum_halves(bk.recv, bk.padded[k * bk.m:(k + 1) * bk.m], bk.acc)
        request = post_allgather(owner.comm.MPI, owner.second_comm(), bk.rows(), TAG_SUMS)
        self._second = _MPIHandle(request, bk.wire, 1, watch=self._watch())

    def _watch(self):
        stall = self._owner.comm.stall
        return (stall, self._seq, None) if stall is not None else None

    def test(self) -> bool:
        """True once the whole exchange is complete (drives MPI progress)."""
        self._owner.progress()
        return self._second is not None and self._second.test()

    def wait(self) -> np.ndarray:
        """Complete the exchange; returns the bucket's float16 result (``wire``)."""
        self._owner.advance_through(self)
        return self._second.wait()


class HalfSumExchange:
    """The float16 exchange of a Reducer's buckets (see the module doc).

    Args:
        comm: an ``MPIComm`` of two or more ranks.
        sizes: the buckets' numbers of elements.
        second: the communicator of the messages (a duplicate of ``comm.comm`` that other
            exchanges share, made at the same point on every rank); None: made by the first
            ``start``.

    Example:
        ex = HalfSumExchange(comm, [n]); ex.wire(0)[...] = grads
        ex.start(0).wait()  # ex.wire(0) now holds the float16 sum over ranks
    """

    def __init__(self, comm: MPIComm, sizes, second=None):
        self.comm = comm
        self.buckets = [_Bucket(int(n), comm.size) for n in sizes]
        self._second = second  # the duplicate communicator of the messages
        self._owns_second = second is None
        self._queue: list[_HalfHandle] = []  # started buckets whose phase 2 has not started

    def wire(self, b: int) -> np.ndarray:
        """Bucket b's float16 buffer: fill it before ``start``; the result after ``wait``."""
        return self.buckets[b].wire

    def second_comm(self):
        """The duplicate communicator of both phases, made by the first ``start`` (a
        collective on the communicator: it must come at the same point of every rank's
        sequence)."""
        if self._second is None:
            self._second = self.comm.comm.Dup()
        return self._second

    def start(self, b: int) -> _HalfHandle:
        """Start phase 1 of bucket b (every rank starts the buckets in the same order)."""
        bk, comm = self.buckets[b], self.comm
        second = self.second_comm()  # made (collectively) before the first phase 1
        seq = comm.stall.started() if comm.stall is not None else None
        recv = bk.recv.view(np.uint16)
        if bk.whole:
            recv[comm.rank] = bk.wire.view(np.uint16)
            request = post_allgather(comm.MPI, second, recv, TAG_CHUNKS)
        else:
            request = post_alltoall(comm.MPI, second, bk.rows(), recv, TAG_CHUNKS)
        handle = _HalfHandle(self, bk, request, None, seq)
        self._queue.append(handle)
        return handle

    def progress(self) -> None:
        """Start phase 2 of the buckets whose phase 1 is complete, in order."""
        while self._queue and self._queue[0]._first.test():
            self._queue.pop(0)._gather()

    def advance_through(self, handle: _HalfHandle) -> None:
        """Wait for phase 1 of every bucket up to ``handle``'s and start their phase 2."""
        while handle._second is None:
            head = self._queue.pop(0)
            head._first.wait()
            head._gather()

    def free(self) -> None:
        """Free the duplicate communicator if this exchange made it (collective; the
        exchange can still be used)."""
        if not self._owns_second:
            return
        if self._second is not None and not self.comm.MPI.Is_finalized():
            self._second.Free()
        self._second = None
