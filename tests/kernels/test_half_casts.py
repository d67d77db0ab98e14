"""distnn.kernels.half (the float16 exchange's casts and sums) against NumPy, bit for bit,
on both backends: every float16 value, float32 values around every float16 value and
rounding midpoint, the subnormal and overflow ranges, and random bit patterns."""
from __future__ import annotations

import numpy as np

from distnn.kernels import half

ALL_HALVES = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)


def _float32_cases() -> np.ndarray:
    exact = ALL_HALVES.astype(np.float32)
    finite = exact[np.isfinite(exact)]
    finite = np.sort(finite[finite >= 0])
    mids = ((finite[:-1].astype(np.float64) + finite[1:]) / 2).astype(np.float32)
    near = np.concatenate([exact.view(np.uint32), mids.view(np.uint32)]).astype(np.int64)
    near = np.concatenate([near + d for d in (-4097, -4096, -1, 0, 1, 4095, 4096)])
    rng = np.random.default_rng(0)
    bits = np.concatenate([
        near % (1 << 32),
        rng.integers(0, 1 << 32, 400_000),
        np.arange(0x32F00000, 0x38900000, 97),  # float16's subnormals and below
        np.arange(0x477FE000, 0x47800400),  # 65504 .. 65536: the rounding to inf
        [0, 0x7F800000, 0x7F800001, 0x7FC00000, 0x7FFFFFFF, 1, 0x007FFFFF]])
    bits = bits.astype(np.uint32)
    return np.concatenate([bits, bits | np.uint32(0x80000000)]).view(np.float32)


def _same(a: np.ndarray, b: np.ndarray, words) -> bool:
    nan = np.isnan(b)
    return bool(np.array_equal(np.isnan(a), nan)
                and np.array_equal(a.view(words)[~nan], b.view(words)[~nan]))


def test_to_half_rounds_as_numpy_casts():
    x = _float32_cases()
    got = half.to_half(x, np.empty(x.size, np.float16))
    with np.errstate(over="ignore", invalid="ignore"):
        want = x.astype(np.float16)
    assert _same(got, want, np.uint16)


def test_to_half_of_float64_rounds_once():
    x = np.array([1 + 2.0 ** -11 + 2.0 ** -40, 65519.99, 1e300, -2.0 ** -25 * 1.5])
    got = half.to_half(x, np.empty(x.size, np.float16))
    with np.errstate(over="ignore"):
        assert _same(got, x.astype(np.float16), np.uint16)


def test_from_half_of_every_float16_value():
    got = half.from_half(ALL_HALVES, np.empty(ALL_HALVES.size, np.float32))
    assert _same(got, ALL_HALVES.astype(np.float32), np.uint32)
    wide = half.from_half(ALL_HALVES, np.empty(ALL_HALVES.size, np.float64))
    assert _same(wide, ALL_HALVES.astype(np.float64), np.uint64)


def test_sum_halves_adds_rows_in_order_in_float32_and_rounds_once():
    rng = np.random.default_rng(1)
    rows = (rng.standard_normal((3, 50_001)) * 300).astype(np.float16)
    rows[:, :5] = [[65504, -0.0, np.inf, 2048, 1e-7], [65504, -0.0, 1, 1, 1e-7],
                   [-65504, -0.0, -1, 1, 0]]
    out = np.empty(rows.shape[1], np.float16)
    half.sum_halves(rows, out, np.empty(rows.shape[1], np.float32))
    acc = rows[0].astype(np.float32)
    for row in rows[1:]:
        acc = acc + row.astype(np.float32)
    assert _same(out, acc.astype(np.float16), np.uint16)
    # float16 step by step would give inf, 2048; float32 keeps 65504, 2050
    assert out[0] == 65504 and np.signbit(out[1]) and out[2] == np.inf and out[3] == 2050
    assert out[4] == 2 * np.float16(1e-7)  # float16 subnormals
    one = half.sum_halves(rows[:1], np.empty_like(out), np.empty(out.size, np.float32))
    assert _same(one, rows[0], np.uint16)
