"""Which parameters take weight decay (``decays``: the one rule), the ranges of a model's
flat buffer that do (``decay_ranges``), and clipping by the global gradient norm
(``clip_grad_norm_``).

The rule (minGPT's and Hugging Face's): weight matrices and kernels decay; biases,
normalization scales and shifts and embedding tables do not. Decided from the layer's
type (``NO_DECAY_LAYERS``, by class name, so that a layer family added later joins by
its name) and the parameter's key and rank (``NO_DECAY_KEYS``, anything of fewer than two
dimensions; a ``distnn.torch.TorchModel``'s units by their torch module's class).
``AdamW`` applies it by default; pass ``decay=None`` for torch's AdamW (every
parameter decays) or your own ``decay(layer, key, array) -> bool``.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import numpy as np

DecayRule = Callable[[Any, str, np.ndarray], bool]

NO_DECAY_LAYERS = ("Embedding", "TokenEmbedding", "PositionalEmbedding", "LayerNorm",
                   "RMSNorm", "GroupNorm", "BatchNormalization", "BatchNorm")
NO_DECAY_KEYS = ("b", "bias", "beta", "gamma")


def decays(layer: Any, key: str, array: np.ndarray) -> bool:
    """Whether parameter ``key`` of ``layer`` takes weight decay (see the module's doc)."""
    # a TorchModel's unit is known by the torch module it holds (torch.nn.Embedding...)
    kinds = (*type(layer).__mro__, *type(getattr(layer, "module", None)).__mro__)
    if any(cls.__name__ in NO_DECAY_LAYERS for cls in kinds):
        return False
    return key not in NO_DECAY_KEYS and np.ndim(array) >= 2


def _offset(flat: np.ndarray, view: np.ndarray) -> int | None:
    """Where ``view`` starts in the 1-D ``flat`` buffer (None: it is not a contiguous part)."""
    if not (view.flags.c_contiguous and np.shares_memory(flat, view)):
        return None
    start = view.__array_interface__["data"][0] - flat.__array_interface__["data"][0]
    return start // flat.itemsize


def decay_ranges(model: Any, rule: DecayRule | None = decays) -> list[tuple[int, int]]:
    """The [start, stop) ranges of ``model.parameters_flat()`` that take weight decay under
    ``rule`` (None: the whole buffer), adjacent ones merged. A model whose parameters are
    not all views of its flat buffer that its layers show (``walk``, ``params``) decays as
    a whole."""
    flat = model.parameters_flat()
    if rule is None or not hasattr(model, "walk"):
        return [(0, flat.size)]
    spans, seen = [], 0
    for layer in model.walk():
        for key, array in getattr(layer, "params", {}).items():
            start = _offset(flat, array)
            if start is None:
                return [(0, flat.size)]
            seen += array.size
            if rule(layer, key, array):
                spans.append((start, start + array.size))
    if seen != flat.size:  # parameters the layers do not show (a wrapped torch module)
        return [(0, flat.size)]
    merged: list[tuple[int, int]] = []
    for a, b in sorted(spans):
        if merged and merged[-1][1] == a:
            merged[-1] = (merged[-1][0], b)
        else:
            merged.append((a, b))
    return merged


def named_groups(model: Any, rule: DecayRule | None = decays) -> dict[str, list[str]]:
    """{"decay": [names], "no_decay": [names]}: the ``"<layer>/<key>"`` names of each group."""
    out: dict[str, list[str]] = {"decay": [], "no_decay": []}
    for layer in model.walk():
        for key, array in getattr(layer, "params", {}).items():
            yes = rule is None or rule(layer, key, array)
            out["decay" if yes else "no_decay"].append(f"{layer.name}/{key}")
    return out


def grad_norm(grads: Sequence[np.ndarray]) -> float:
    """The L2 norm of all of ``grads`` together, accumulated in float64."""
    total = 0.0
    for g in grads:
        flat = g.reshape(-1)
        total += float(np.einsum("i,i->", flat, flat, dtype=np.float64))
    return math.sqrt(total)


def clip_grad_norm_(grads: Sequence[np.ndarray], max_norm: float) -> float:
    """Scale ``grads`` in place so that their global L2 norm is at most ``max_norm``
    (torch.nn.utils.clip_grad_norm_: the factor max_norm / (norm + 1e-6), when below 1);
    returns the norm before clipping. A non-finite norm leaves them as they are (the
    trainer's non-finite loss check stops the run)."""
    norm = grad_norm(grads)
    factor = max_norm / (norm + 1e-6)
    if factor < 1.0 and math.isfinite(norm):
        for g in grads:
            np.multiply(g, g.dtype.type(factor), out=g)
    return norm


__all__ = ["decays", "decay_ranges", "named_groups", "grad_norm", "clip_grad_norm_",
           "NO_DECAY_LAYERS", "NO_DECAY_KEYS"]
