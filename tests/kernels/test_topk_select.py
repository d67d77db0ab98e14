"""distnn.kernels.topk on both backends: the top-k selection's rule (the k largest
magnitudes; at the k-th largest, the lowest indices; sorted) against a naive reference,
and the scatter-add of block-coded pairs against a loop, bit for bit, unaligned values
included."""
from __future__ import annotations

import numpy as np
import pytest

from distnn.kernels import topk


def naive_topk(x: np.ndarray, k: int) -> np.ndarray:
    """The rule by sorting: magnitude words descending, index ascending; the first k."""
    mag = topk.magnitudes(x)
    order = sorted(range(x.size), key=lambda i: (-int(mag[i]), i))
    return np.sort(np.array(order[:k], dtype=np.int64))


def cases():
    rng = np.random.default_rng(0)
    for n in (1, 2, 7, 100, 1000, 5003):
        yield rng.standard_normal(n).astype(np.float32)
        yield np.round(rng.standard_normal(n) * 2).astype(np.float32)  # many ties
        yield rng.integers(-3, 4, n).astype(np.float64)
        yield rng.standard_normal(n).astype(np.float16)
    x = rng.standard_normal(500).astype(np.float32)
    x[[3, 50, 400]] = [np.nan, -np.inf, np.inf]
    x[[7, 8]] = [-0.0, 0.0]
    yield x


@pytest.mark.parametrize("x", list(cases()), ids=lambda x: f"{x.dtype}-{x.size}")
def test_topk_follows_the_rule(x):
    for k in sorted({1, 2, x.size // 100 + 1, x.size // 3 + 1, x.size - 1, x.size}):
        if not 1 <= k <= x.size:
            continue
        got = topk.topk_indices(x, k)
        assert got.dtype.kind == "i" and got.size == k
        assert np.array_equal(got, naive_topk(x, k)), (x.dtype, x.size, k)


def test_topk_keeps_argpartitions_magnitudes_and_breaks_ties_by_index():
    rng = np.random.default_rng(1)
    x = rng.standard_normal(147_584).astype(np.float32)
    k = 1475
    got = topk.topk_indices(x, k)
    ref = np.argpartition(np.abs(x), x.size - k)[x.size - k:]
    assert np.array_equal(np.sort(np.abs(x[got])), np.sort(np.abs(x[ref])))
    assert np.all(np.diff(got) > 0)
    ties = np.array([1.0, -2.0, 2.0, 1.0, -2.0, 0.5], np.float32)
    assert topk.topk_indices(ties, 2).tolist() == [1, 2]
    assert topk.topk_indices(ties, 3).tolist() == [1, 2, 4]
    assert topk.topk_indices(ties, 4).tolist() == [0, 1, 2, 4]
    assert topk.topk_indices(ties, 0).size == 0
    assert topk.topk_indices(ties, 9).tolist() == list(range(6))


def naive_add(out, counts, offsets, values, bits):
    i = 0
    for b, c in enumerate(counts):
        for _ in range(int(c)):
            j = (b << bits) + int(offsets[i])
            out[j] = out.dtype.type(out[j] + values[i])
            i += 1
    return out


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shift", [0, 2, 6])
def test_add_block_pairs_equals_a_loop(dtype, shift):
    rng = np.random.default_rng(2)
    bits, n = 6, 300  # blocks of 64: 5 blocks
    idx = np.sort(rng.choice(n, 80, replace=False))
    counts = np.bincount(idx >> bits, minlength=-(-n // (1 << bits))).astype(np.int32)
    offsets = (idx & ((1 << bits) - 1)).astype(np.uint16)
    raw = np.zeros(shift + 80 * np.dtype(dtype).itemsize, np.uint8)
    values = raw[shift:].view(dtype)  # unaligned for shifts not a multiple of the size
    values[...] = rng.standard_normal(80).astype(dtype) * 1e3
    start = (rng.standard_normal(n) * 1e-3).astype(dtype)
    got = topk.add_block_pairs_(start.copy(), counts, offsets, values, bits)
    want = naive_add(start.copy(), counts, offsets, values, bits)
    assert np.array_equal(got.view(f"u{np.dtype(dtype).itemsize}"),
                          want.view(f"u{np.dtype(dtype).itemsize}"))


def big_cases():
    rng = np.random.default_rng(3)
    for n in (8192, 147_584):
        x = rng.standard_normal(n).astype(np.float32)
        yield x
        yield np.round(x * 3).astype(np.float32)  # few distinct values: many ties
        y = x.copy()
        y[: n // 2] = 0
        yield y
        yield (x.astype(np.float64) ** 9).astype(np.float32)  # heavy tails
        yield np.sort(x)  # the sample sees a sorted run
        yield np.full(n, 0.5, np.float32)  # every entry a tie: the sample's bound lets all in


@pytest.mark.parametrize("x", list(big_cases()), ids=lambda x: f"{x.size}")
def test_the_sampled_bound_picks_the_rules_set(x):
    """Big buffers first keep the entries above a bound read off a sample; the set must be
    the rule's over all entries, for every k."""
    mag = topk.magnitudes(x)
    for k in (1, 7, x.size // 1000, x.size // 100, x.size // 20, x.size // 8):
        want = np.flatnonzero(topk._largest(mag, k))
        assert np.array_equal(topk.topk_indices(x, k), want), (x.size, k)
