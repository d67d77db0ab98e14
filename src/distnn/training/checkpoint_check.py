"""Checks of a checkpoint's metadata before anything trusts it (``load_checkpoint``): a
file from elsewhere may have every entry, of the wrong type. Each problem is one phrase
that ``load_checkpoint`` puts in its ``CheckpointError``.
"""
from __future__ import annotations

import json
from typing import Any

import numpy as np

__all__ = ["meta_problem"]


def _count(value, low: int = 0) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


# meta entry -> (required, check of its value)
_META = {
    "epochs_done": (True, _count), "epoch_step": (False, _count),
    "global_step": (True, _count), "seed": (True, lambda v: _count(v) and v < 2**63),
    "history": (True, lambda v: isinstance(v, list) and all(isinstance(r, dict) for r in v)),
    "stop_reason": (False, lambda v: v is None or isinstance(v, str)),
    "optimizer": (True, lambda v: isinstance(v, dict) and isinstance(v.get("optimizer"), str)
                  and isinstance(v.get("hyperparameters", {}), dict)),
    "callbacks": (False, lambda v: isinstance(v, list) and all(
        isinstance(c, dict) and isinstance(c.get("type"), str) for c in v)),
    "rng": (True, lambda v: isinstance(v, list) and all(isinstance(r, dict) for r in v)),
    "rule": (False, lambda v: isinstance(v, dict) and isinstance(v.get("name"), str)
             and isinstance(v.get("state", {}), dict)),
    "model": (False, lambda v: isinstance(v, dict)),
    "ranks": (False, lambda v: v is None or _count(v, 1)),
    "global_batch_size": (False, lambda v: v is None or _count(v, 1)),
    "run": (False, lambda v: isinstance(v, dict)),
    "lr": (False, lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)),
}


def meta_problem(meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> str | None:
    """What is wrong with a checkpoint's metadata (None: nothing): a missing entry, an
    entry of the wrong type, or a reference to an array the file lacks."""
    for key, (required, check) in _META.items():
        if key not in meta:
            if required:
                return f"its metadata has no {key!r} entry"
        elif not check(meta[key]):
            return f"its metadata entry {key!r} is {json.dumps(meta[key])[:60]}"
    if "lr" not in meta and not isinstance(meta["optimizer"].get("lr"), (int, float)):
        return "its metadata has no learning rate"

    def refs(node):
        if isinstance(node, dict):
            if "__array__" in node:
                yield node["__array__"]
            for value in node.values():
                yield from refs(value)
        elif isinstance(node, list):
            for value in node:
                yield from refs(value)
    for ref in refs(meta):
        if not isinstance(ref, str) or ref not in arrays:
            return f"its metadata refers to array {ref!r}, which the file lacks"
    return None
