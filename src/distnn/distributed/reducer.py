"""The one gradient reducer behind both DistributedOptimizers (NumPy and torch), as DDP's
Reducer: a flat buffer cut into buckets, readiness counts, buckets started strictly in
order during backward, one synchronize that completes and scales them, and counters.

The framework adapters only translate their hooks (a distnn layer's gradients ready, a
torch parameter's gradient accumulated) into ``ready(segment)`` calls. What gradients
become, in the one documented place (docs/design.md §Gradient averaging):

- ``op="average"``: the sum over ranks divided by the number of ranks (Horovod/DDP);
  with ``gradient_predivide_factor`` f the buffer is multiplied by 1/f before the sum and
  by f/size after it (Horovod's split of the average).
- ``op="sum"``: the sum over ranks.
- ``op="adasum"``: the adaptive sum of ``adasum.py``, segment by segment (blocking, in
  ``synchronize``; the optimizers apply it to parameter deltas, as Horovod does).

With ``backward_passes_per_step`` k a bucket starts after k backward passes (the
framework accumulates the gradients in between); ``compression`` decides the wire dtype
("none", "fp16") or, for "topk:R", "threshold:V" and "powersgd:R", hands the buffer to a
``CompressedReduction`` (lossy.py): with ``non_blocking`` bucket by bucket as their
gradients are ready, overlapped with backward (``BucketedCompression``,
compressed_buckets.py; the same result bit for bit), else, and in the warm-up steps, the
whole buffer at once in ``synchronize`` (blocking, after backward).

With "fp16" and op "average" or "sum" over an ``MPIComm`` (or a ``JoinableComm`` of one,
whose joined ranks send zeros), a bucket travels through ``HalfSumExchange`` (halfsum.py:
an all-to-all of float16 chunks, a float32 sum, an all-gather of the float16 sums; no
user-defined MPI op): each element becomes ``float16(the float32 sum, in rank order, of
the ranks' float16 values)``, cast to the buffer's dtype and, for "average", divided by
the number of ranks. Over any other communicator and for Adasum, the float16 bucket is
all-reduced as it is (``MPIComm``'s float16 sum: MPI's native one, or a user-defined op
that adds pairs in float32, the path ``hvd.allreduce`` of a float16 tensor keeps).
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np

from ..kernels.half import from_half, to_half
from .adasum import adasum_
from .comm import Communicator
from .compressed_buckets import BucketedCompression
from .lossy import CompressedReduction
from .compressors import Compression
from .halfsum import half_exchange_for

REDUCE_OPS = ("average", "sum", "adasum")
Bucket = tuple[int, int, list[str]]


def make_buckets(layer_ranges, itemsize: int, bucket_size_mb: float) -> list[Bucket]:
    """Group top-level layers into contiguous buckets in *backward* order.

    Args:
        layer_ranges: ``model.layer_ranges()``: (layer, start, stop) in forward order.
        itemsize: bytes per gradient element.
        bucket_size_mb: target bucket size in MiB; a layer larger than that is a bucket
            of its own; 0 makes every layer its own bucket.

    Returns:
        [(start, stop, [layer names])], the first bucket holding the last layers.
    """
    if bucket_size_mb < 0:
        raise ValueError(f"bucket_size_mb must be >= 0, got {bucket_size_mb}")
    cap = bucket_size_mb * (1 << 20)
    buckets: list[Bucket] = []
    names: list[str] = []
    start = stop = 0
    for layer, lo, hi in reversed(list(layer_ranges)):
        nbytes = (hi - lo) * itemsize
        if names and ((stop - start) * itemsize + nbytes > cap or hi != start):
            buckets.append((start, stop, names))
            names = []
        if not names:
            start, stop = lo, hi
        start = lo
        names.append(layer.name)
        if (stop - start) * itemsize >= cap:
            buckets.append((start, stop, names))
            names = []
    if names:
        buckets.append((start, stop, names))
    return buckets




class _Named:
    def __init__(self, name: str):
        self.name = name


def wire_dtype(compression) -> Any:
    """The dtype a bucket travels in: None (the buffer's own) or np.float16 (the parsed
    ``compression``'s ``wire_dtype``; see ``compressors.py``)."""
    return getattr(Compression.parse(compression), "wire_dtype", None)


class Reducer:
    """Reduce a flat gradient buffer over ranks in buckets of whole segments.

    Args:
        flat: the 1-D gradient buffer (reduced in place).
        segments: [(name, start, stop)] in forward order (layers or parameters).
        comm: communicator (or ``JoinableComm``) to reduce over.
        op: "average", "sum" or "adasum" (see the module doc).
        bucket_size_mb: target bucket size (0: one segment per bucket).
        non_blocking: start buckets from ``ready()``; False reduces them in
            ``synchronize()`` with blocking calls.
        compression: see ``wire_dtype``.
        backward_passes_per_step: backward passes per reduction.
        gradient_predivide_factor: Horovod's split of the average (op "average" only).
        blocking_last: reduce the last bucket (ready when backward ends) with the blocking
            all-reduce, MPI's fastest path, instead of a non-blocking one.
        what: the word for a segment in errors ("layer", "parameter").
        tensors: [(name, start, stop, shape)] of every parameter, for the compressions
            that look at shapes (default: each segment as one 1-D tensor).
        error_feedback, compression_warmup_steps: of a compressing ``compression``
            (lossy.py).
        stall: a ``stall.StallInspector`` told which bucket this rank waits for (None: none).
        compressor: the ``CompressedReduction`` of a reducer this one replaces (its
            residuals, Q matrices and step count go on; ``DistributedOptimizer.rebucket``).

    Attributes:
        bytes_reduced: bytes this rank handed to collectives (after compression);
        bytes_dense: what a dense exchange in the buffer's dtype would have handed over.
        compressor: the ``CompressedReduction`` (residuals, PowerSGD's Q) or None.
        overlap: its exchange bucket by bucket during backward (None: blocking; always
            for ``non_blocking=False`` and a communicator of one).
        early_starts: buckets whose exchange ``ready()`` started while gradients of the
            same step were still to come (the overlap with backward, counted).
    """

    def __init__(self, flat: np.ndarray, segments, comm: Communicator, *, op: str = "average",
                 bucket_size_mb: float = 4.0, non_blocking: bool = True, compression=None,
                 backward_passes_per_step: int = 1, gradient_predivide_factor: float = 1.0,
                 blocking_last: bool = False, what: str = "layer", tensors=None,
                 error_feedback: bool = True, compression_warmup_steps: int = 0, stall=None,
                 compressor=None):
        if op not in REDUCE_OPS:
            raise ValueError(f"op must be one of {REDUCE_OPS}, got {op!r}")
        passes = backward_passes_per_step
        if isinstance(passes, bool) or int(passes) != passes or passes < 1:
            raise ValueError("backward_passes_per_step must be an integer >= 1, got "
                             f"{passes!r}")
        factor = float(gradient_predivide_factor)
        if not factor > 0:
            raise ValueError(f"gradient_predivide_factor must be > 0, got {factor}")
        if factor != 1.0 and op != "average":
            raise ValueError(f"gradient_predivide_factor={factor} needs op='average' "
                             f"(Horovod's rule), got op={op!r}")
        compression = Compression.parse(compression)  # once: the object is shared
        compressing = bool(getattr(compression, "compressing", False))  # False: user objects
        if compressing and op == "adasum":
            raise ValueError(f"compression {compression.spec!r} needs op 'average' or 'sum': "
                             "Adasum combines parameter deltas, not gradients; use "
                             "compression='fp16' or none with op='adasum'")
        if compressing and factor != 1.0:
            raise ValueError(f"gradient_predivide_factor={factor} applies to dense "
                             f"all-reduces, not to compression {compression.spec!r}; use 1")
        self.flat, self.comm, self.op, self.what = flat, comm, op, what
        self.stall = stall
        self.non_blocking = bool(non_blocking)
        self.wire = compression.wire_dtype
        self.compression = compression
        self.passes = int(passes)
        self.predivide = factor
        self.blocking_last = bool(blocking_last)
        self.names = [name for name, _, _ in segments]
        ranges = [(_Named(name), int(lo), int(hi)) for name, lo, hi in segments]
        self.buckets = make_buckets(ranges, flat.itemsize, bucket_size_mb)
        # make_buckets emits the segments in reverse order: the k-th name is segment n-1-k
        order = [b for b, (_, _, names) in enumerate(self.buckets) for _ in names]
        self.bucket_of = order[::-1]
        self.counts = [[hi - lo for i, (_, lo, hi) in enumerate(ranges) if self.bucket_of[i] == b]
                       for b in range(len(self.buckets))]
        self._sizes = [len(names) for _, _, names in self.buckets]
        self._wire_bufs = ([np.empty(hi - lo, self.wire) for lo, hi, _ in self.buckets]
                           if self.wire is not None and self.wire != flat.dtype else None)
        self.half = None  # the float16 exchange of the buckets (see the module doc)
        if self._wire_bufs is not None and self.wire == np.float16 and op != "adasum":
            self.half = half_exchange_for(comm, [hi - lo for lo, hi, _ in self.buckets])
        if self.half is not None:
            self._wire_bufs = [self.half.wire(b) for b in range(len(self.buckets))]
        self.active = comm.size > 1
        self.allreduce_calls = 0
        self.bytes_reduced = 0
        self.bytes_dense = 0
        self.comm_wait_time = 0.0
        self.compressor = compressor if compressing else None  # kept: a reducer rebucketed
        if compressing and compressor is None:
            if tensors is None:
                tensors = [(n, lo, hi, (hi - lo,)) for n, lo, hi in segments]
            self.compressor = CompressedReduction(
                compression, flat, tensors, comm, op=op, error_feedback=error_feedback,
                warmup_steps=compression_warmup_steps)
        self.overlap = None
        if self.compressor is not None and self.non_blocking and self.active \
                and hasattr(comm, "iallgatherv"):
            self.overlap = BucketedCompression.for_buckets(self.compressor, self.buckets)
        self.early_starts = 0
        self.reset()

    # -- state ----------------------------------------------------------------------------
    def reset(self) -> None:
        self.pending = [n * self.passes for n in self._sizes]
        self.handles: list[Any] = [None] * len(self.buckets)
        self.next = 0  # buckets start strictly in order: every rank posts the same sequence
        self.synced = False

    # -- what the optimizers over a reducer ask of it ----------------------------------------
    @property
    def in_flight(self) -> bool:
        """Whether backward has started exchanges that ``synchronize`` has not finished (the
        buffer is being read: it must not be zeroed now)."""
        return self.next > 0 and not self.synced

    def not_started(self) -> list[int]:
        """The segments whose bucket has no exchange started yet (their gradients no
        ``ready`` has announced: unused parameters, or a blocking reducer)."""
        return [i for i, b in enumerate(self.bucket_of) if b >= self.next]

    def set_passes(self, passes: int) -> None:
        """Change ``backward_passes_per_step`` between steps (forgets pending exchanges)."""
        if isinstance(passes, bool) or int(passes) != passes or passes < 1:
            raise ValueError("backward_passes_per_step must be an integer >= 1, got "
                             f"{passes!r}")
        self.passes = int(passes)
        self.reset()

    def ready(self, i: int) -> None:
        """Segment i has its gradient for one more backward pass."""
        b = self.bucket_of[i]
        if self.pending[b] <= 0 or self.synced:
            raise RuntimeError(
                f"DistributedOptimizer: {self.what} {self.names[i]!r} produced gradients more "
                f"than backward_passes_per_step={self.passes} times before step(); call "
                "step() (or synchronize()) after every backward pass, or raise "
                "backward_passes_per_step")
        self.pending[b] -= 1
        if not self.non_blocking or self.op == "adasum":
            return  # Adasum runs in synchronize()
        ov = self.overlap
        if self.compressor is not None and (ov is None or self.next == 0 and ov.in_warmup()):
            return  # blocking compression and its warm-up steps run in synchronize()
        while self.next < len(self.buckets) and self.pending[self.next] == 0:
            self._start_next()
            if any(self.pending):
                self.early_starts += 1
        handles = self.handles[:self.next] if ov is None else ov.handles()
        for h in handles:  # let MPI progress the earlier buckets
            if h is not None and hasattr(h, "test"):
                h.test()

    def _start_next(self) -> None:
        if self.overlap is None:
            self._start(self.next, self.flat)
        else:
            if self.next == 0:
                self.overlap.begin()
            self.overlap.start(self.next)
        self.next += 1

    # -- communication ------------------------------------------------------------------
    def _send_buffer(self, b: int, buf: np.ndarray) -> np.ndarray:
        lo, hi, _ = self.buckets[b]
        g = buf[lo:hi]
        if self.predivide != 1.0:
            g *= g.dtype.type(1.0 / self.predivide)
        if self._wire_bufs is None:
            return g
        return to_half(g, self._wire_bufs[b])  # NumPy's cast (compiled for float32)

    def _start(self, b: int, buf: np.ndarray, blocking: bool = False) -> None:
        lo, hi, _ = self.buckets[b]
        wire = self._send_buffer(b, buf)
        self.allreduce_calls += 1
        self.bytes_reduced += wire.nbytes
        self.bytes_dense += (hi - lo) * buf.itemsize
        if self.op == "adasum":
            if hasattr(self.comm, "adasum_"):
                self.comm.adasum_(wire, self.counts[b])
            else:
                adasum_(wire, self.counts[b], self.comm)
        elif blocking:  # inside synchronize()/reduce_(), which time themselves
            self._allreduce(b, wire)
        elif self.blocking_last and b == len(self.buckets) - 1:
            t0 = time.perf_counter()
            self._allreduce(b, wire)
            self.comm_wait_time += time.perf_counter() - t0
        else:
            self.handles[b] = (self.half.start(b) if self.half is not None
                               else self.comm.iallreduce_(wire, "sum"))
            return
        self._finish(b, buf)

    def _allreduce(self, b: int, wire: np.ndarray) -> None:
        """The blocking sum of bucket b's ``wire`` over ranks."""
        if self.half is not None:
            self.half.start(b).wait()
        else:
            self.comm.allreduce_(wire, "sum")

    def _finish(self, b: int, buf: np.ndarray) -> None:
        lo, hi, _ = self.buckets[b]
        g = buf[lo:hi]
        if self._wire_bufs is not None:
            from_half(self._wire_bufs[b], g)
        if self.op == "average" and self.comm.size > 1:
            if self.predivide != 1.0:
                g *= g.dtype.type(self.predivide / self.comm.size)
            else:
                g /= self.comm.size

    def synchronize(self) -> bool:
        """Complete every bucket and scale the buffer; False when there was nothing to do
        (one process, or already synchronized since the last ``reset``)."""
        if not self.active or self.synced:
            return False
        t0 = time.perf_counter()
        comp, ov, stall = self.compressor, self.overlap, self.stall
        if ov is not None and (self.next > 0 or not ov.in_warmup()):
            while self.next < len(self.buckets):  # buckets backward did not start
                self._start_next()
            calls, nbytes = ov.finish(stall)
            self._count(calls, nbytes)
            if stall is not None:
                stall.phase("optimizer step")
        elif comp is not None and not comp.dense_step():
            self._count(*comp.reduce_())
        elif self.non_blocking and self.op != "adasum" and comp is None:
            while self.next < len(self.buckets):  # buckets backward did not start
                self._start_next()
            for b, h in enumerate(self.handles):
                if h is not None:
                    if stall is not None:
                        stall.phase("allreduce bucket", b)
                    h.wait()
                    self._finish(b, self.flat)
            if stall is not None:
                stall.phase("optimizer step")
        else:
            for b in range(len(self.buckets)):
                self._start(b, self.flat, blocking=True)
        self.comm_wait_time += time.perf_counter() - t0
        self.reset()
        self.synced = True
        return True

    def _count(self, calls: int, nbytes: int) -> None:
        self.allreduce_calls += calls
        self.bytes_reduced += nbytes
        self.bytes_dense += self.flat.nbytes

    def reduce_(self, buf: np.ndarray) -> np.ndarray:
        """Reduce another buffer of the same layout (e.g. parameter deltas) now, bucket by
        bucket, with this reducer's op and compression; returns buf."""
        if self.active:
            t0 = time.perf_counter()
            for b in range(len(self.buckets)):
                self._start(b, buf, blocking=True)
            self.comm_wait_time += time.perf_counter() - t0
        return buf


class ReducerCounters:
    """An optimizer's counters, read through to the ``Reducer`` it holds as ``_reducer``
    (the numpy and the torch ``DistributedOptimizer``)."""

    allreduce_calls = property(lambda self: self._reducer.allreduce_calls)
    bytes_reduced = property(lambda self: self._reducer.bytes_reduced)
    bytes_dense = property(lambda self: self._reducer.bytes_dense)
    compressor = property(lambda self: self._reducer.compressor)
    comm_wait_time = property(lambda self: self._reducer.comm_wait_time)
