"""Top-k selection by magnitude and the scatter-add of block-coded sparse pairs (the
top-k exchange of ``distnn.distributed.sparse``). Both backends give the same indices and
the same sums, bit for bit: the scatter-add runs compiled with "numba" (``_numba_topk``);
the selection is NumPy's on both (a compiled radix select measured no faster than
``np.partition`` here: 0.28 ms for 147,584 float32, one core).

The selection's rule, which fixes ties: magnitudes are compared as the float's bits with
the sign cleared (unsigned integers; for IEEE floats the order of ``|x|``, every NaN above
infinity, NaNs among themselves by payload, -0 equal to +0); the result is every index
whose magnitude is above the k-th largest, then, among those equal to it, the lowest
indices, as many as make k; returned in increasing order.
"""
from __future__ import annotations

import numpy as np

from .backend import compiled

_WORDS = {2: np.uint16, 4: np.uint32, 8: np.uint64}


def _fast():
    if compiled() is None:
        return None
    from . import _numba_topk
    return _numba_topk


def magnitudes(x: np.ndarray) -> np.ndarray:
    """The words the selection compares: a float's bits without its sign (unsigned);
    other dtypes: ``|x|``."""
    x = np.ascontiguousarray(x).reshape(-1)
    if x.dtype.kind != "f" or x.dtype.itemsize not in _WORDS:
        return np.abs(x)
    words = _WORDS[x.dtype.itemsize]
    return x.view(words) & words((1 << (8 * x.dtype.itemsize - 1)) - 1)


def topk_indices(x: np.ndarray, k: int) -> np.ndarray:
    """Sorted indices (int64) of the ``k`` entries of ``x`` largest in magnitude (the
    module doc's rule for ties)."""
    n = x.size
    if k >= n:
        return np.arange(n)
    if k <= 0:
        return np.zeros(0, np.int64)
    mag = magnitudes(x)
    t = np.partition(mag, n - k)[n - k]  # the k-th largest
    chosen = mag > t
    ties = np.flatnonzero(mag == t)[:k - int(np.count_nonzero(chosen))]
    chosen[ties] = True
    return np.flatnonzero(chosen)


def add_block_pairs_(out: np.ndarray, counts: np.ndarray, offsets: np.ndarray,
                     values: np.ndarray, block_bits: int) -> np.ndarray:
    """``out[(b << block_bits) + offset] += value`` for the pairs of every block b in order
    (``counts[b]`` pairs each; the offsets of one block distinct); returns out."""
    fast = _fast()
    if (fast is not None and out.flags.c_contiguous and out.ndim == 1
            and values.dtype == out.dtype):
        fast.add_block_pairs(out, counts, offsets, values, block_bits)
        return out
    starts = np.repeat(np.arange(counts.size, dtype=np.int64) << block_bits, counts)
    out[starts + offsets] += values
    return out
