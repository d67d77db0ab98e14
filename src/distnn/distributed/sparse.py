"""Sparse gradients on the wire: selection (top-k, threshold), the (index, value) encoding,
the exchange that stays correct when ranks pick different indices, and the crossover that
picks the cheaper of it and a dense all-reduce.

Encoding of one rank's pairs over a flat buffer of n elements: the indices, sorted, are cut
into blocks of 65536; the payload is the number of pairs in each block (int32, one per
block), then each index's offset inside its block (uint16), then the values (the buffer's
dtype). That is 2 + itemsize bytes a pair plus 4 bytes per 65536 elements, instead of
4 + itemsize for int32 indices (SINGA's pairs): top-k 1% of a float32 model travels as
1.5% of its dense bytes, not 2%.

Exchange: an all-gather of every rank's pair count (skipped when every rank sends the
same known count, as top-k does), then one ``Allgatherv`` of the payloads (the overlapped
exchange posts them at once instead: compressed_buckets.py, oneround.py); every rank adds
the pairs of rank 0, 1, ... in that order into a zeroed buffer, so all ranks get the same
sum, bit for bit (``distnn.kernels.topk.add_block_pairs_``: compiled with numba).
Selection: ``topk_indices`` of ``distnn.kernels.topk`` (ties at the k-th largest
magnitude: the lowest indices).

Crossover: an all-gather delivers all N payloads to every rank, about
``sum_r payload_r`` bytes per rank, while a ring all-reduce of n elements moves about
``2 n itemsize`` bytes per rank (reduce-scatter plus all-gather). The sparse form is used
while ``sum_r payload_r < 2 n itemsize``: for top-k with float32 while
``N * ratio * 6 < 8``, i.e. a ratio below about 1.33/N (SINGA's int32 pairs: 1/N).
Beyond it the selected values are scattered into a dense buffer and all-reduced.
"""
from __future__ import annotations

import numpy as np

from ..kernels.topk import add_block_pairs_, topk_indices  # noqa: F401  (re-exported)

BLOCK_BITS = 16
BLOCK = 1 << BLOCK_BITS


def threshold_indices(acc: np.ndarray, value: float) -> np.ndarray:
    """Sorted indices of the entries of 1-D ``acc`` with ``|acc| >= value``."""
    return np.flatnonzero(np.abs(acc) >= value)


def blocks_of(n: int) -> int:
    return max(1, -(-n // BLOCK))


def payload_bytes(pairs: int, n: int, itemsize: int) -> int:
    """Bytes of the encoding of ``pairs`` pairs over a buffer of ``n`` elements."""
    return 4 * blocks_of(n) + pairs * (2 + itemsize)


def encode(indices: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    """The payload (uint8) of sorted ``indices`` into a buffer of ``n`` elements."""
    counts = np.bincount(indices >> BLOCK_BITS, minlength=blocks_of(n)).astype(np.int32)
    offsets = (indices & (BLOCK - 1)).astype(np.uint16)
    return np.concatenate([counts.view(np.uint8), offsets.view(np.uint8),
                           np.ascontiguousarray(values).view(np.uint8)])


def _fields(payload: np.ndarray, pairs: int, n: int, dtype):
    """(counts, offsets, values) of one rank's payload (views of it; values may be
    unaligned)."""
    nb = blocks_of(n)
    at = 4 * nb + 2 * pairs
    return (payload[:4 * nb].view(np.int32), payload[4 * nb:at].view(np.uint16),
            payload[at:at + pairs * np.dtype(dtype).itemsize].view(dtype))


def decode(payload: np.ndarray, pairs: int, n: int, dtype) -> tuple[np.ndarray, np.ndarray]:
    """(indices, values) of one rank's payload."""
    counts, offsets, values = _fields(payload, pairs, n, dtype)
    starts = np.repeat(np.arange(counts.size, dtype=np.int64) << BLOCK_BITS, counts)
    return starts + offsets, values


def sparse_is_cheaper(pair_counts, n: int, itemsize: int) -> bool:
    """The crossover of the module doc: all-gather of every rank's payload vs a ring
    all-reduce of the n dense elements."""
    gathered = sum(payload_bytes(int(k), n, itemsize) for k in pair_counts)
    return gathered < 2 * n * itemsize


def sparse_allreduce_(out: np.ndarray, indices: np.ndarray, values: np.ndarray, comm,
                      pair_counts=None) -> tuple[np.ndarray, int]:
    """Sum over ranks of every rank's (indices, values) pairs, written into ``out`` (1-D,
    zeroed here), each rank's pairs added in rank order.

    Args:
        out: the dense result (its size n is the index space, its dtype the values').
        indices: this rank's sorted indices into ``out``; values: their values.
        comm: communicator (needs ``allgather`` and ``allgatherv``).
        pair_counts: every rank's number of pairs when known to all (top-k); None
            gathers them first.

    Returns:
        (out, bytes this rank handed to the collectives).
    """
    n = out.size
    sent = 0
    if pair_counts is None:
        mine = np.array([indices.size], dtype=np.int64)
        pair_counts = comm.allgather(mine)[:, 0]
        sent += mine.nbytes
    payload, sizes = pairs_payload(indices, values, n, out.itemsize, pair_counts)
    gathered = comm.allgatherv(payload, sizes)
    return sum_pairs_(out, gathered, pair_counts), sent + payload.nbytes


def pairs_payload(indices: np.ndarray, values: np.ndarray, n: int, itemsize: int,
                  pair_counts) -> tuple[np.ndarray, list[int]]:
    """This rank's payload and every rank's payload size (bytes), for the all-gather of
    ``sparse_allreduce_`` (started without waiting by the overlapped exchange)."""
    payload = encode(indices, values, n)
    return payload, [payload_bytes(int(k), n, itemsize) for k in pair_counts]


def sum_pairs_(out: np.ndarray, gathered: np.ndarray, pair_counts) -> np.ndarray:
    """``out`` zeroed, then every rank's pairs of the gathered payloads added in rank
    order (the one place the sparse sum's arithmetic is written)."""
    n = out.size
    out[...] = 0
    start = 0
    for k in pair_counts:
        size = payload_bytes(int(k), n, out.itemsize)
        counts, offsets, values = _fields(gathered[start:start + size], int(k), n, out.dtype)
        add_block_pairs_(out, counts, offsets, values, BLOCK_BITS)  # unique within a rank
        start += size
    return out
