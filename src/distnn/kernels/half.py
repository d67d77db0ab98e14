"""float32 <-> float16 conversions of gradient buckets and the float32 sum of float16
rows (the float16 exchange of ``distnn.distributed.halfsum``). Every result equals
NumPy's: casts round to nearest even (overflow to inf, no warning), sums add the rows in
order in float32. With the "numba" backend the float32 cases run compiled over the 16-bit
words (``_numba_half``); other dtypes, and the "numpy" backend, use NumPy's casts.
"""
from __future__ import annotations

import numpy as np

from .backend import compiled


def _fast():
    if compiled() is None:
        return None
    from . import _numba_half
    return _numba_half


def to_half(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """dst (same size; float16 for the compiled path) = src cast as NumPy's
    ``casting="unsafe"`` copy does; returns dst."""
    fast = _fast()
    if (fast is not None and src.dtype == np.float32 and dst.dtype == np.float16
            and src.flags.c_contiguous and dst.flags.c_contiguous):
        fast.to_half_bits(src.reshape(-1).view(np.uint32), dst.reshape(-1).view(np.uint16))
    else:
        with np.errstate(over="ignore"):
            np.copyto(dst, src, casting="unsafe")
    return dst


def from_half(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """dst (src's size) = src in dst's dtype (NumPy's cast; float16 to float32 is exact);
    returns dst."""
    fast = _fast()
    if (fast is not None and src.dtype == np.float16 and dst.dtype == np.float32
            and src.flags.c_contiguous and dst.flags.c_contiguous):
        fast.from_half_words(src.reshape(-1).view(np.uint16), dst.reshape(-1).view(np.uint32))
    else:
        np.copyto(dst, src, casting="unsafe")
    return dst


def sum_halves(rows: np.ndarray, out: np.ndarray, acc: np.ndarray) -> np.ndarray:
    """out (float16, rows.shape[1]) = float16 of the float32 sum of the float16 rows
    (p, m), added in row order (float32(rows[0]) + rows[1] + ...) and rounded once;
    acc (float32, m) receives the float32 sums; returns out."""
    fast = _fast()
    if (fast is not None and rows.flags.c_contiguous and out.flags.c_contiguous
            and acc.flags.c_contiguous):
        fast.sum_half_rows(rows.view(np.uint16), out.view(np.uint16), acc)
        return out
    acc[...] = rows[0]
    for row in rows[1:]:
        np.add(acc, row, out=acc, dtype=np.float32)
    return to_half(acc, out)
