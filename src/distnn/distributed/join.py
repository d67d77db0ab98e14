"""Collectives that tolerate ranks which ran out of data (Horovod's ``join``).

A ``JoinableComm`` wraps a Communicator. Each of its reductions first reduces a small
header (what is reduced: kind, length, dtype, op, segments) with MAX, then the data. A rank
inside ``join()`` loops on headers: for each one it posts the same reduction with the
identity of the op (zeros for sum, average and Adasum, -inf/+inf for max/min), so the ranks
still training complete their all-reduces; an average stays divided by the full number of
ranks, as in Horovod. ``join()`` returns, on every rank, the rank that joined last, once all
ranks are inside it. Collectives that cannot include a joined rank (allgather, broadcast,
alltoall, reduce-scatter) raise on the ranks still training, as Horovod does. The
Reducer's float16 exchange (``half_exchange``) is served too: a joined rank sends zeros.

The header costs one small extra non-blocking all-reduce per reduction (2 ranks on one
host: a 4 KiB all-reduce takes 20 us instead of 7-9 us; at 1 MiB, 420-490 us either way);
the header carries each value and its negation, so ranks that pass different
lengths, dtypes or ops get an error on every rank instead of a hang.
"""
from __future__ import annotations

import numpy as np

from .adasum import adasum_
from .comm import Communicator, MPIComm
from .halfsum import HalfSumExchange

_DTYPES = [np.float16, np.float32, np.float64, np.int8, np.uint8, np.int16, np.int32,
           np.int64, np.bool_]
_OPS = ["sum", "mean", "max", "min", "adasum"]
_KINDS = {"allreduce": 1, "adasum": 2, "other": 3, "halfsum": 4}
_LOW = np.iinfo(np.int64).min // 4
_NV = 6  # kind, length, dtype, op, segments, blocking; then their negations
_HEADER = 2 * _NV + 2  # ... and: some rank joined, the rank newly joined (+1)


def _identity(dtype, op: str):
    if op in ("max", "min"):
        info = np.finfo(dtype) if np.issubdtype(dtype, np.floating) else np.iinfo(dtype)
        if np.issubdtype(dtype, np.floating):
            return -np.inf if op == "max" else np.inf
        return info.min if op == "max" else info.max
    return 0


class _Pair:
    """Handle of a header and its data reduction (waits both, checks the header)."""

    def __init__(self, owner, header, header_handle, data_handle, arr):
        self._owner, self._header, self._hh, self._dh, self._arr = (
            owner, header, header_handle, data_handle, arr)
        self._done = False

    def test(self) -> bool:
        if not self._done and self._hh.test() and self._dh.test():
            self.wait()
        return self._done

    def wait(self) -> np.ndarray:
        if not self._done:
            self._hh.wait()
            self._dh.wait()
            self._done = True
            self._owner._check(self._header)
        return self._arr


class _JoinableHalf:
    """A ``HalfSumExchange`` whose buckets each start after a header (see ``JoinableComm``)."""

    def __init__(self, owner: "JoinableComm", exchange: HalfSumExchange):
        self._owner, self._exchange = owner, exchange

    def wire(self, b: int) -> np.ndarray:
        return self._exchange.wire(b)

    def start(self, b: int) -> _Pair:
        owner, wire = self._owner, self._exchange.wire(b)
        h = owner._header("halfsum", wire, "sum")
        hh = owner.comm.iallreduce_(h, "max")
        return _Pair(owner, h, hh, self._exchange.start(b), wire)


