"""The CPU an exchange takes on a rank's own core, measured here, for the cost model
(``predict.py``; equations: docs/costmodel.md "The exchange's CPU").

Two parts, both measured on this machine, one thread:

- **the Reducer's own work** per step and per compression (``calibrate_steps``): the real
  ``Reducer`` of ``distnn.distributed`` (its buckets, ``CompressedReduction``,
  ``BucketedCompression``, the float16 buffers of ``halfsum``) runs steps on the model's
  real tensor shapes over a ``PhantomComm`` of P ranks: a communicator that moves nothing
  but hands back, when waited for, what the other ranks would have sent (this rank's own
  payload P times; for fp16 the P chunks the sum adds), so the selection, encoding,
  scatter-add of P ranks' pairs, PowerSGD's products and QR, the casts, float32 sums,
  error feedback and packing all run as in a step of P ranks. The time until the last
  bucket is started (``ready`` calls, during backward: compressing) and the time of
  ``synchronize`` (waiting, unpacking, decompressing) are kept apart: ``pre`` and ``post``.
  MPI's own float32 sum in an all-reduce is done too, on the elements MPICH's algorithm
  reduces on a rank.
- **TCP** (``calibrate_tcp``): seconds per message and per byte that a rank sends and
  receives, from messages through a TCP connection on 127.0.0.1 within this process
  (send and receive on one thread: the kernel's copies and the loopback's protocol work).

    cpu = calibrate_cpu(parameter_tensors(net), segments, specs=["none", "topk:0.01"],
                        hosts=[2, 4, 8])
    model = ModelCost(compute_s=0.029, tensors=..., cpu=cpu, slowdown=4)
"""
from __future__ import annotations

import socket
import statistics
import time
from dataclasses import dataclass, field

import numpy as np

from ..distributed.compressors import parse_compression
from ..distributed.halfsum import _Bucket
from ..distributed.reducer import Reducer
from ..kernels.half import sum_halves
from .collectives import ALLREDUCE_SHORT_MSG_SIZE

__all__ = ["CpuCost", "PhantomComm", "calibrate_cpu", "calibrate_steps", "calibrate_tcp",
           "spec_key"]


def spec_key(spec) -> str:
    """The canonical text of a compression spec ("none", "fp16", "topk:0.01", ...)."""
    return parse_compression(None if spec in (None, "none") else spec).spec


class _Later:
    """A handle whose work (what the message's arrival would let this rank do) runs at
    ``wait``; ``test`` says not yet, as a message still on the link would."""

    def __init__(self, work):
        self._work, self._out = work, None

    def test(self) -> bool:
        return False

    def wait(self):
        if self._work is not None:
            self._out, self._work = self._work(), None
        return self._out


class _PhantomHalf:
    """``HalfSumExchange`` without MPI: its buckets (halfsum's ``_Bucket``); at ``wait``
    the float32 sum of the P float16 chunks, as after phase 1."""

    def __init__(self, comm: "PhantomComm", sizes):
        self.comm = comm
        self.buckets = [_Bucket(int(n), comm.size) for n in sizes]
        rng = np.random.default_rng(0)
        for bk in self.buckets:  # what the other ranks' chunks hold: gradient-like values
            bk.recv[...] = (rng.standard_normal(bk.recv.shape) * 1e-2).astype(np.float16)

    def wire(self, b: int) -> np.ndarray:
        return self.buckets[b].wire

    def start(self, b: int) -> _Later:
        bk, k = self.buckets[b], self.comm.rank
        if bk.whole:
            bk.recv.view(np.uint16)[k] = bk.wire.view(np.uint16)
            return _Later(lambda: sum_halves(bk.recv, bk.wire, bk.acc))
        return _Later(lambda: (sum_halves(bk.recv, bk.padded[k * bk.m:(k + 1) * bk.m],
                                          bk.acc), bk.wire)[1])


