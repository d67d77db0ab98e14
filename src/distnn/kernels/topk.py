"""Top-k selection by magnitude and the scatter-add of block-coded sparse pairs (the
top-k exchange of ``distnn.distributed.sparse``). Both backends give the same indices and
the same sums, bit for bit: the scatter-add runs compiled with "numba" (``_numba_topk``);
the selection is NumPy's on both (a compiled radix select measured no faster than
``np.partition`` here: 0.28 ms for 147,584 float32, one core; a sampled bound that
partitions ~2k candidates instead of all n takes 0.22 with ``magnitudes``).

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
    idx = _candidates(mag, k)
    if idx is not None:
        return idx[_largest(mag[idx], k)]
    return np.flatnonzero(_largest(mag, k))


def _largest(mag: np.ndarray, k: int) -> np.ndarray:
    """The rule's mask over ``mag``: above the k-th largest, then its lowest ties."""
    n = mag.size
    t = np.partition(mag, n - k)[n - k]  # the k-th largest
    chosen = mag > t
    ties = np.flatnonzero(mag == t)[:k - int(np.count_nonzero(chosen))]
    chosen[ties] = True
    return chosen


def _candidates(mag: np.ndarray, k: int):
    """Sorted indices of the entries at or above a bound read off a strided sample of
    ``mag`` (about 2k of them), when at least k are: they hold the k largest and every
    tie of the k-th, so the rule over them picks the same set as over all (partitioning
    ~2k entries instead of n: 0.28 -> 0.22 ms for 147,584 float32 and k = 1%). None when
    the sample does not pay or the bound lets fewer than k through."""
    n = mag.size
    if n < 8192 or 8 * k > n:
        return None
    step = n // 2048
    sample = mag[::step]
    r = 2 * k * sample.size // n + 8  # the sample's r-th largest: ~2k entries above it
    if r >= sample.size:
        return None
    bound = np.partition(sample, sample.size - r)[sample.size - r]
    idx = np.flatnonzero(mag >= bound)
    return idx if k <= idx.size <= n // 4 else None


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