class JoinableComm:
    """A Communicator's reductions, made safe for ranks that call ``join()``.

    Args:
        comm: the communicator (every rank of it must use this wrapper for reductions
            while any rank may be joined).

    Example:
        jc = JoinableComm(comm)
        for batch in my_batches: ...; jc.allreduce_(g, "mean")
        last = jc.join()
    """

    def __init__(self, comm: Communicator):
        self.comm = comm
        self.rank, self.size = comm.rank, comm.size
        self.local_rank = getattr(comm, "local_rank", 0)
        self.local_size = getattr(comm, "local_size", 1)
        self._half_comm = None  # phase 2 of the float16 exchanges (``half_exchange``)

    def _header(self, kind: str, arr: np.ndarray | None, op: str, segments: int = 0,
                blocking: bool = False):
        if arr is None:
            vals = [_KINDS[kind], 0, 0, _OPS.index(op) if op in _OPS else 0, segments, 0]
        else:
            if arr.dtype.type not in _DTYPES:
                raise TypeError(f"reductions support dtypes {[d.__name__ for d in _DTYPES]}, "
                                f"got {arr.dtype}")
            vals = [_KINDS[kind], arr.size, _DTYPES.index(arr.dtype.type), _OPS.index(op),
                    segments, int(blocking)]
        return np.array(vals + [-v for v in vals] + [0, 0], dtype=np.int64)

    def _check(self, h: np.ndarray) -> None:
        if np.any(h[:_NV] != -h[_NV:2 * _NV]):
            names = ["kind", "length", "dtype", "op", "segments", "blocking"]
            bad = [names[i] for i in range(_NV) if h[i] != -h[_NV + i]]
            raise RuntimeError(f"ranks disagree on a reduction ({', '.join(bad)} differ: "
                               f"max {h[:_NV].tolist()}, min {(-h[_NV:2 * _NV]).tolist()}); "
                               "every rank must reduce the same tensors in the same order")

    def _exchange(self, h: np.ndarray) -> np.ndarray:
        # Always non-blocking: MPI never matches a blocking collective with a non-blocking
        # one, and a joined rank cannot know which kind the others will post.
        return self.comm.iallreduce_(h, "max").wait()

    def _others_joined(self, kind: str, what: str) -> None:
        h = self._exchange(self._header(kind, None, "sum"))
        if h[2 * _NV]:
            raise RuntimeError(f"{what}: a rank has called join(); only all-reduces "
                               "(average, sum, min, max, Adasum) and barriers can run while "
                               "some ranks are joined")
        self._check(h)

    # -- the reductions -----------------------------------------------------------------
    def iallreduce_(self, arr: np.ndarray, op: str = "sum"):
        if self.size == 1:
            return self.comm.iallreduce_(arr, op)
        h = self._header("allreduce", arr, op)
        return _Pair(self, h, self.comm.iallreduce_(h, "max"), self.comm.iallreduce_(arr, op),
                     arr)

    def allreduce_(self, arr: np.ndarray, op: str = "sum") -> np.ndarray:
        if self.size == 1:
            return self.comm.allreduce_(arr, op)
        h = self._header("allreduce", arr, op, blocking=True)
        hh = self.comm.iallreduce_(h, "max")
        self.comm.allreduce_(arr, op)
        hh.wait()
        self._check(h)
        return arr

    def adasum_(self, arr: np.ndarray, counts) -> np.ndarray:
        if self.size == 1:
            return arr
        counts = np.asarray(counts, dtype=np.int64)
        self._check(self._exchange(self._header("adasum", arr, "adasum", len(counts))))
        self.comm.allreduce_(counts.copy(), "max")
        return adasum_(arr, counts, self.comm)

    def half_exchange(self, sizes):
        """The Reducer's float16 exchange of buckets of ``sizes`` elements (halfsum.py), a
        header before each bucket, served by joined ranks with zeros; None when the wrapped
        communicator is no ``MPIComm``. Collective (it makes the exchange's communicator)."""
        if self.size == 1 or not isinstance(self.comm, MPIComm):
            return None
        if self._half_comm is None:
            self._half_comm = self.comm.comm.Dup()
        return _JoinableHalf(self, HalfSumExchange(self.comm, sizes, self._half_comm))

    def check_none_joined(self, what: str) -> None:
        """Before a collective a joined rank cannot take part in: raise if one has."""
        if self.size > 1:
            self._others_joined("other", what)

    def barrier(self) -> None:
        if self.size > 1:
            self._exchange(self._header("other", None, "sum"))

    # -- join -----------------------------------------------------------------------------
    def join(self) -> int:
        """Serve the reductions of the ranks still training until every rank has joined;
        returns the rank that joined last (the same on every rank)."""
        if self.size == 1:
            return self.rank
        first = True
        while True:
            h = np.full(_HEADER, _LOW, dtype=np.int64)
            h[2 * _NV] = 1
            h[2 * _NV + 1] = self.rank + 1 if first else 0
            first = False
            self._exchange(h)
            kind = int(h[0])
            if kind <= 0:  # everyone is inside join()
                return int(h[2 * _NV + 1]) - 1
            self._check(h)
            if kind == _KINDS["other"]:
                continue
            n, dtype, op = int(h[1]), _DTYPES[int(h[2])], _OPS[int(h[3])]
            if kind == _KINDS["halfsum"]:
                if self._half_comm is None:
                    raise RuntimeError("join(): the other ranks run a float16 exchange this "
                                       "rank never set up (build the optimizer on every rank)")
                HalfSumExchange(self.comm, [n], self._half_comm).start(0).wait()
            elif kind == _KINDS["adasum"]:
                counts = np.full(int(h[4]), _LOW, dtype=np.int64)
                self.comm.allreduce_(counts, "max")
                adasum_(np.zeros(n, dtype), counts, self.comm)
            elif h[5]:  # the others post a blocking all-reduce: so must this rank
                self.comm.allreduce_(np.full(n, _identity(dtype, op), dtype), op)
            else:
                self.comm.iallreduce_(np.full(n, _identity(dtype, op), dtype), op).wait()

    def __getattr__(self, name):
        return getattr(self.comm, name)
