"""Sums of a graph block's branch outputs and gradients (``containers``' Add and Concat):
into new arrays, or, for a fused Add + ReLU, into the array the block owns."""
from __future__ import annotations

import numpy as np

from ..kernels.backend import compiled


def _add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a + b into a new array: for contiguous floats of one shape and dtype the compiled
    kernel, whose elements the block threads share at 2+ threads (the same bits)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return a + b
    out = np.empty_like(a)
    fast = compiled()
    if (fast is not None and a.dtype.kind == "f" and a.size and a.flags.c_contiguous
            and b.flags.c_contiguous):
        fast.add(a, b, out)
        return out
    return np.add(a, b, out=out)


def _sum_fresh(arrays):
    """Sum of the non-None arrays into a new array (inputs may be views of dy or caches)."""
    arrays = [a for a in arrays if a is not None]
    if not arrays:
        return None
    if len(arrays) == 1:
        return arrays[0].copy()
    # one pass (not a copy, then +=), into arrays[0]'s shape and dtype as += would be
    if arrays[0].shape == arrays[1].shape and arrays[0].dtype == arrays[1].dtype:
        total = _add(arrays[0], arrays[1])
    else:
        total = np.add(arrays[0], arrays[1], out=np.empty_like(arrays[0]))
    for a in arrays[2:]:
        total += a
    return total


def _sum_into(g: np.ndarray, arrays, mask: np.ndarray | None = None):
    """(sum, masked): ``_sum_fresh``'s sum of two branch gradients (same bits) into g where
    it fits (the fused Add's own dy for its branches, which are done with it); with
    ``mask`` (the block's input from a fused Add + ReLU) masked as that ReLU's backward
    would (``add_relu_backward``): masked True. Else as ``_sum_fresh``."""
    arrays = [a for a in arrays if a is not None]
    fast = compiled()
    if (fast is None or len(arrays) != 2
            or not all(a.shape == arrays[0].shape and a.dtype == arrays[0].dtype
                       and a.flags.c_contiguous for a in arrays)):
        return _sum_fresh(arrays), False
    a, b = arrays
    into = (a.shape == g.shape and a.dtype == g.dtype and g.flags.c_contiguous
            and all(v is g or not np.may_share_memory(v, g) for v in arrays))
    out = g if into else np.empty_like(a)
    if (mask is not None and mask.shape == a.shape and mask.dtype == a.dtype
            and mask.flags.c_contiguous):
        fast.add_relu_backward(a, b, mask, out)
        return out, True
    fast.add(a, b, out)
    return out, False
