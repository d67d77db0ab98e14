"""The compressed exchanges of ``lossy.py`` bucket by bucket, overlapped with
backward: the network behind compute, as the dense buckets of ``reducer.py`` are.

When a bucket's gradients are complete (``Reducer.ready``, buckets strictly in order on
every rank), ``start(b)`` compresses its tensors and posts its exchange with
non-blocking calls; ``finish()`` (in ``Reducer.synchronize``) waits for them in the order
they were posted and completes the step:

- top-k / threshold: error feedback (accumulate, select, ``sent``, ``residual``) per
  tensor; the bucket's dense tensors in one ``iallreduce_``; its compressed tensors as an
  all-gather of (index, value) pairs over the bucket's span (over an ``MPIComm``: messages
  posted at once, ``oneround.py``; else ``iallgatherv``), or, past the crossover of
  ``sparse.py`` (decided per bucket), in the dense ``iallreduce_``. Threshold's pair
  counts differ by rank: the bucket posts an ``iallgatherv`` of its count, and its pairs
  go out when the next bucket starts (or in ``finish``), after that count has arrived.
- PowerSGD: P = M Q and the bucket's dense tensors in one ``iallreduce_``; in ``finish``,
  bucket by bucket: wait for its P, orthogonalize, Q_i = M^T P^, residual, post its Q
  ``iallreduce_`` (while the later buckets' P sums still travel); then wait for the Qs in
  order and reconstruct.

The arithmetic is the blocking path's (``CompressedReduction.reduce_``), element by
element: the same accumulation, selection and QR per tensor, the sparse pairs added in
rank order (``sparse.sum_pairs_``), MPI's sum of the same values, then the division by
the number of ranks for "average". So the result, the residuals and Q are the same, bit
for bit. What differs is the traffic: more, smaller messages (one exchange per bucket),
and the crossover decided per bucket. The warm-up (dense) steps, ``non_blocking=False`` and
communicators without ``iallgatherv`` keep the blocking path. Over a ``JoinableComm`` the
all-reduces go through it (a joined rank serves them with zeros); a step that may
all-gather pairs first checks, once, that no rank has joined (as the blocking path does).
"""
from __future__ import annotations

import numpy as np

from . import oneround, sparse
from .compressors import TopK
from .powersgd import LowRankStep, matrix_view


class _Part:
    """One bucket's share of a ``CompressedReduction``: its tensors and buffers."""

    def __init__(self, cr, lo: int, hi: int, index: list[int]):
        self.lo, self.hi = lo, hi
        self.comp = sorted((cr.comp[i] for i in index), key=lambda t: t[1])
        self.dense = [(a, b) for a, b in cr.dense if lo <= a and b <= hi]
        self.n_dense = sum(b - a for a, b in self.dense)
        self.n_comp = sum(b - a for _, a, b, _ in self.comp)
        # gradient + residual of the compressed tensors: the buffer and the residuals stay
        # as backward left them until ``finish`` (what a reader between the two sees)
        self.acc = np.zeros(self.n_comp, cr.flat.dtype)
        at, self.accs = 0, []
        for _, a, b, _ in self.comp:
            self.accs.append(self.acc[at:at + b - a])
            at += b - a
        self.selected: list[np.ndarray] = []  # top-k/threshold: each tensor's indices
        self.step = None
        if cr.lowrank is not None:
            order = sorted(index, key=lambda i: cr.comp[i][1])
            self.step = LowRankStep([cr.lowrank.dims[i] for i in order], cr.config.rank,
                                    [cr.qs[i] for i in order], cr.flat.dtype)
            self.buf = np.zeros(self.n_dense + self.step.p_buf.size, cr.flat.dtype)
        else:
            self.buf = np.zeros(self.n_dense + self.n_comp, cr.flat.dtype)
        self.handles: list = []  # (what, handle) in the order posted
        self.pairs = None  # (indices, values) until posted; then (payload, counts)


