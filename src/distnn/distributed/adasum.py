"""Adasum: adaptive summation of vectors over ranks (Maleki et al., "Scaling distributed
training with adaptive summation", MLSys 2021), as Horovod's MPI CPU path computes it.

Two vectors a and b combine, per tensor (segment of the flat buffer), into

    adasum(a, b) = (1 - a.b / (2 |a|^2)) a + (1 - a.b / (2 |b|^2)) b

(a coefficient is 1 where a norm is below sqrt of the smallest double). Orthogonal
gradients add; parallel equal ones average. Over ranks the pairs form a binary tree:
ranks r and r^1 first, then the pairs' results, and so on. It runs as vector halving,
distance doubling: at level L a rank swaps half of its current slice with rank r^L and
combines the half it keeps, with the dot products and norms summed over the 2L ranks that
hold the pieces of the two vectors; the slices are then gathered back in reverse order.

Horovod stops with NotImplementedError on a number of ranks that is not a power of two.
distnn extends it: with p the largest power of two <= N, rank p+i first sends its vector to
rank i, which combines the two (adasum(v_i, v_{p+i})); the p ranks run the tree and rank i
sends the result back to rank p+i. For N = 3 the result is adasum(adasum(v0, v2), v1).
"""
from __future__ import annotations

import numpy as np

from .comm import Communicator

_TINY = float(np.sqrt(np.finfo(np.float64).tiny))
_GROUPS: dict[int, tuple] = {}


def combine(a: np.ndarray, b: np.ndarray, dot: float, anorm2: float, bnorm2: float) -> None:
    """a <- adasum(a, b) given their dot product and squared norms (in place)."""
    ca = 1.0 - dot / anorm2 * 0.5 if anorm2 >= _TINY else 1.0
    cb = 1.0 - dot / bnorm2 * 0.5 if bnorm2 >= _TINY else 1.0
    if a.dtype == np.float16:
        a[...] = ca * a.astype(np.float32) + cb * b.astype(np.float32)
    else:
        a *= a.dtype.type(ca)
        a += a.dtype.type(cb) * b


def _stats(a: np.ndarray, b: np.ndarray) -> tuple[float, float, float]:
    a64 = a.astype(np.float64, copy=False)
    b64 = b.astype(np.float64, copy=False)
    return float(np.dot(a64, b64)), float(np.dot(a64, a64)), float(np.dot(b64, b64))


def reference(vectors: list[np.ndarray], counts) -> np.ndarray:
    """The same combination computed in one process (for tests): the tree over ranks."""
    bounds = np.concatenate([[0], np.cumsum(counts)]).astype(int)

    def pair(a, b):
        out = np.array(a, dtype=np.float64)
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            combine(out[lo:hi], b[lo:hi], *_stats(out[lo:hi], b[lo:hi]))
        return out

    n = len(vectors)
    p = 1 << (n.bit_length() - 1)
    level = [pair(vectors[i], vectors[i + p]) if i + p < n else np.array(vectors[i], np.float64)
             for i in range(p)]
    while len(level) > 1:
        level = [pair(level[i], level[i + 1]) for i in range(0, len(level), 2)]
    return level[0]


def _groups(comm: Communicator, p: int) -> tuple:
    """Sub-communicators of 2, 4, ... p ranks that sum the dot products at each level
    (made once per communicator; collective over all its ranks)."""
    key = id(comm)
    if key not in _GROUPS or _GROUPS[key][0] is not comm:
        subs = []
        level, shift = 1, 1
        while level < p:
            color = comm.rank >> shift if comm.rank < p else p + comm.rank
            subs.append(comm.split(color, comm.rank))
            level, shift = level << 1, shift + 1
        _GROUPS[key] = (comm, subs)
    return _GROUPS[key][1]


def _segment_stats(own, other, bounds, lo, hi, left: bool) -> np.ndarray:
    """[dot, |left|^2, |right|^2] per segment over the slice [lo, hi) this rank holds."""
    out = np.zeros((len(bounds) - 1, 3))
    first = int(np.searchsorted(bounds, lo, side="right")) - 1
    for s in range(max(first, 0), len(bounds) - 1):
        a, b = max(bounds[s], lo), min(bounds[s + 1], hi)
        if a >= hi:
            break
        if b > a:
            dot, n_own, n_other = _stats(own[a - lo:b - lo], other[a - lo:b - lo])
            out[s] = (dot, n_own, n_other) if left else (dot, n_other, n_own)
    return out


def adasum_(x: np.ndarray, counts, comm: Communicator) -> np.ndarray:
    """Replace the 1-D array x by the Adasum of every rank's x, segment by segment
    (``counts``: the segments' lengths, summing to x.size; every rank passes the same).
    Collective; float16, float32 or float64 (dot products in float64). Returns x."""
    if x.ndim != 1 or not x.flags.c_contiguous:
        raise ValueError(f"adasum_ takes a contiguous 1-D array, got shape {x.shape}")
    if x.dtype not in (np.float16, np.float32, np.float64):
        raise TypeError(f"Adasum combines floating gradients, got dtype {x.dtype}; "
                        "use op Sum or Average for integers")
    bounds = np.concatenate([[0], np.cumsum(counts)]).astype(int)
    if bounds[-1] != x.size:
        raise ValueError(f"adasum_: counts sum to {bounds[-1]}, the array has {x.size}")
    n, r = comm.size, comm.rank
    if n == 1:
        return x
    p = 1 << (n.bit_length() - 1)
    groups = _groups(comm, p)
    raw = x.view(np.uint16) if x.dtype == np.float16 else x  # p2p moves bytes
    if r >= p:  # fold into rank r - p, then receive the result from it
        comm.send_(raw, r - p, tag=71)
        comm.recv_(raw, r - p, tag=72)
        return x
    if r + p < n:
        extra = np.empty_like(x)
        comm.recv_(extra.view(np.uint16) if x.dtype == np.float16 else extra, r + p, tag=71)
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            combine(x[lo:hi], extra[lo:hi], *_stats(x[lo:hi], extra[lo:hi]))
    tmp = np.empty_like(x)
    lo, hi, level, k = 0, x.size, 1, 0
    history = []
    while level < p:
        partner = r ^ level
        mid = lo + (hi - lo) // 2
        left = (r & level) == 0
        keep, give = ((lo, mid), (mid, hi)) if left else ((mid, hi), (lo, mid))
        comm.sendrecv_(x[give[0]:give[1]], partner, tmp[keep[0]:keep[1]], partner, tag=73)
        history.append((lo, hi, keep, give, partner))
        lo, hi = keep
        stats = _segment_stats(x[lo:hi], tmp[lo:hi], bounds, lo, hi, left)
        groups[k].allreduce_(stats, "sum")
        for s in range(len(bounds) - 1):
            a, b = max(bounds[s], lo), min(bounds[s + 1], hi)
            if b > a:
                dot, nl, nr = stats[s]
                combine(x[a:b], tmp[a:b], dot, nl if left else nr, nr if left else nl)
        level, k = level << 1, k + 1
    for _, _, keep, give, partner in reversed(history):  # gather the slices back
        comm.sendrecv_(x[keep[0]:keep[1]], partner, x[give[0]:give[1]], partner, tag=74)
    if r + p < n:
        comm.send_(raw, r + p, tag=72)
    return x
