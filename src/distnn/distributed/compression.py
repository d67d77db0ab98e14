"""Gradient compression that sends less than the gradients: top-k and threshold
sparsification (``sparse.py``) and PowerSGD (``powersgd.py``), with error feedback, behind
the one ``Reducer``. (``none`` and ``fp16`` only change the wire dtype: ``reducer.py``.)

Specs, as ``--gradient_compression`` and ``compression=`` of both DistributedOptimizers:
``none``, ``fp16``, ``topk:RATIO`` (the RATIO largest-magnitude share of each tensor),
``threshold:VALUE`` (entries with ``|g| >= VALUE``), ``powersgd:RANK``; or the objects
``TopK(ratio)``, ``Threshold(value)``, ``PowerSGD(rank)`` (``Compression.topk`` ... alike).

One step (``CompressedReduction.reduce_``), in ``synchronize()`` after backward:

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

import math
from typing import Any

import numpy as np

from . import sparse
from .powersgd import LowRankStep, matrix_dims, matrix_view, worth_compressing

SPECS = "none, fp16, topk:RATIO, threshold:VALUE or powersgd:RANK"


class _Stateful:
    """Horovod's per-tensor ``compress``/``decompress`` do not apply: these compressions
    keep residuals across steps and exchange whole buffers (DistributedOptimizer only)."""

    @classmethod
    def compress(cls, *args, **kwargs):
        raise ValueError(f"Compression.{cls.__name__.lower()} works inside "
                         "DistributedOptimizer (it keeps residuals between steps); pass "
                         "Compression.fp16 or Compression.none to allreduce and friends")

    decompress = compress


class TopK(_Stateful):
    """Send the ``ratio`` share of each tensor's entries largest in magnitude.

    Args:
        ratio: in (0, 1]; k = max(1, floor(ratio * size)) per tensor.
        min_size: tensors with fewer elements travel dense.
        exchange: "auto" (sparse while cheaper, see ``sparse.py``), "sparse" or "dense".
    """

    def __init__(self, ratio: float, *, min_size: int = 1024, exchange: str = "auto"):
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) \
                or not 0 < ratio <= 1:
            raise ValueError(f"compression topk: RATIO must be a number in (0, 1], got "
                             f"{ratio!r}; e.g. topk:0.01 sends 1% of each tensor")
        _check_exchange(exchange)
        self.ratio, self.min_size, self.exchange = float(ratio), int(min_size), exchange

    spec = property(lambda self: f"topk:{self.ratio:g}")

    def compresses(self, shape) -> bool:
        return len(shape) >= 2 and int(np.prod(shape)) >= self.min_size

    def select(self, acc: np.ndarray) -> np.ndarray:
        return sparse.topk_indices(acc, max(1, int(self.ratio * acc.size)))

    def __repr__(self):
        return f"TopK({self.ratio:g})"


class Threshold(_Stateful):
    """Send the entries with ``|g| >= value`` (each rank its own count).

    Args:
        value: > 0.
        min_size, exchange: as ``TopK``.
    """

    def __init__(self, value: float, *, min_size: int = 1024, exchange: str = "auto"):
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not (value > 0 and math.isfinite(value)):
            raise ValueError(f"compression threshold: VALUE must be a number > 0, got "
                             f"{value!r}; e.g. threshold:0.001")
        _check_exchange(exchange)
        self.value, self.min_size, self.exchange = float(value), int(min_size), exchange

    spec = property(lambda self: f"threshold:{self.value:g}")
    compresses = TopK.compresses

    def select(self, acc: np.ndarray) -> np.ndarray:
        return sparse.threshold_indices(acc, self.value)

    def __repr__(self):
        return f"Threshold({self.value:g})"


class PowerSGD(_Stateful):
    """Rank-``rank`` PowerSGD (see ``powersgd.py``).

    Args:
        rank: r >= 1 (clipped to the smaller side of each matrix).
        min_compression_rate: a matrix is compressed when its factors are this many times
            smaller than it (PyTorch's default 2; 0 compresses every matrix).
        warm_start: keep Q between steps (PyTorch's default); False draws a new one.
        seed: seed of the Q matrices' generator (the same on every rank).
    """

    def __init__(self, rank: int, *, min_compression_rate: float = 2.0,
                 warm_start: bool = True, seed: int = 0):
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
            raise ValueError(f"compression powersgd: RANK must be an integer >= 1, got "
                             f"{rank!r}; e.g. powersgd:2")
        self.rank, self.min_compression_rate = rank, float(min_compression_rate)
        self.warm_start, self.seed = bool(warm_start), int(seed)

    spec = property(lambda self: f"powersgd:{self.rank}")

    def compresses(self, shape) -> bool:
        return worth_compressing(tuple(shape), self.rank, self.min_compression_rate)

    def __repr__(self):
        return f"PowerSGD({self.rank})"


def _check_exchange(exchange: str) -> None:
    if exchange not in ("auto", "sparse", "dense"):
        raise ValueError(f"exchange must be 'auto', 'sparse' or 'dense', got {exchange!r}")


_PARSERS = {"topk": (float, TopK), "threshold": (float, Threshold), "powersgd": (int, PowerSGD)}


def parse_compression(spec: Any):
    """A compression spec as given: "none"/"fp16" and the dense-wire objects pass through
    (strings lower-cased); "topk:R", "threshold:V", "powersgd:R" become objects."""
    if spec is None or isinstance(spec, (TopK, Threshold, PowerSGD)):
        return spec
    if not isinstance(spec, str):
        return spec
    text = spec.strip().lower()
    if text in ("none", "fp16"):
        return text
    name, sep, arg = text.partition(":")
    if name in _PARSERS:
        convert, cls = _PARSERS[name]
        if not sep or not arg:
            raise ValueError(f"compression {spec!r}: {name} needs a value, e.g. "
                             f"{cls(1).spec if name == 'powersgd' else name + ':0.01'}")
        try:
            value = convert(arg)
        except ValueError:
            raise ValueError(f"compression {spec!r}: {arg!r} is not a "
                             f"{'whole number' if convert is int else 'number'}; use "
                             f"{SPECS}") from None
        return cls(value)
    raise ValueError(f"compression {spec!r} is unknown; use {SPECS}")


def is_compressing(compression) -> bool:
    """Whether ``compression`` sends less than the gradients (needs a CompressedReduction)."""
    return isinstance(parse_compression(compression), (TopK, Threshold, PowerSGD))


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
