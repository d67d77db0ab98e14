"""What a gradient-compression spec becomes, parsed once: one object that the Reducer,
both DistributedOptimizers (NumPy and torch) and checkpoints share, and the one
``Compression`` facade with Horovod's names.

Specs, as ``--gradient_compression`` and ``compression=`` of both DistributedOptimizers:
``none``, ``fp16``, ``topk:RATIO``, ``threshold:VALUE``, ``powersgd:RANK``; or the objects
``Compression.none``, ``Compression.fp16``, ``Compression.topk(ratio)``,
``Compression.threshold(value)``, ``Compression.powersgd(rank)``. ``Compression.parse``
turns a spec into its object (an object passes through unchanged), and every object
gives its spec back (``obj.spec``; ``Compression.parse(obj.spec) == obj``), which is
what a checkpoint stores. Every object says

* ``wire_dtype``: the dtype buckets travel in (None: the buffer's own; fp16: float16);
* ``compressing``: whether it sends less than the gradients (top-k, threshold, PowerSGD:
  a ``CompressedReduction`` of ``lossy.py`` does the exchange, keeping residuals);
* ``compress``/``decompress``: Horovod's per-tensor pair (for NumPy arrays and torch
  tensors alike), which the stateful ones refuse.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from . import sparse
from .powersgd import worth_compressing

__all__ = ["Compression", "NoneCompressor", "FP16Compressor", "TopK", "Threshold",
           "PowerSGD", "parse_compression", "is_compressing", "SPECS"]

SPECS = "none, fp16, topk:RATIO, threshold:VALUE or powersgd:RANK"


class _Spec:
    """Equality with the spec's text ("fp16" == Compression.fp16) and by settings."""

    spec = ""

    def __eq__(self, other):
        if isinstance(other, str):
            return self.spec == other.strip().lower()
        return type(other) is type(self) and vars(other) == vars(self)

    def __hash__(self):
        return hash(self.spec)


class NoneCompressor(_Spec):
    """No compression: arrays and tensors travel in their own dtype (``Compression.none``)."""

    spec, wire_dtype, compressing = "none", None, False

    @staticmethod
    def compress(x):
        return x, None

    @staticmethod
    def decompress(x, ctx):
        return x

    def __repr__(self):
        return "Compression.none"


class FP16Compressor(_Spec):
    """Floating arrays (NumPy) and tensors (torch) travel as float16 and come back in their
    dtype; integer ones are left alone. Values beyond float16's range (65504) become inf
    (``Compression.fp16``)."""

    spec, wire_dtype, compressing = "fp16", np.float16, False

    @staticmethod
    def compress(x):
        if isinstance(x, (np.ndarray, np.generic)):
            if np.issubdtype(x.dtype, np.floating) and x.dtype != np.float16:
                return x.astype(np.float16), x.dtype
            return x, None
        if x.is_floating_point() and str(x.dtype) != "torch.float16":  # a torch tensor
            return x.half(), x.dtype
        return x, None

    @staticmethod
    def decompress(x, ctx):
        if ctx is None:
            return x
        return x.astype(ctx) if isinstance(x, (np.ndarray, np.generic)) else x.to(ctx)

    def __repr__(self):
        return "Compression.fp16"


class _Stateful(_Spec):
    """Horovod's per-tensor ``compress``/``decompress`` do not apply: these compressions
    keep residuals across steps and exchange whole buffers (DistributedOptimizer only)."""

    wire_dtype, compressing = None, True

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


class Compression:
    """The one facade of gradient compression, with Horovod's names: ``Compression.none``,
    ``Compression.fp16`` (objects), and the compressors that send less,
    ``Compression.topk(0.01)``, ``Compression.threshold(1e-3)``, ``Compression.powersgd(2)``
    (classes: called with their settings). ``distnn.torch.Compression`` is this class.

    Example:
        spec = Compression.parse("topk:0.01")  # TopK(0.01); spec.spec == "topk:0.01"
        DistributedOptimizer(opt, model, compression=spec)
    """

    none = NoneCompressor()
    fp16 = FP16Compressor()
    topk = TopK
    threshold = Threshold
    powersgd = PowerSGD

    @staticmethod
    def parse(spec: Any):
        """The compression object of ``spec``: None/"none", "fp16", "topk:R",
        "threshold:V", "powersgd:R" (any case), or an object (returned as it is: Horovod's
        ``Compression.*``, or an object of one's own with ``compress``/``decompress`` and a
        ``wire_dtype``)."""
        if spec is None:
            return Compression.none
        if not isinstance(spec, str):
            if not hasattr(spec, "wire_dtype") and not isinstance(spec, _Stateful):
                raise ValueError(f"compression must be {SPECS} or a Compression object "
                                 f"(Compression.fp16, Compression.topk(0.01), ...), got "
                                 f"{spec!r}")
            return spec
        text = spec.strip().lower()
        if text in ("none", "fp16"):
            return getattr(Compression, text)
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


parse_compression = Compression.parse


def is_compressing(compression) -> bool:
    """Whether ``compression`` sends less than the gradients (needs a CompressedReduction)."""
    return bool(getattr(Compression.parse(compression), "compressing", False))
