"""Sharded training state (ZeRO stages 1-3) over the model's flat buffers.

Rank r of N owns the contiguous slice ``bounds[r]`` of the flat parameter buffer (the
``np.array_split`` cut: uneven when N does not divide the size) and keeps the optimizer
state of that slice only; every optimizer of ``distnn.optim`` is elementwise over the flat
buffer, so updating slice by slice makes the numbers of the dense update.

* stage 1: the gradients are all-reduced as under ``DistributedOptimizer`` (buckets
  overlapped with backward, compression as there); each rank updates its slice; the
  parameters are all-gathered in place (``Allgatherv``).
* stage 2: the gradients are reduce-scattered layer by layer during backward
  (``sharded_units.UnitExchange``): a rank holds the summed gradient of its slice only, and
  the full gradient buffer is never allocated; the parameters are all-gathered after the
  update.
* stage 3: the parameters are sharded too: each layer's are all-gathered just before its
  forward and again before its backward, one layer ahead, and dropped after use.

Per rank, with Psi parameters and Adam's two moments, the state is 16 Psi bytes dense
(float32), 8 Psi + 8 Psi / N at stage 1, 4 Psi + 12 Psi / N at stage 2 and 16 Psi / N at
stage 3 (``state_bytes`` counts what this rank holds).
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator

import numpy as np

from .comm import Communicator, get_comm
from .optimizer import DistributedOptimizer, WrapsOptimizer, check_same_layout
from .compressors import Compression
from .sharded_units import UnitExchange, shard_bounds

STAGES = (1, 2, 3)


def _stage(stage: Any) -> int:
    if isinstance(stage, bool) or stage not in STAGES:
        raise ValueError(f"ShardedOptimizer: stage must be 1, 2 or 3 (ZeRO's stages: optimizer "
                         f"state; + gradients; + parameters), got {stage!r}")
    return int(stage)


def check_shardable(total: int, size: int, who: str = "ShardedOptimizer") -> None:
    """Raise (alike on every rank) when ``size`` ranks cannot each own a slice of ``total``
    parameters."""
    if total < size:
        raise ValueError(f"{who}: the model has {total} parameters, fewer than the {size} "
                         f"ranks, so some rank would own no slice of them; run on at most "
                         f"{total} ranks or without sharding")


def _decay_ranges(optimizer, inner, model, defaults: dict, lo: int, hi: int) -> None:
    """An optimizer with parameter groups of weight decay (AdamW: ``_ranges`` of the flat
    buffer) decays, on this rank's slice, the part of those ranges inside it."""
    if not hasattr(inner, "_ranges"):
        return
    if isinstance(optimizer, (str, type)):
        from ..optim import groups
        rule = defaults.get("decay", "auto")
        ranges = groups.decay_ranges(model, groups.decays if rule == "auto" else rule)
    else:
        ranges = optimizer._ranges
    if ranges is not None:
        inner._ranges = [(max(a, lo) - lo, min(b, hi) - lo) for a, b in ranges
                         if min(b, hi) > max(a, lo)]


def _sliced_optimizer(optimizer, defaults: dict, pair, lo: int, hi: int):
    """A new optimizer over ``pair`` (this rank's slice): of ``optimizer``'s class and
    settings, its step count and (once it stepped) its state sliced; or, for a class or
    a registry name, that optimizer built with ``defaults``."""
    from ..optim import OPTIMIZERS, Optimizer
    if isinstance(optimizer, str) or isinstance(optimizer, type):
        cls = OPTIMIZERS.get(optimizer.lower()) if isinstance(optimizer, str) else optimizer
        if cls is None or not issubclass(cls, Optimizer):
            raise ValueError(f"ShardedOptimizer: optimizer {optimizer!r} is not a distnn "
                             f"optimizer; use one of {', '.join(sorted(OPTIMIZERS))}")
        return cls([pair], **{k: v for k, v in defaults.items() if k != "clip_grad_norm"})
    cls = type(optimizer)
    try:
        inner = cls([pair], lr=optimizer.scheduled_lr, **optimizer.hyperparameters())
    except (TypeError, AttributeError) as exc:
        raise TypeError(f"ShardedOptimizer takes a distnn.optim optimizer (SGD, Adam, AdamW, "
                        f"RMSprop, Nadam, Adadelta) over the model, got {cls.__name__}: "
                        f"{exc}") from None
    inner.lr_scale = optimizer.lr_scale
    inner.iterations = optimizer.iterations
    if optimizer.iterations:  # a fresh optimizer's state is zeros: nothing to carry over
        for key, arr in optimizer.state[0].items():
            inner.state[0][key][...] = arr.reshape(-1)[lo:hi]
    return inner