class BucketedCompression:
    """The overlapped exchange of a ``CompressedReduction`` over a Reducer's buckets.

    Args:
        cr: the ``CompressedReduction`` (its residuals, Q and counters are used as they are).
        parts: per bucket, its (start, stop) and the indices of its compressed tensors.

    Attributes:
        posted: collectives started in this step, in order: (bucket, what).
    """

    def __init__(self, cr, parts):
        self.cr, self.comm = cr, cr.comm
        self.parts = [_Part(cr, lo, hi, index) for lo, hi, index in parts]
        self.calls = self.nbytes = 0
        self.posted: list[tuple[int, str]] = []
        self._waiting: list[int] = []  # threshold buckets whose pairs are not posted yet
        self._gathers = any(self._may_gather(p) for p in self.parts)

    def _may_gather(self, part: _Part) -> bool:
        """Whether the bucket's pairs may be all-gathered (top-k: known from the shapes)."""
        cfg = self.cr.config
        if part.step is not None or not part.comp or cfg.exchange == "dense":
            return False
        if not isinstance(cfg, TopK) or cfg.exchange == "sparse":
            return True
        pairs = sum(min(hi - lo, max(1, int(cfg.ratio * (hi - lo))))
                    for _, lo, hi, _ in part.comp)
        return sparse.sparse_is_cheaper([pairs] * self.comm.size, part.hi - part.lo,
                                        self.cr.flat.itemsize)

    @classmethod
    def for_buckets(cls, cr, buckets) -> "BucketedCompression | None":
        """The overlapped exchange, or None when a tensor is not inside one bucket."""
        index: list[list[int]] = [[] for _ in buckets]
        for i, (_, lo, hi, _) in enumerate(cr.comp):
            b = next((b for b, (blo, bhi, _) in enumerate(buckets) if blo <= lo and hi <= bhi),
                     None)
            if b is None:
                return None
            index[b].append(i)
        inside = sum(1 for a, b in cr.dense for blo, bhi, _ in buckets if blo <= a and b <= bhi)
        if inside != len(cr.dense):
            return None
        return cls(cr, [(lo, hi, ix) for (lo, hi, _), ix in zip(buckets, index)])

    def in_warmup(self) -> bool:
        return self.cr.steps < self.cr.warmup_steps

    def handles(self) -> list:
        """The handles still outstanding (``Reducer.ready`` tests them: MPI progress)."""
        return [h for part in self.parts for _, h in part.handles]

    # -- posting ---------------------------------------------------------------------------
    def _post(self, b: int, what: str, handle, nbytes: int) -> None:
        self.parts[b].handles.append((what, handle))
        self.posted.append((b, what))
        self.calls += 1
        self.nbytes += nbytes

    def _allreduce(self, b: int, what: str, buf: np.ndarray) -> None:
        self._post(b, what, self.comm.iallreduce_(buf, "sum"), buf.nbytes)

    def begin(self) -> None:
        """The first bucket of a step is about to start: count the step (as ``reduce_``)."""
        cr = self.cr
        cr.steps += 1
        self.calls = self.nbytes = 0
        self.posted = []
        if self._gathers and hasattr(self.comm, "check_none_joined"):
            # a JoinableComm: its joined ranks serve all-reduces (with zeros), not the
            # all-gathers of pairs; as the blocking path, refuse those (collective, once)
            self.comm.check_none_joined(f"compression {cr.config.spec}")
        if self._gathers and oneround.mpi_comm_of(self.comm) is not None:
            oneround.exchange_comm(oneround.mpi_comm_of(self.comm))  # collective, the first time
        if cr.lowrank is not None and not cr.config.warm_start:
            for q, fresh in zip(cr.qs, cr._initial_qs(cr.lowrank.dims)):
                q[...] = fresh

    def start(self, b: int) -> None:
        """Compress bucket b (its gradients are complete) and post its exchange."""
        cr, part = self.cr, self.parts[b]
        flat = cr.flat
        for (_, lo, hi, _), acc in zip(part.comp, part.accs):
            if cr.error_feedback:
                np.add(flat[lo:hi], cr.residual[lo:hi], out=acc)
            else:
                acc[...] = flat[lo:hi]
        at = 0
        for lo, hi in part.dense:
            part.buf[at:at + hi - lo] = flat[lo:hi]
            cr.sent[lo:hi] = flat[lo:hi]
            at += hi - lo
        if part.step is not None:
            mats = [matrix_view(acc, t[3]) for t, acc in zip(part.comp, part.accs)]
            part.step.project(mats, part.step.ps(part.buf[part.n_dense:]))
            if part.buf.size:
                self._allreduce(b, "P", part.buf)
            return
        self._select(part)
        self._post_pending()  # the pairs of the bucket before, its counts known by now
        cfg = cr.config
        indices, values = part.pairs
        if not part.comp or cfg.exchange == "dense":
            self._post_dense(b, "all")
        elif isinstance(cfg, TopK):  # every rank sends the same, known count
            self._post_pairs(b, [indices.size] * self.comm.size)
        else:
            if part.n_dense:
                self._allreduce(b, "dense", part.buf[:part.n_dense])
            mine = np.array([indices.size], dtype=np.int64)
            self._post(b, "counts", self.comm.iallgatherv(mine, [1] * self.comm.size),
                       mine.nbytes)
            self._waiting.append(b)

    def _select(self, part: _Part) -> None:
        cr = self.cr
        flat, idx_parts, val_parts = cr.flat, [], []
        part.selected = []
        for (_, lo, hi, _), acc in zip(part.comp, part.accs):
            idx = cr.config.select(acc)
            vals = acc[idx]
            sent = cr.sent[lo:hi]
            sent[...] = 0
            sent[idx] = vals
            part.selected.append(idx)
            idx_parts.append(idx + (lo - part.lo))
            val_parts.append(vals)
        part.pairs = (np.concatenate(idx_parts) if idx_parts else np.zeros(0, np.int64),
                      np.concatenate(val_parts) if val_parts else np.zeros(0, flat.dtype))

    def _post_dense(self, b: int, what: str) -> None:
        """What the bucket's compressed tensors sent, summed dense: with its dense tensors
        in one sum ("all"), or alone ("comp": threshold, whose dense ones went first)."""
        part, cr = self.parts[b], self.cr
        at = part.n_dense
        for _, lo, hi, _ in part.comp:
            part.buf[at:at + hi - lo] = cr.sent[lo:hi]
            at += hi - lo
        part.pairs = None
        buf = part.buf if what == "all" else part.buf[part.n_dense:]
        if buf.size:
            self._allreduce(b, what, buf)

    def _post_pairs(self, b: int, counts) -> None:
        part, cr = self.parts[b], self.cr
        cfg, n = cr.config, part.hi - part.lo
        counts = [int(k) for k in counts]
        if cfg.exchange == "auto" and not sparse.sparse_is_cheaper(counts, n, cr.flat.itemsize):
            self._post_dense(b, "all" if isinstance(cfg, TopK) else "comp")
            return
        if part.n_dense and isinstance(cfg, TopK):
            self._allreduce(b, "dense", part.buf[:part.n_dense])
        indices, values = part.pairs
        payload, sizes = sparse.pairs_payload(indices, values, n, cr.flat.itemsize, counts)
        part.pairs = (payload, counts)  # MPI reads the payload until the wait
        self._post(b, "pairs", self._gather(payload, sizes), payload.nbytes)

    def _gather(self, payload: np.ndarray, sizes) -> object:
        """The all-gather of the pairs: over an ``MPIComm``, messages posted at once
        (``oneround.py``: one round, where MPICH's ``Iallgatherv`` takes several)."""
        mpi = oneround.mpi_comm_of(self.comm)
        if mpi is None:
            return self.comm.iallgatherv(payload, sizes)
        out = np.empty(sum(sizes), np.uint8)
        request = oneround.post_allgatherv(mpi.MPI, oneround.exchange_comm(mpi), payload, out,
                                         sizes, oneround.TAG_PAIRS)
        return mpi._collective(request, out)

    def _post_pending(self) -> None:
        """Post the pairs of the threshold buckets waiting for their counts (in order)."""
        for b in self._waiting:
            handles = self.parts[b].handles
            counts = handles.pop()[1].wait()  # the last posted: its counts
            self._post_pairs(b, counts)
        self._waiting = []

    # -- completing --------------------------------------------------------------------------
    def finish(self, stall=None) -> tuple[int, int]:
        """Wait for every bucket's exchange (in the order posted) and complete the step;
        returns (collectives started, bytes this rank handed to them)."""
        cr = self.cr
        self._post_pending()
        if cr.lowrank is not None:
            self._finish_powersgd(stall)
        else:
            for b, part in enumerate(self.parts):
                for what, h in part.handles:
                    if stall is not None:
                        stall.phase("allreduce bucket", b)
                    got = h.wait()
                    if what == "pairs":
                        self._unpack_pairs(part, got)
                    else:
                        self._unpack(part, what)
                part.handles = []
                if cr.error_feedback:  # what was not sent
                    for (_, lo, hi, _), acc, idx in zip(part.comp, part.accs, part.selected):
                        res = cr.residual[lo:hi]
                        res[...] = acc
                        res[idx] = 0
        if cr.op == "average":
            cr.flat /= self.comm.size
        return self.calls, self.nbytes

    def _unpack(self, part: _Part, what: str) -> None:
        """The sums of ``part.buf`` back into the buffer: its dense tensors (all but
        "comp"), its compressed ones ("all", "comp")."""
        flat, src, at = self.cr.flat, part.buf, 0
        for lo, hi in part.dense:
            if what != "comp":
                flat[lo:hi] = src[at:at + hi - lo]
            at += hi - lo
        if what in ("all", "comp"):
            for _, lo, hi, _ in part.comp:
                flat[lo:hi] = src[at:at + hi - lo]
                at += hi - lo

    def _unpack_pairs(self, part: _Part, gathered: np.ndarray) -> None:
        _, counts = part.pairs
        whole = np.zeros(part.hi - part.lo, self.cr.flat.dtype)
        sparse.sum_pairs_(whole, gathered, counts)
        for _, lo, hi, _ in part.comp:
            self.cr.flat[lo:hi] = whole[lo - part.lo:hi - part.lo]
        part.pairs = None

    def _finish_powersgd(self, stall) -> None:
        cr = self.cr
        flat = cr.flat
        bases = []
        for b, part in enumerate(self.parts):
            if stall is not None:
                stall.phase("allreduce bucket", b)
            for _, h in part.handles:
                h.wait()
            part.handles = []
            self._unpack(part, "P")
            mats = [matrix_view(acc, t[3]) for t, acc in zip(part.comp, part.accs)]
            sent = [matrix_view(cr.sent[lo:hi], s) for _, lo, hi, s in part.comp]
            bases.append(part.step.back_project(mats, part.step.ps(part.buf[part.n_dense:]),
                                                sent))
            if cr.error_feedback:
                for (_, lo, hi, _), acc in zip(part.comp, part.accs):
                    np.subtract(acc, cr.sent[lo:hi], out=cr.residual[lo:hi])
            if part.step.q_buf.size:
                self._allreduce(b, "Q", part.step.q_buf)
        for b, (part, basis) in enumerate(zip(self.parts, bases)):
            if stall is not None:
                stall.phase("allreduce bucket", b)
            for _, h in part.handles:
                h.wait()
            part.handles = []
            part.step.reconstruct(basis, [matrix_view(flat[lo:hi], s)
                                          for _, lo, hi, s in part.comp])
