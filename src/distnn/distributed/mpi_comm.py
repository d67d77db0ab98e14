"""``MPIComm``: the ``Communicator`` over an mpi4py communicator, the one place distnn
talks to MPI. mpi4py is imported lazily (``_mpi``), on the first ``MPIComm`` or
``distnn.distributed.world()`` call, so ``import distnn`` never needs it.

Array collectives are in place on contiguous NumPy arrays (uppercase mpi4py methods with
``MPI.IN_PLACE``: no packing, no copies); the ``*_obj`` ones pickle small Python objects.
Every rank must call the same collectives in the same order.
"""
from __future__ import annotations

import os
import sys

import numpy as np

from .comm_base import _check_array, _check_op, _divide_
from .mpi_requests import SlotWindow, _MPIHandle, _poll


def _affinity() -> frozenset:
    try:
        return frozenset(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux: assume every rank shares every core
        return frozenset({-1})


def _mpi():
    from mpi4py import MPI  # the only import of mpi4py in distnn (lazy: optional dependency)
    return MPI


_FP16_SUM = None


def _fp16_sum_op(MPI):
    """SUM over float16 data sent as raw 16-bit words, accumulated in float32 (used when
    the MPI library has no native float16 reduction)."""
    global _FP16_SUM
    if _FP16_SUM is None:
        def add(inbuf, inoutbuf, datatype):
            a = np.frombuffer(inbuf, dtype=np.float16)
            b = np.frombuffer(inoutbuf, dtype=np.float16)
            np.add(a, b, out=b, dtype=np.float32, casting="unsafe")
        _FP16_SUM = MPI.Op.Create(add, commute=True)
    return _FP16_SUM


_NONBLOCKING = {"Allreduce": "Iallreduce", "Bcast": "Ibcast", "Allgather": "Iallgather",
                "Allgatherv": "Iallgatherv", "Barrier": "Ibarrier"}


class MPIComm:
    """Communicator over an mpi4py communicator (default ``MPI.COMM_WORLD``).

    Args:
        mpi_comm: an ``mpi4py.MPI.Comm``; None means ``COMM_WORLD``.
        fp16: how float16 arrays are summed: "native" (MPI's float16 datatype, when the
            library has one) or "op" (a user-defined op over 16-bit words that adds in
            float32); "auto" picks "native" when available.

    Example:
        comm = MPIComm(); comm.allreduce_(grads, "sum")
    """

    stall = None  # the StallInspector that watches every wait (``watch``), if any

    def __init__(self, mpi_comm=None, fp16: str = "auto"):
        MPI = _mpi()
        self.MPI = MPI
        self.comm = MPI.COMM_WORLD if mpi_comm is None else mpi_comm
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        node = self.comm.Split_type(MPI.COMM_TYPE_SHARED, key=self.rank)
        self.local_rank = node.Get_rank()
        self.local_size = node.Get_size()
        # Ranks of this node whose cores overlap this rank's (itself included): local_size
        # when nothing pins them, 1 when the launcher gave each rank cores of its own
        # (Slurm's --cpu-bind, hydra's -bind-to core): then a rank keeps all its cores.
        mine = _affinity()
        cpus = node.allgather(mine) if self.local_size > 1 else [mine]
        self.core_sharers = sum(1 for other in cpus if not mine.isdisjoint(other))
        node.Free()
        if fp16 not in ("auto", "native", "op"):
            raise ValueError(f"fp16 must be 'auto', 'native' or 'op', got {fp16!r}")
        native = getattr(MPI, "FLOAT16_T", MPI.DATATYPE_NULL) != MPI.DATATYPE_NULL
        if fp16 == "native" and not native:
            raise ValueError("fp16='native' but this MPI library has no float16 datatype; "
                             "use fp16='op'")
        self.fp16 = "native" if fp16 == "auto" and native else ("op" if fp16 == "auto" else fp16)
        self._ops = {"sum": MPI.SUM, "mean": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}

    # -- the stall inspector's access to MPI ---------------------------------------------
    def watch(self, inspector) -> None:
        """Have ``inspector`` (a ``StallInspector``; None: none) watch every wait here."""
        self.stall = inspector

    def slot_window(self, slots: int) -> SlotWindow:  # collective
        return SlotWindow(self, slots)

    @property
    def thread_multiple(self) -> bool:  # several threads may call MPI at once
        return self.MPI.Query_thread() == self.MPI.THREAD_MULTIPLE

    def _buf_op(self, arr: np.ndarray, op: str):
        """(buffer spec, MPI op) for arr; float16 goes through the float16 path."""
        if arr.dtype == np.float16:
            if op not in ("sum", "mean"):
                raise ValueError(f"float16 arrays support op 'sum'/'mean' only, got {op!r}")
            if self.fp16 == "native":
                return [arr, self.MPI.FLOAT16_T], self.MPI.SUM
            return [arr.view(np.uint16), self.MPI.UINT16_T], _fp16_sum_op(self.MPI)
        return arr, self._ops[op]

    def _collective(self, request, arr=None, divide_by=1, keep=None):
        """A handle of a started collective, watched by the stall inspector if any."""
        watch = (self.stall, self.stall.started(), None) if self.stall is not None else None
        return _MPIHandle(request, np.zeros(0) if arr is None else arr, divide_by, keep, watch)

    def _watched(self, fn, *args, **kwargs):
        """A blocking collective, counted and watched by the stall inspector if any."""
        stall = self.stall
        if stall is None:
            return fn(*args, **kwargs)
        stall.enter(stall.started())
        try:
            if stall.interruptible:  # distnn search's blocks: a failed rank must not hang them
                return self._polled(fn.__name__, *args, **kwargs)
            return fn(*args, **kwargs)
        finally:
            stall.leave()

    def _polled(self, name: str, *args, **kwargs):
        """The blocking collective ``name`` as its non-blocking twin completed by ``_poll``
        (ends with ``PeerFailed`` when a rank that will never join has said so); the object
        ones (bcast, allgather, allreduce) send pickles: their sizes, then the bytes."""
        import pickle
        comm, MPI, stall = self.comm, self.MPI, self.stall
        if name in _NONBLOCKING:
            _poll(getattr(comm, _NONBLOCKING[name])(*args, **kwargs), stall, args)
            return None
        if name == "bcast":
            obj, root = args[0] if args else kwargs.get("obj"), kwargs.get("root", 0)
            data = pickle.dumps(obj, -1) if comm.rank == root else b""
            size = np.array([len(data)], dtype=np.int64)
            _poll(comm.Ibcast(size, root=root), stall, size)
            buf = np.frombuffer(data, np.uint8).copy() if data else np.empty(size[0], np.uint8)
            _poll(comm.Ibcast(buf, root=root), stall, buf)
            return obj if comm.rank == root else pickle.loads(buf.tobytes())
        data = np.frombuffer(pickle.dumps(args[0], -1), np.uint8)
        sizes = np.zeros(comm.size, dtype=np.int64)
        mine = np.array([data.size], dtype=np.int64)
        _poll(comm.Iallgather(mine, sizes), stall, (mine, sizes))
        out = np.empty(int(sizes.sum()), np.uint8)
        offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        _poll(comm.Iallgatherv(data, [out, (sizes, offsets), MPI.BYTE]), stall, (data, out))
        objs = [pickle.loads(out[o:o + n].tobytes()) for o, n in zip(offsets, sizes)]
        if name == "allgather":
            return objs
        op = kwargs.get("op", args[1] if len(args) > 1 else MPI.SUM)  # allreduce
        if not (op == MPI.SUM or op == MPI.MAX or op == MPI.MIN):
            raise ValueError(f"interruptible allreduce of objects: op must be MPI.SUM, MAX "
                             f"or MIN, got {op!r}")
        total = objs[0]
        for obj in objs[1:]:  # mpi4py's meaning of the three on Python objects
            if op == MPI.SUM:
                total = total + obj
            elif (obj > total) if op == MPI.MAX else (obj < total):
                total = obj
        return total

    def allreduce_(self, arr, op="sum"):
        _check_op(op, _check_array(arr, "allreduce_"))
        buf, mpi_op = self._buf_op(arr, op)
        self._watched(self.comm.Allreduce, self.MPI.IN_PLACE, buf, op=mpi_op)
        return _divide_(arr, self.size) if op == "mean" else arr

    def iallreduce_(self, arr, op="sum"):
        _check_op(op, _check_array(arr, "iallreduce_"))
        buf, mpi_op = self._buf_op(arr, op)
        request = self.comm.Iallreduce(self.MPI.IN_PLACE, buf, op=mpi_op)
        return self._collective(request, arr, self.size if op == "mean" else 1, keep=buf)

    def bcast_(self, arr, root=0):
        _check_array(arr, "bcast_")
        buf = [arr.view(np.uint16), self.MPI.UINT16_T] if arr.dtype == np.float16 else arr
        self._watched(self.comm.Bcast, buf, root=root)
        return arr

    def allgather(self, arr):
        arr = np.ascontiguousarray(arr)
        out = np.empty((self.size,) + arr.shape, dtype=arr.dtype)
        if arr.dtype == np.float16:
            self._watched(self.comm.Allgather, [arr.view(np.uint16), self.MPI.UINT16_T],
                          [out.view(np.uint16), self.MPI.UINT16_T])
        else:
            self._watched(self.comm.Allgather, arr, out)
        return out

    def bcast_obj(self, obj, root=0):
        return self._watched(self.comm.bcast, obj, root=root)

    def allgather_obj(self, obj):
        return self._watched(self.comm.allgather, obj)

    def allreduce_obj(self, obj, op="sum"):
        _check_op(op)
        out = self._watched(self.comm.allreduce, obj, op=self._ops[op])
        return out / self.size if op == "mean" else out

    def barrier(self):
        self._watched(self.comm.Barrier)

    def split(self, color, key=0):
        return MPIComm(self.comm.Split(color, key), fp16=self.fp16)

    def subgroup(self, ranks, tag=0):
        """A new communicator of ``ranks`` (of this one), made by those ranks only (the
        others need not take part: ``MPI_Comm_create_group``)."""
        group = self.comm.Get_group().Incl(list(ranks))
        try:
            return MPIComm(self.comm.Create_group(group, tag), fp16=self.fp16)
        finally:
            group.Free()

    # -- point to point (arrays; the rules in distnn.rules use them) ----------------------
    def send_(self, arr, dest, tag=0):
        """Blocking send of a contiguous array to rank ``dest``."""
        self.comm.Send(_check_array(arr, "send_"), dest=dest, tag=tag)

    def recv_(self, arr, source, tag=0):
        """Blocking receive into ``arr`` (its size must match the message); returns arr."""
        self.comm.Recv(_check_array(arr, "recv_"), source=source, tag=tag)
        return arr

    def isend_(self, arr, dest, tag=0):
        """Start sending ``arr``; keep it unchanged until the handle's ``wait``/``test``."""
        return _MPIHandle(self.comm.Isend(_check_array(arr, "isend_"), dest=dest, tag=tag),
                          arr, 1, watch=self.stall and (self.stall, None, (dest,)))

    def irecv_(self, arr, source, tag=0):
        """Start receiving into ``arr``; the handle's ``wait()`` returns it filled."""
        return _MPIHandle(self.comm.Irecv(_check_array(arr, "irecv_"), source=source, tag=tag),
                          arr, 1, watch=self.stall and (self.stall, None, (source,)))

    def iprobe(self, source=-1, tag=-1):
        """(source, tag, bytes) of a message waiting to be received, or None (-1: any)."""
        MPI = self.MPI
        status = MPI.Status()
        if not self.comm.Iprobe(source=MPI.ANY_SOURCE if source < 0 else source,
                                tag=MPI.ANY_TAG if tag < 0 else tag, status=status):
            return None
        return status.Get_source(), status.Get_tag(), status.Get_count(MPI.BYTE)

    def ibarrier(self):
        """Start a barrier; ``test()`` polls it (wait in a sleep loop, not a busy poll)."""
        return self._collective(self.comm.Ibarrier())

    def abort(self, code=1):
        sys.stdout.flush()
        sys.stderr.flush()
        self.MPI.COMM_WORLD.Abort(code)

    def library_version(self) -> str:
        """First line of the MPI library's version string."""
        return " ".join(self.MPI.Get_library_version().strip().splitlines()[0].split())

    def mpi4py_version(self) -> str:
        import mpi4py
        return mpi4py.__version__

    # -- added for Horovod's collectives (alltoall, reducescatter, Adasum) ---------------
    def sendrecv_(self, send, dest, recv, source, tag=0):
        """Send ``send`` to ``dest`` while receiving into ``recv`` from ``source``."""
        def raw(a):
            return [a.view(np.uint16), self.MPI.UINT16_T] if a.dtype == np.float16 else a
        self.comm.Sendrecv(raw(_check_array(send, "sendrecv_")), dest, tag,
                           raw(_check_array(recv, "sendrecv_")), source, tag)
        return recv

    def alltoallv_(self, send, send_counts, recv, recv_counts):
        """Exchange slices of 1-D arrays: ``send_counts[r]`` elements (in rank order) go to
        rank r, ``recv_counts[r]`` arrive from it; returns recv."""
        def spec(a, counts):
            counts = [int(c) for c in counts]
            displs = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(int).tolist()
            if a.dtype == np.float16:
                return [a.view(np.uint16), (counts, displs), self.MPI.UINT16_T]
            return [a, (counts, displs)]
        self.comm.Alltoallv(spec(_check_array(send, "alltoallv_"), send_counts),
                            spec(_check_array(recv, "alltoallv_"), recv_counts))
        return recv

    def _gatherv(self, arr, counts):
        """(send, receive, result) of the all-gather of every rank's 1-D ``arr`` as bytes."""
        arr = np.ascontiguousarray(arr)
        counts = [int(c) for c in counts]
        if arr.size != counts[self.rank]:
            raise ValueError(f"allgatherv: this rank passes {arr.size} elements but counts "
                             f"says {counts[self.rank]}; every rank passes the same counts")
        out = np.empty(sum(counts), dtype=arr.dtype)
        nbytes = [c * arr.itemsize for c in counts]
        displs = np.concatenate([[0], np.cumsum(nbytes)[:-1]]).astype(int).tolist()
        return ([arr.view(np.uint8), self.MPI.BYTE],
                [out.view(np.uint8), (nbytes, displs), self.MPI.BYTE], out)

    def allgatherv(self, arr, counts):
        """Every rank's 1-D ``arr`` (``counts[r]`` elements from rank r, the same dtype
        everywhere), concatenated in rank order (MPI ``Allgatherv``, as raw bytes)."""
        send, recv, out = self._gatherv(arr, counts)
        self._allgatherv(send, recv)
        return out

    def _allgatherv(self, send, recv) -> None:
        # MPICH's blocking Allgatherv runs a ring pipelined in 32 KiB pieces for large
        # buffers (MPIR_CVAR_ALLGATHERV_PIPELINE_MSG_SIZE): 15.6 MB in place over 2 ranks
        # took 160-500 ms where its non-blocking twin, waited for, took 22-28 ms
        if self.stall is not None and self.stall.interruptible:
            self._watched(self.comm.Allgatherv, send, recv)  # polled as Iallgatherv
        else:
            self._watched(lambda a, b: self.comm.Iallgatherv(a, b).Wait(), send, recv)

    def iallgatherv(self, arr, counts):
        """Start ``allgatherv``; the handle's ``wait()`` returns the concatenation (MPI
        reads ``arr`` until then: keep it unchanged)."""
        send, recv, out = self._gatherv(arr, counts)
        return self._collective(self.comm.Iallgatherv(send, recv), out, keep=(send, recv))

    def reduce_scatter_(self, send, recv, counts, op="sum"):
        """Reduce the 1-D ``send`` over ranks; rank r receives the r-th block of
        ``counts[r]`` elements into ``recv``; returns recv."""
        _check_op(op, _check_array(recv, "reduce_scatter_"))
        send = np.ascontiguousarray(send)
        if send.dtype == np.float16:  # through the all-reduce's float16 path
            tmp = send.copy()
            self.allreduce_(tmp, op)
            lo = int(np.sum(counts[:self.rank]))
            np.copyto(recv, tmp[lo:lo + int(counts[self.rank])])
            return recv
        self.comm.Reduce_scatter(send, recv, [int(c) for c in counts], op=self._ops[op])
        return _divide_(recv, self.size) if op == "mean" else recv

    # -- sharded training state (distributed/sharded.py) -------------------------------
    def ireduce_scatter_(self, send, recv, counts, op="sum"):
        """Start reducing the 1-D ``send`` over ranks; rank r receives the r-th block of
        ``counts[r]`` elements into ``recv`` (MPI ``Ireduce_scatter``); keep ``send``
        unchanged until the handle's ``wait()``, which returns recv."""
        _check_op(op, _check_array(recv, "ireduce_scatter_"))
        _check_array(send, "ireduce_scatter_")
        if send.dtype == np.float16:
            raise TypeError("ireduce_scatter_: float16 is not supported; use reduce_scatter_")
        counts = [int(c) for c in counts]
        request = self.comm.Ireduce_scatter(send, recv, counts, op=self._ops[op])
        return self._collective(request, recv, self.size if op == "mean" else 1,
                                keep=(send, counts))

    def allgatherv_(self, buf, counts):
        """In place: rank r's block of ``counts[r]`` elements (in rank order, at offset
        ``sum(counts[:r])`` of the 1-D ``buf``) reaches every rank (MPI ``Allgatherv`` with
        ``MPI.IN_PLACE``, as raw bytes); returns buf."""
        _check_array(buf, "allgatherv_")
        counts = [int(c) for c in counts]
        if sum(counts) != buf.size:
            raise ValueError(f"allgatherv_: counts sum to {sum(counts)} but the buffer holds "
                             f"{buf.size} elements; pass one count per rank covering it")
        nbytes = [c * buf.itemsize for c in counts]
        displs = np.concatenate([[0], np.cumsum(nbytes)[:-1]]).astype(int).tolist()
        self._allgatherv(self.MPI.IN_PLACE, [buf.view(np.uint8), (nbytes, displs),
                                             self.MPI.BYTE])
        return buf

    def __repr__(self):
        return f"MPIComm(rank={self.rank}, size={self.size})"
