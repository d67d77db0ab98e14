"""Gradient compression that sends less than the gradients: top-k and threshold
sparsification (``sparse.py``) and PowerSGD (``powersgd.py``), with error feedback, behind
the one ``Reducer``. (``none`` and ``fp16`` only change the wire dtype: ``reducer.py``.)

Specs are parsed once, into the objects of ``compressors.py`` (``Compression.parse``;
re-exported here): ``topk:RATIO`` (the RATIO largest-magnitude share of each tensor),
``threshold:VALUE`` (entries with ``|g| >= VALUE``), ``powersgd:RANK``, or the objects
``Compression.topk(ratio)``, ``.threshold(value)``, ``.powersgd(rank)``.

One step (``CompressedReduction.reduce_``, the whole buffer at once in ``synchronize()``
after backward; with a non-blocking Reducer the same arithmetic runs bucket by bucket,
overlapped with backward: ``compressed_buckets.py``):

1. the first ``warmup_steps`` steps are dense all-reduces (PowerSGD's ``start_powerSGD_iter``);
2. with error feedback (the default) each compressed tensor's accumulated gradient is its
   gradient plus its residual; the residual becomes what was not sent, so
   ``sent + residual == accumulated`` on every rank after every step;
3. one-dimensional tensors (biases, batch-norm) and tensors too small to gain (fewer than
   ``min_size`` elements for top-k/threshold; PowerSGD: factors not ``min_compression_rate``
   times smaller, PyTorch's rule) travel dense, packed into one all-reduce;
4. the compressed tensors are exchanged sparse (or dense past the crossover) or as
   PowerSGD factors; the result is the sum over ranks (divided by the size for "average").

A process alone (size 1) sends nothing and compresses nothing.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from . import sparse
from .compressors import (SPECS, Compression, PowerSGD, Threshold, TopK,  # noqa: F401
                          is_compressing, parse_compression)
from .powersgd import LowRankStep, matrix_dims, matrix_view


class CompressedReduction:
    """State and step of a compressing exchange of one flat gradient buffer.

    Args:
        config: a ``TopK``, ``Threshold`` or ``PowerSGD``.
        flat: the gradient buffer; tensors: [(name, start, stop, shape)] covering it.
        comm: communicator; op: "average" or "sum".
        error_feedback: keep residuals (default True); warmup_steps: dense steps first.

    Attributes:
        residual: per element, what this rank has not sent yet (0 on dense tensors).
        sent: this rank's contribution in the last step (dense layout).
        steps: exchanges done (warm-up included).
        compressed: names of the tensors that are compressed.
    """

    def __init__(self, config, flat: np.ndarray, tensors, comm, *, op: str = "average",
                 error_feedback: bool = True, warmup_steps: int = 0):
        if isinstance(warmup_steps, bool) or int(warmup_steps) != warmup_steps \
                or warmup_steps < 0:
            raise ValueError(f"compression_warmup_steps must be an integer >= 0, got "
                             f"{warmup_steps!r}")
        self.config, self.flat, self.comm, self.op = config, flat, comm, op
        self.error_feedback, self.warmup_steps = bool(error_feedback), int(warmup_steps)
        self.steps = 0
        self.residual = np.zeros_like(flat)
        self.sent = np.zeros_like(flat)
        self.comp = [(n, lo, hi, tuple(s)) for n, lo, hi, s in tensors
                     if config.compresses(tuple(s))]
        self.dense = [(lo, hi) for n, lo, hi, s in tensors if not config.compresses(tuple(s))]
        self.compressed = [n for n, _, _, _ in self.comp]
        self.n_dense = sum(hi - lo for lo, hi in self.dense)
        self.n_comp = sum(hi - lo for _, lo, hi, _ in self.comp)
        self.lowrank = None
        if isinstance(config, PowerSGD):
            dims = [matrix_dims(s) for _, _, _, s in self.comp]
            self.qs = self._initial_qs(dims)
            self.lowrank = LowRankStep(dims, config.rank, self.qs, flat.dtype)
            self.dense_buf = np.zeros(self.n_dense + self.lowrank.p_buf.size, flat.dtype)
        else:
            self.dense_buf = np.zeros(self.n_dense + self.n_comp, flat.dtype)

    def _initial_qs(self, dims) -> list[np.ndarray]:
        rng = np.random.default_rng([self.config.seed, self.steps])
        r = self.config.rank
        return [rng.standard_normal((m, min(r, n))).astype(self.flat.dtype) for n, m in dims]

    def dense_step(self) -> bool:
        """Whether this step is a plain dense all-reduce (warm-up); counts it."""
        if self.steps < self.warmup_steps:
            self.steps += 1
            return True
        return False

    # -- packing of the dense tensors --------------------------------------------------------
    def _pack_dense(self, out: np.ndarray) -> None:
        at = 0
        for lo, hi in self.dense:
            out[at:at + hi - lo] = self.flat[lo:hi]
            self.sent[lo:hi] = self.flat[lo:hi]
            at += hi - lo

    def _unpack_dense(self, src: np.ndarray) -> None:
        at = 0
        for lo, hi in self.dense:
            self.flat[lo:hi] = src[at:at + hi - lo]
            at += hi - lo

    def _accumulate(self) -> None:
        if self.error_feedback:
            for _, lo, hi, _ in self.comp:
                self.flat[lo:hi] += self.residual[lo:hi]

    # -- the step ------------------------------------------------------------------------------
    def reduce_(self) -> tuple[int, int]:
        """Exchange the flat buffer (sum over ranks, or average); returns (collectives
        started, bytes this rank handed to them)."""
        self._accumulate()
        self.steps += 1
        if self.lowrank is not None:
            calls, nbytes = self._powersgd()
        else:
            calls, nbytes = self._sparse()
        if self.op == "average":
            self.flat /= self.comm.size
        return calls, nbytes

    def _sparse(self) -> tuple[int, int]:
        flat, cfg = self.flat, self.config
        idx_parts, val_parts = [], []
        for _, lo, hi, _ in self.comp:
            acc = flat[lo:hi]
            idx = cfg.select(acc)
            vals = acc[idx]
            sent = self.sent[lo:hi]
            sent[...] = 0
            sent[idx] = vals
            if self.error_feedback:
                res = self.residual[lo:hi]
                res[...] = acc
                res[idx] = 0
            idx_parts.append(idx + lo)
            val_parts.append(vals)
        indices = np.concatenate(idx_parts) if idx_parts else np.zeros(0, np.int64)
        values = np.concatenate(val_parts) if val_parts else np.zeros(0, flat.dtype)
        calls = nbytes = 0
        counts = None
        if isinstance(cfg, TopK):
            counts = [indices.size] * self.comm.size  # known on every rank
        elif self.comp and cfg.exchange != "dense":
            if hasattr(self.comm, "check_none_joined"):  # a joined rank cannot all-gather
                self.comm.check_none_joined(f"compression {cfg.spec}")
            mine = np.array([indices.size], dtype=np.int64)
            counts = self.comm.allgather(mine)[:, 0]
            calls, nbytes = 1, mine.nbytes
        use_sparse = bool(self.comp) and (
            cfg.exchange == "sparse" or (cfg.exchange == "auto" and sparse.sparse_is_cheaper(
                counts, flat.size, flat.itemsize)))
        self._pack_dense(self.dense_buf)
        if use_sparse:
            if counts is not None and isinstance(cfg, TopK) and hasattr(
                    self.comm, "check_none_joined"):
                self.comm.check_none_joined(f"compression {cfg.spec}")
            if self.n_dense:
                self.comm.allreduce_(self.dense_buf[:self.n_dense], "sum")
                calls, nbytes = calls + 1, nbytes + self.n_dense * flat.itemsize
                self._unpack_dense(self.dense_buf)
            whole = np.zeros_like(flat)
            _, sent = sparse.sparse_allreduce_(whole, indices, values, self.comm, counts)
            for _, lo, hi, _ in self.comp:
                flat[lo:hi] = whole[lo:hi]
            return calls + 1, nbytes + sent
        at = self.n_dense
        for _, lo, hi, _ in self.comp:
            self.dense_buf[at:at + hi - lo] = self.sent[lo:hi]
            at += hi - lo
        self.comm.allreduce_(self.dense_buf, "sum")
        self._unpack_dense(self.dense_buf)
        at = self.n_dense
        for _, lo, hi, _ in self.comp:
            flat[lo:hi] = self.dense_buf[at:at + hi - lo]
            at += hi - lo
        return calls + 1, nbytes + self.dense_buf.nbytes

    def _powersgd(self) -> tuple[int, int]:
        flat, step = self.flat, self.lowrank
        if not self.config.warm_start:
            for q, fresh in zip(self.qs, self._initial_qs(step.dims)):
                q[...] = fresh
        mats = [matrix_view(flat[lo:hi], s) for _, lo, hi, s in self.comp]
        buf = self.dense_buf
        self._pack_dense(buf)
        p_parts = step.ps(buf[self.n_dense:])
        step.project(mats, p_parts)
        self.comm.allreduce_(buf, "sum")
        self._unpack_dense(buf)
        sent = [matrix_view(self.sent[lo:hi], s) for _, lo, hi, s in self.comp]
        bases = step.back_project(mats, p_parts, sent)
        if self.error_feedback:
            for _, lo, hi, _ in self.comp:
                np.subtract(flat[lo:hi], self.sent[lo:hi], out=self.residual[lo:hi])
        self.comm.allreduce_(step.q_buf, "sum")
        step.reconstruct(bases, mats)
        return 2, buf.nbytes + step.q_buf.nbytes

    # -- checkpoints ---------------------------------------------------------------------------
    def state_dict(self, residuals: list[np.ndarray] | None = None) -> dict[str, Any]:
        """The state a checkpoint keeps: the spec, the step count, the Q matrices (the same
        on every rank) and ``residuals`` (every rank's, gathered by the caller)."""
        out: dict[str, Any] = {"spec": self.config.spec, "steps": self.steps}
        if self.lowrank is not None:
            out["q"] = [q.copy() for q in self.qs]
        if self.error_feedback and residuals is not None:
            out["residuals"] = list(residuals)
        return out

    def load_state_dict(self, state: dict[str, Any]) -> str | None:
        """Restore a ``state_dict``; returns a one-line note when the state could not be
        taken as it is (another spec: dropped; another number of ranks: the residuals
        are summed and split so the unsent gradient is kept), else None."""
        if state.get("spec") != self.config.spec:
            return (f"gradient compression state of {state.get('spec')} dropped (this run "
                    f"uses {self.config.spec})")
        self.steps = int(state.get("steps", 0))
        for q, stored in zip(self.qs if self.lowrank is not None else [],
                             state.get("q", [])):
            q[...] = stored
        residuals = state.get("residuals")
        if not self.error_feedback or not residuals:
            self.residual[...] = 0
            return None
        n, size = len(residuals), self.comm.size
        if n == size:
            self.residual[...] = residuals[self.comm.rank]
            return None
        total = np.sum(residuals, axis=0)
        # "sum": the update is the sum of what ranks send; "average": it is divided by size
        self.residual[...] = total / (size if self.op == "sum" else n)
        return (f"gradient compression residuals of {n} ranks summed and split evenly over "
                f"{size} ranks (the unsent gradient is kept, not where it was)")
