"""Compiled float32 <-> float16 conversions over 16-bit words (numba has no float16 type):
the bit-level round-to-nearest-even of IEEE 754 (what NumPy's cast does), and the float32
sum of float16 rows. ``half`` is their entry point and NumPy reference.
"""
from __future__ import annotations

import numpy as np

from ._numba_runtime import nb

_jit = nb.njit(cache=True, nogil=True)


@_jit
def _bits_to_half(u):
    """float16 word of the float32 with bits ``u`` (uint32), rounded to nearest even
    (branch-free: every case computed, one selected)."""
    a = u & np.uint32(0x7FFFFFFF)
    special = np.uint32(0x7E00) | ((a >> 13) & 0x3FF) if a > 0x7F800000 else np.uint32(0x7C00)
    # float16 normals: rebias the exponent, round half to even (65520 and up carry to inf)
    normal = ((a + np.uint32(0xC8000FFF) + ((a >> 13) & 1)) >> 13) & 0xFFFF
    # below 2**-14: adding 0.5 rounds |x| to a multiple of 2**-24 (the FPU rounds to even)
    tiny = np.float32(np.uint32(a).view(np.float32) + np.float32(0.5)).view(np.uint32)
    tiny = tiny - np.uint32(0x3F000000)
    half = special if a >= 0x47800000 else (normal if a >= 0x38800000 else tiny)
    return np.uint32(half) | ((u >> 16) & 0x8000)


@_jit
def _half_bits(h):
    """float32 bits of the float16 word h (exact; NaN payloads kept; branch-free: every
    case computed, one selected)."""
    shifted = (h & np.uint32(0x7FFF)) << 13
    e = shifted & np.uint32(0x0F800000)
    normal = shifted + np.uint32(0x38000000)  # rebias the exponent
    special = normal + np.uint32(0x38000000)  # inf, NaN
    # subnormals: 2**-14 * (1 + m / 1024) - 2**-14 is exact
    tiny = np.float32(np.uint32(normal + 0x00800000).view(np.float32) - np.float32(2.0 ** -14))
    tiny_bits = tiny.view(np.uint32)
    bits = special if e == 0x0F800000 else (tiny_bits if e == 0 else normal)
    return np.uint32(bits) | ((h & np.uint32(0x8000)) << 16)


@_jit
def to_half_bits(src, dst):
    """dst[i] = float16 word of float32 src[i] (src as uint32 words, dst uint16)."""
    for i in range(src.size):
        dst[i] = _bits_to_half(np.uint32(src[i]))


@_jit
def from_half_words(src, dst):
    """dst[i] (uint32 words) = float32 bits of the float16 word src[i]."""
    for i in range(src.size):
        dst[i] = _half_bits(np.uint32(src[i]))


@_jit
def sum_half_rows(rows, out, acc):
    """out[j] = the float16 word of the float32 sum, in row order, of the float16 words
    rows[:, j] (each addition rounded to float32, the sum rounded to float16 once); acc
    (float32) holds the sums."""
    p, m = rows.shape
    bits = acc.view(np.uint32)
    for j in range(m):
        bits[j] = _half_bits(np.uint32(rows[0, j]))
    for k in range(1, p):
        for j in range(m):
            acc[j] = acc[j] + np.uint32(_half_bits(np.uint32(rows[k, j]))).view(np.float32)
    for j in range(m):
        out[j] = _bits_to_half(bits[j])