class PhantomComm:
    """Rank 0 of ``size`` ranks, moving nothing: an all-reduce leaves the buffer as it is
    (after MPI's float32 additions of the elements this rank would reduce); an
    all-gather returns this rank's part ``size`` times; fp16 buckets go through
    ``_PhantomHalf``. For measuring a rank's CPU only: the results are not sums."""

    rank = local_rank = 0
    local_size = core_sharers = 1
    stall = None

    def __init__(self, size: int):
        if size < 2:
            raise ValueError(f"PhantomComm stands for 2 or more ranks, got {size!r}")
        self.size = int(size)
        self._scratch = np.zeros(0, np.float64)
        self._gathers: dict = {}  # the other ranks' parts, made once per shape

    def _reduced(self, arr: np.ndarray) -> int:
        """Elements MPICH's all-reduce adds on one rank (its algorithm as collectives.py)."""
        n, p = arr.size, 1 << (self.size.bit_length() - 1)
        steps = p.bit_length() - 1
        if arr.nbytes <= ALLREDUCE_SHORT_MSG_SIZE or n < p:
            k = steps * n
        else:
            k = (p - 1) * n // p
        return k + (n if p != self.size else 0)

    def _sum(self, arr: np.ndarray) -> np.ndarray:
        flat = arr.reshape(-1)
        if self._scratch.nbytes < flat.nbytes:
            self._scratch = np.zeros(flat.nbytes // 8 + 1, np.float64)
        scratch = self._scratch.view(np.uint8)[:flat.nbytes].view(flat.dtype)
        left = self._reduced(flat)
        while left > 0:
            m = min(left, flat.size)
            np.add(flat[:m], flat[:m], out=scratch[:m])
            left -= m
        return arr

    def allreduce_(self, arr, op="sum"):
        return self._sum(arr)

    def iallreduce_(self, arr, op="sum"):
        return _Later(lambda: self._sum(arr))

    def allgather(self, arr):
        return np.repeat(np.asarray(arr)[None], self.size, axis=0)

    def _gathered(self, part: np.ndarray, sizes) -> np.ndarray:
        """Every rank's part (this rank's, ``size`` times), made on the first gather of
        this shape and kept: MPI writes what it receives in place (TCP's copy, counted
        apart), so no copy is timed here."""
        key = (part.dtype.str, part.size, tuple(int(s) for s in sizes))
        if key not in self._gathers:
            self._gathers[key] = np.concatenate([np.resize(part, int(s)) for s in sizes])
        return self._gathers[key]

    def allgatherv(self, part, sizes):
        return self._gathered(np.asarray(part), sizes)

    def iallgatherv(self, part, sizes):
        return _Later(lambda: self._gathered(np.asarray(part), sizes))

    def barrier(self):
        pass

    def half_exchange(self, sizes) -> _PhantomHalf:
        return _PhantomHalf(self, sizes)


@dataclass(frozen=True)
class CpuCost:
    """CPU seconds of the exchange on one rank (one core to itself), measured here.

    Attributes:
        steps: {spec: [(hosts, pre_s, post_s)]}: the Reducer's work a step on P ranks,
            until its last bucket is started (during backward) and in ``synchronize``.
        tcp_message_s, tcp_byte_s: a message, a byte, that a rank sends and receives.
        overlap_link: a transfer's TCP work and its time on the link run at once (a TCP
            stream: the copies of one segment while the link carries the one before), so
            an exchange takes the longer of the two; False adds them.
    """
    steps: dict = field(default_factory=dict)
    tcp_message_s: float = 0.0
    tcp_byte_s: float = 0.0
    overlap_link: bool = True

    def step_s(self, spec, hosts: int) -> tuple[float, float]:
        """(pre, post) seconds on ``hosts`` ranks: measured there, else interpolated
        linearly in P between the nearest measured counts (the end ones beyond them)."""
        key = spec_key(spec)
        if key not in self.steps:
            raise ValueError(f"the CPU cost is not calibrated for compression {key!r}; "
                             f"calibrate_cpu(..., specs=[{key!r}, ...]) (has "
                             f"{sorted(self.steps)})")
        pts = sorted(self.steps[key])
        if hosts <= pts[0][0]:
            return pts[0][1], pts[0][2]
        for (h0, a0, b0), (h1, a1, b1) in zip(pts, pts[1:]):
            if hosts <= h1:
                w = (hosts - h0) / (h1 - h0)
                return a0 + w * (a1 - a0), b0 + w * (b1 - b0)
        return pts[-1][1], pts[-1][2]

    def tcp_s(self, messages: float, nbytes: float) -> float:
        """CPU seconds to send ``messages`` messages of ``nbytes`` in all (and receive as
        many), on a core of one's own."""
        return messages * self.tcp_message_s + nbytes * self.tcp_byte_s

    def exchange_s(self, link_s: float, messages: float, nbytes: float,
                   slowdown: float = 1.0) -> float:
        """An exchange's seconds: its time on the link and its TCP work on a core shared
        ``slowdown`` ways (the longer of the two, or their sum: ``overlap_link``)."""
        if link_s <= 0 and messages <= 0:
            return link_s
        cpu = slowdown * self.tcp_s(messages, nbytes)
        return max(link_s, cpu) if self.overlap_link else link_s + cpu

    def describe(self) -> str:
        lines = [f"TCP: {self.tcp_message_s * 1e6:.2f} us a message, "
                 f"{self.tcp_byte_s * 1e9:.3f} ns a byte (sent and received)"]
        for key, pts in sorted(self.steps.items()):
            lines.append(f"{key}: " + ", ".join(f"{h} ranks {a * 1e3:.3f} + {b * 1e3:.3f} ms"
                                                 for h, a, b in sorted(pts)))
        return "\n".join(lines)


def _one_thread():
    try:
        from threadpoolctl import threadpool_limits
        return threadpool_limits(1)
    except ImportError:  # pragma: no cover - threadpoolctl comes with the dependencies
        import contextlib
        return contextlib.nullcontext()


def calibrate_steps(tensors, segments=None, specs=("none",), hosts=(2,), *, steps: int = 5,
                    warmup: int = 2, bucket_size_mb: float = 4.0, seed: int = 0) -> dict:
    """{spec: [(hosts, pre_s, post_s)]}: median process-CPU seconds of ``steps`` steps
    (after ``warmup``) of the real Reducer with ``spec`` over a ``PhantomComm`` of each
    host count, on a gradient buffer of ``tensors`` ([(name, start, stop, shape)]) cut
    into ``segments`` ([(name, start, stop)] in forward order; None: one per tensor)."""
    n = max((hi for _, _, hi, _ in tensors), default=0)
    segs = segments or [(name, lo, hi) for name, lo, hi, _ in tensors]
    grads = (np.random.default_rng(seed).standard_normal(n) * 1e-2).astype(np.float32)
    out: dict = {}
    with _one_thread():
        for spec in specs:
            key = spec_key(spec)
            for p in hosts:
                flat = np.zeros(n, np.float32)
                red = Reducer(flat, segs, PhantomComm(p), compression=key,
                              tensors=tensors, bucket_size_mb=bucket_size_mb)
                pre, post = [], []
                for i in range(warmup + steps):
                    red.reset()
                    flat[...] = grads
                    t0 = time.process_time()
                    for s in reversed(range(len(segs))):  # backward order
                        red.ready(s)
                    t1 = time.process_time()
                    red.synchronize()
                    t2 = time.process_time()
                    if i >= warmup:
                        pre.append(t1 - t0)
                        post.append(t2 - t1)
                out.setdefault(key, []).append((int(p), statistics.median(pre),
                                                statistics.median(post)))
    return out


def _pair():
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        srv.bind(("127.0.0.1", 0))  # loopback only
        srv.listen(1)
        a = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        for s in (a, srv):
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        a.connect(srv.getsockname())
        b, _ = srv.accept()
    finally:
        srv.close()
    for s in (a, b):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.settimeout(10.0)
    return a, b


def _through(a, b, size: int, count: int) -> float:
    """Seconds per message of ``count`` messages of ``size`` bytes from a to b, sent and
    received on this thread."""
    data, got = bytes(size), bytearray(size)
    view = memoryview(got)
    t0 = time.perf_counter()
    for _ in range(count):
        a.sendall(data)
        k = 0
        while k < size:
            k += b.recv_into(view[k:], size - k)
    return (time.perf_counter() - t0) / count


def calibrate_tcp(small: int = 64, large: int = 1 << 15, count: int = 200,
                  batches: int = 7) -> tuple[float, float]:
    """(seconds a message, seconds a byte) that a rank spends to send and receive, from
    messages of ``small`` and ``large`` bytes through a TCP connection on 127.0.0.1 (this
    process both ends, one thread; wall time, as the kernel's protocol work runs partly
    outside the process's CPU account): the least of ``batches`` batches of ``count``
    messages each, the two sizes' batches taken in turn."""
    a, b = _pair()
    try:
        _through(a, b, large, 20)  # warm the connection's buffers
        t_small = t_large = float("inf")
        for _ in range(batches):
            t_small = min(t_small, _through(a, b, small, count))
            t_large = min(t_large, _through(a, b, large, count))
    finally:
        a.close()
        b.close()
    per_byte = max(0.0, (t_large - t_small) / (large - small))
    return max(0.0, t_small - small * per_byte), per_byte


def calibrate_cpu(tensors, segments=None, specs=("none", "fp16", "topk:0.01", "powersgd:2"),
                  hosts=(2, 4, 8), *, steps: int = 5, bucket_size_mb: float = 4.0,
                  tcp: bool = True, overlap_link: bool = True) -> CpuCost:
    """The ``CpuCost`` of ``tensors``' exchange: ``calibrate_steps`` for every spec and
    host count, and ``calibrate_tcp`` (skipped, zero, with ``tcp=False``)."""
    msg, byte = calibrate_tcp() if tcp else (0.0, 0.0)
    return CpuCost(calibrate_steps(tensors, segments, specs, hosts, steps=steps,
                                   bucket_size_mb=bucket_size_mb), msg, byte, overlap_link)
