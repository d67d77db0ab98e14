"""Compiled scatter-add of block-coded (index, value) pairs, the sum of the top-k
exchange (``topk`` is its entry point and NumPy reference)."""
from __future__ import annotations

from ._numba_runtime import nb

_jit = nb.njit(cache=True, nogil=True)


@_jit
def add_block_pairs(out, counts, offsets, values, block_bits):
    """out[(b << block_bits) + offsets[i]] += values[i], the pairs of block b being the
    next counts[b] ones, in order (each addition in out's dtype, as NumPy's)."""
    i = 0
    for b in range(counts.size):
        base = b << block_bits
        for _ in range(counts[b]):
            j = base + offsets[i]
            out[j] = out[j] + values[i]
            i += 1