class ShardedOptimizer(WrapsOptimizer):
    """Shard an optimizer's state (stage 1), the gradients (2) and the parameters (3) of a
    built ``Sequential`` over the ranks (ZeRO; see the module doc).

    The given optimizer is a template: a new one of its class and hyper-parameters updates
    this rank's slice (``optimizer`` attribute); the template is not kept (its state
    arrays are freed with it). Pass an optimizer class or name and its ``defaults``
    instead (as torch's ``ZeroRedundancyOptimizer(params, optimizer_class, **defaults)``)
    and no whole-model state is ever allocated. Gradients are combined as
    ``DistributedOptimizer`` combines them: summed over the ranks (``op="sum"``, the
    trainer's, whose loss divides by the global batch) or averaged (``op="average"``).
    Stage 3 takes the model's parameters at ``shard()`` (which
    frees the full buffers) and gives them back at ``unshard()``; between the two the
    layers see their parameters only inside their forward and backward.

    Args:
        optimizer: a ``distnn.optim`` optimizer built over ``model``, or an optimizer
            class or registry name ("adam") built with ``defaults``.
        model: the built ``Sequential`` (the same on every rank).
        stage: 1, 2 or 3.
        comm: communicator (default: ``get_comm()``).
        op: "sum" or "average".
        bucket_size_mb: stage 1: the all-reduce's buckets (as ``DistributedOptimizer``);
            stages 2 and 3: the least size of the runs of consecutive layers exchanged by
            one reduce-scatter (and at stage 3 one all-gather): 0, layer by layer.
        non_blocking, compression, error_feedback, compression_warmup_steps, stall: stage
            1's gradient all-reduce (as ``DistributedOptimizer``). Stages 2 and 3 exchange
            unit by unit, overlapped with backward, and take no compression.
        defaults: the hyper-parameters (lr among them) of an optimizer given by class or name.

    Shape:
        ``bounds[r]`` = [lo, hi) of rank r's slice of the flat buffers of ``total``
        elements.

    Example:
        opt = ShardedOptimizer(Adam(model, lr=1e-3), model, stage=2, op="average")
        opt.shard(); model.backward(model_dy); opt.step(); ...; opt.unshard()
    """

    def __init__(self, optimizer, model, *, stage: int = 1, comm: Communicator | None = None,
                 op: str = "average", bucket_size_mb: float = 4.0, non_blocking: bool = True,
                 compression=None, error_feedback: bool = True,
                 compression_warmup_steps: int = 0, stall=None,
                 defaults: dict | None = None):
        self.stage = _stage(stage)
        if op not in ("sum", "average"):
            raise ValueError(f"ShardedOptimizer: op must be 'sum' or 'average', got {op!r}")
        by_name = isinstance(optimizer, (str, type))
        if not hasattr(model, "layer_ranges") or not (by_name
                                                      or hasattr(optimizer, "hyperparameters")):
            raise TypeError(f"ShardedOptimizer(optimizer, model) takes a distnn.optim optimizer "
                            f"and a built distnn Sequential, got {type(optimizer).__name__} and "
                            f"{type(model).__name__}")
        spec = Compression.parse(compression)
        if spec is not Compression.none and self.stage > 1:
            raise ValueError(f"ShardedOptimizer: compression {getattr(spec, 'spec', spec)!r} "
                             f"applies to stage 1's gradient all-reduce, not to stage "
                             f"{self.stage}'s reduce-scatter; use stage 1 or no compression")
        self.comm = comm if comm is not None else get_comm()
        self.model, self.op = model, op
        params, grads = model.parameters_flat(), model.gradients_flat()
        sliced = getattr(model, "param_slice", None)  # built by build_sliced: no whole buffer
        if sliced is not None and (self.stage != 3 or sliced.size != self.comm.size):
            raise ValueError(f"ShardedOptimizer: the model was built sliced over "
                             f"{sliced.size} ranks (build_sliced), which only stage 3 on "
                             f"those {sliced.size} ranks trains; got stage {self.stage} on "
                             f"{self.comm.size} ranks: build it whole, or use stage 3 there")
        self.total = int(params.size) if sliced is None else sliced.total
        self.dtype = params.dtype
        check_shardable(self.total, self.comm.size)
        self.bounds = shard_bounds(self.total, self.comm.size)
        self.counts = [hi - lo for lo, hi in self.bounds]
        self.lo, self.hi = self.bounds[self.comm.rank]
        defaults = dict(defaults or {})
        self.sharded = False
        self._dist = self._units = None
        self.param_shard = self.grad_shard = None
        if self.stage == 1:
            pair = (params[self.lo:self.hi], grads[self.lo:self.hi])
            self.optimizer = _sliced_optimizer(optimizer, defaults, pair, self.lo, self.hi)
            self._own(optimizer, defaults)
            self._dist = DistributedOptimizer(
                self.optimizer, model, comm=self.comm, op=op, bucket_size_mb=bucket_size_mb,
                non_blocking=non_blocking, compression=compression,
                error_feedback=error_feedback,
                compression_warmup_steps=compression_warmup_steps, stall=stall)
            return
        check_same_layout(model, self.comm, "ShardedOptimizer")
        n = self.hi - self.lo
        self.grad_shard = np.zeros(n, dtype=self.dtype)
        self.param_shard = (None if self.stage < 3 else params[self.lo:self.hi].copy()
                            if sliced is None else sliced.values)
        p = self.param_shard if self.stage == 3 else params[self.lo:self.hi]
        self.optimizer = _sliced_optimizer(optimizer, defaults, (p, self.grad_shard),
                                           self.lo, self.hi)
        self._own(optimizer, defaults)
        self._units = UnitExchange(model, self.comm, self.bounds, self.grad_shard,
                                   self.param_shard, self.stage, bucket_size_mb)
        if sliced is not None:  # its parameters are in the shard already: sharded from here
            self.shard()

    def _own(self, optimizer, defaults: dict) -> None:
        """The settings of the whole model that the slice's optimizer must not apply on
        its own: weight-decay groups (re-cut to the slice) and the gradient clipping (by
        the norm over every rank's slice: ``step``)."""
        _decay_ranges(optimizer, self.optimizer, self.model, defaults, self.lo, self.hi)
        clip = (defaults.get("clip_grad_norm") if isinstance(optimizer, (str, type))
                else getattr(optimizer, "clip_grad_norm", None))
        self.clip_grad_norm = clip
        self.grad_norm: float | None = None

    @property
    def clip_grad_norm(self) -> float | None:
        """Clip the summed gradients to this global L2 norm before each update (None: no
        clipping); the norm is over every rank's slice (one 8-byte all-reduce)."""
        return self._clip

    @clip_grad_norm.setter
    def clip_grad_norm(self, value: float | None) -> None:
        self.optimizer.clip_grad_norm = value  # validated there, then not used there
        self._clip, self.optimizer.clip_grad_norm = self.optimizer.clip_grad_norm, None

    def _clip_(self) -> None:
        g = self.optimizer.param_pairs()[0][1]
        total = np.array([float(np.einsum("i,i->", g, g, dtype=np.float64))])
        self.comm.allreduce_(total, "sum")
        norm = float(np.sqrt(total[0]))
        factor = self._clip / (norm + 1e-6)  # torch's clip_grad_norm_, as optim.groups
        if factor < 1.0 and np.isfinite(norm):
            np.multiply(g, g.dtype.type(factor), out=g)
        self.grad_norm = norm

    # -- sharding the model's buffers ---------------------------------------------------
    def shard(self) -> None:
        """Start sharded steps: stages 2 and 3 drop the full gradient buffer, stage 3 the
        full parameter buffer too (after taking this rank's slice of it); the hooks that
        exchange layer by layer are installed. Collective-free; idempotent."""
        if self.sharded:
            return
        m = self.model
        if self._units is not None:
            u = self._units
            if self.stage == 3:
                if m.parameters_flat().size:  # (a model built sliced holds no whole buffer)
                    self.param_shard[...] = m.parameters_flat()[self.lo:self.hi]
                u.placeholders("params")
                m._params_flat = np.empty(0, dtype=self.dtype)
            u.placeholders("grads")
            m._grads_flat = np.empty(0, dtype=self.dtype)  # a rank without samples zeroes it
            m.layer_hooks.append(u.hook)
            m.grad_hooks.append(u.ready)
            from ..nn.allocator import release_freed_memory
            release_freed_memory()  # the whole buffers, kept by distnn's heap thresholds
        self.sharded = True

    def unshard(self) -> None:
        """Give the model whole buffers again (stage 3: the parameters all-gathered, a
        collective); the hooks are removed. The inverse of ``shard``."""
        if not self.sharded:
            return
        m = self.model
        if self._units is not None:
            u = self._units
            u.release_all()
            m.layer_hooks.remove(u.hook)
            m.grad_hooks.remove(u.ready)
            if self.stage == 3:
                m._params_flat = self.gather_parameters()
                self._repoint("params", m._params_flat)
                if getattr(m, "param_slice", None) is not None:
                    m.param_slice = None  # whole again
            m._grads_flat = np.zeros(self.total, dtype=self.dtype)
            self._repoint("grads", m._grads_flat)
        self.sharded = False

    def _repoint(self, which: str, flat: np.ndarray) -> None:
        for layer, key, off, n in self.model._layout:
            views = getattr(layer, which)
            views[key] = flat[off:off + n].reshape(views[key].shape)

    def gather_parameters(self) -> np.ndarray:
        """The whole flat parameter buffer, all-gathered (collective) from the shards."""
        if self.stage != 3:
            return self.model.parameters_flat()
        full = np.empty(self.total, dtype=self.dtype)
        full[self.lo:self.hi] = self.param_shard
        return self.comm.allgatherv_(full, self.counts)

    @contextlib.contextmanager
    def gathered(self) -> Iterator[None]:
        """Within it the model holds all its parameters (stage 3: gathered, then dropped
        again; no gradient buffer): validation, callbacks. Collective at stage 3."""
        if self.stage != 3 or not self.sharded:
            yield
            return
        m, u = self.model, self._units
        u.release_all()
        m.layer_hooks.remove(u.hook)  # no per-layer gathers while the whole model is here
        m._params_flat = self.gather_parameters()
        self._repoint("params", m._params_flat)
        try:
            yield
        finally:
            u.placeholders("params")
            m._params_flat = np.empty(0, dtype=self.dtype)
            m.layer_hooks.append(u.hook)

    # -- the step -----------------------------------------------------------------------
    def synchronize(self) -> None:
        """Complete the gradient exchange of this step (``step`` calls it)."""
        if self._dist is not None:
            self._dist.synchronize()
        elif self.sharded:
            self._units.finish()
            if self.op == "average" and self.comm.size > 1:
                self.grad_shard /= self.comm.size
        else:
            raise RuntimeError(f"ShardedOptimizer stage {self.stage}: call shard() before "
                               "the first step (the Trainer's rule does)")

    def step(self) -> None:
        """Combine the gradients, update this rank's slice, share the parameters (stages 1
        and 2: all-gathered in place; stage 3: gathered by the next forward)."""
        self.synchronize()
        if self._clip is not None:
            self._clip_()
        self.optimizer.step()
        if self._dist is not None:
            self._dist._reducer.synced = False
            self._dist.steps += 1
        if self.stage < 3 and self.comm.size > 1:
            self.comm.allgatherv_(self.model.parameters_flat(), self.counts)

    # -- what a rank holds --------------------------------------------------------------
    def state_bytes(self) -> dict[str, int]:
        """Bytes of training state this rank holds: parameters, gradients and optimizer
        state (full buffers where the stage keeps them, slices where it shards them)."""
        m = self.model
        params = (self.param_shard.nbytes if self.sharded and self.stage == 3
                  else m._params_flat.nbytes)
        grads = (self.grad_shard.nbytes if self.stage > 1 and self.sharded
                 else m._grads_flat.nbytes)
        if self.stage > 1 and not self.sharded:
            grads += self.grad_shard.nbytes
        state = sum(a.nbytes for a in self.optimizer.state_arrays())
        return {"params": int(params), "grads": int(grads), "optimizer": int(state),
                "total": int(params + grads + state)}

    # -- checkpoints ----------------------------------------------------------------------
    def shard_arrays(self) -> dict[str, np.ndarray]:
        """This rank's slice of the parameters and of every optimizer state array (what
        its shard file of a checkpoint holds), by name."""
        p = self.param_shard if self.stage == 3 and self.sharded \
            else self.model.parameters_flat()[self.lo:self.hi]
        out = {"params": np.ascontiguousarray(p)}
        for key, arr in self.optimizer.state[0].items():
            out[f"state/{key}"] = arr
        return out

    def load_shard_arrays(self, pieces) -> None:
        """Fill this rank's parameters (the whole buffer, or at stage 3 once sharded its
        slice) and its slice of the optimizer state from ``pieces``: [(lo, hi, read)] of
        the slices a checkpoint's ranks wrote, ``read(name)`` giving an array of that
        shard file; any number of ranks (re-sliced here)."""
        sharded3 = self.stage == 3 and self.sharded
        target = self.param_shard if sharded3 else self.model.parameters_flat()
        base = self.lo if sharded3 else 0
        want = (self.lo, self.hi) if sharded3 else (0, self.total)
        state = self.optimizer.state[0]
        for lo, hi, read in pieces:
            a, b = max(lo, want[0]), min(hi, want[1])
            if a < b:
                target[a - base:b - base] = read("params")[a - lo:b - lo]
            a, b = max(lo, self.lo), min(hi, self.hi)
            if a < b:
                for key, arr in state.items():
                    arr[a - self.lo:b - self.lo] = read(f"state/{key}")[a - lo:b - lo]
        if self.stage == 3 and not self.sharded:
            self.param_shard[...] = target[self.lo:self.hi]

    def state_dict(self) -> dict[str, Any]:
        """The optimizer's scalars (name, lr, iterations, hyper-parameters); its state
        arrays are per rank (``shard_arrays``), ``state`` here is empty."""
        d = self.optimizer.state_dict()
        d["state"] = []
        return d

    def load_state_dict(self, d: dict[str, Any]) -> None:
        """Restore a ``state_dict()``: the scalars, and state arrays when ``d`` holds the
        whole model's (a dense checkpoint: this rank's slice of them is taken)."""
        d = dict(d)
        keys = self.optimizer._state_keys(self.optimizer.hyperparameters())
        full = list(d.get("state") or [])
        if full:
            d["state"] = [{k: np.asarray(full[0][k]).reshape(-1)[self.lo:self.hi]
                           for k in full[0]}]
        else:
            d["state"] = [{k: self.optimizer.state[0][k].copy() for k in keys}]
        self.optimizer.load_state_dict(d)

    # -- counters and pass-through ------------------------------------------------------
    @property
    def allreduce_calls(self) -> int:
        return self._dist.allreduce_calls if self._dist is not None else self._units.calls

    @property
    def bytes_reduced(self) -> int:
        return self._dist.bytes_reduced if self._dist is not None else self._units.bytes

    @property
    def comm_wait_time(self) -> float:
        return self._dist.comm_wait_time if self._dist is not None else self._units.wait_s

    @property
    def compressor(self):
        return self._dist.compressor if self._dist is not None else None

    def __repr__(self) -> str:
        return (f"ShardedOptimizer({self.optimizer!r}, stage={self.stage}, op={self.op!r}, "
                f"ranks={self.comm.size}, slice={self.lo}:{self.hi} of {self.total})")
