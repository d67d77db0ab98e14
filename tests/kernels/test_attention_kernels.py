"""distnn.kernels.attention on both backends: the tiled (online-softmax) forward and the
recomputing backward against the whole-matrix float64 reference and against torch's
``scaled_dot_product_attention`` (float64, autograd), at sequence lengths 1 to 1024, with
the causal mask (aligned to the end when Tq != Tk), key padding, both dtypes, several tile
sizes, 1 and 2 threads; a row with every key masked gives zeros, not NaN."""
from __future__ import annotations

import re

import numpy as np
import pytest

from distnn.kernels.attention import (attention_backward, attention_forward,
                                      attention_reference, attention_reference_backward)

LENGTHS = [1, 2, 7, 64, 257, 1024]
TOL = {np.float32: 2e-5, np.float64: 1e-12}


def _shape(t: int) -> tuple[int, int, int]:
    """(B, H, D): small where T is large, to keep the naive reference cheap."""
    return (2, 3, 8) if t <= 64 else (1, 2, 4)


def _case(tq, tk, dtype, padded, seed=0, dv=None):
    b, h, d = _shape(max(tq, tk))
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((b, h, tq, d))
    k = rng.standard_normal((b, h, tk, d))
    v = rng.standard_normal((b, h, tk, dv or d))
    do = rng.standard_normal((b, h, tq, dv or d))
    mask = None
    if padded:
        mask = rng.random((b, tk)) < 0.3
        mask[:, -1] = False  # every row keeps a key: torch gives NaN for an empty row
        mask[:, 0] = False
    return [a.astype(dtype) for a in (q, k, v, do)], mask


def _close(got, want, dtype):
    scale = max(1.0, float(np.max(np.abs(want))))
    err = float(np.max(np.abs(got.astype(np.float64) - want))) / scale
    assert err < TOL[dtype], err


def _check_against_reference(tq, tk, causal, mask, arrays, dtype, block=64):
    q, k, v, do = arrays
    o, lse = attention_forward(q, k, v, causal=causal, key_padding_mask=mask, block=block)
    assert o.dtype == dtype and lse.dtype == dtype and lse.shape == q.shape[:3]
    grads = attention_backward(q, k, v, o, lse, do, causal=causal, key_padding_mask=mask,
                               block=block)
    q64, k64, v64, do64 = (a.astype(np.float64) for a in arrays)
    ro, p = attention_reference(q64, k64, v64, causal=causal, key_padding_mask=mask)
    rgrads = attention_reference_backward(q64, k64, v64, p, do64)
    _close(o, ro, dtype)
    for g, r, a in zip(grads, rgrads, (q, k, v)):
        assert g.dtype == dtype and g.shape == a.shape
        _close(g, r, dtype)
    return o, lse, grads


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("padded", [False, True], ids=["dense", "padded"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("t", LENGTHS)
def test_self_attention_matches_the_naive_reference(t, causal, padded, dtype):
    arrays, mask = _case(t, t, dtype, padded, seed=t)
    _check_against_reference(t, t, causal, mask, arrays, dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("tq,tk", [(1, 7), (1, 1024), (3, 64), (7, 257), (64, 257),
                                   (7, 2), (257, 64)])
def test_cross_lengths_and_the_end_aligned_causal_mask(tq, tk, causal, dtype):
    """Tq < Tk: the decode case (query i sees keys up to i + Tk - Tq); Tq > Tk under the
    causal mask leaves the first rows with no key at all (zeros)."""
    arrays, mask = _case(tq, tk, dtype, padded=True, seed=tq * 1000 + tk, dv=5)
    o, lse, grads = _check_against_reference(tq, tk, causal, mask, arrays, dtype)
    if causal and tq > tk:
        empty = tq - tk
        assert np.all(o[:, :, :empty] == 0) and np.all(np.isneginf(lse[:, :, :empty]))
        assert np.all(grads[0][:, :, :empty] == 0)


@pytest.mark.parametrize("block", [1, 3, 64, 5000])
def test_the_tile_size_does_not_change_the_result(block):
    arrays, mask = _case(100, 100, np.float64, padded=True, seed=5)
    _check_against_reference(100, 100, True, mask, arrays, np.float64, block=block)


@pytest.mark.parametrize("t", [1, 7, 64, 257])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_matches_torch_sdpa_forward_and_backward(t, causal):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    for tq in sorted({t, max(1, t // 3)}):
        (q, k, v, do), mask = _case(tq, t, np.float64, padded=True, seed=t + tq)
        o, lse = attention_forward(q, k, v, causal=causal, key_padding_mask=mask)
        dq, dk, dv = attention_backward(q, k, v, o, lse, do, causal=causal,
                                        key_padding_mask=mask)
        allowed = ~mask[:, None, None, :]
        if causal:  # torch's is_causal aligns to the top left: the end-aligned mask by hand
            allowed = allowed & (np.arange(t)[None, :] <= np.arange(tq)[:, None] + t - tq)
        tq_, tk_, tv_ = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
        to = F.scaled_dot_product_attention(tq_, tk_, tv_, attn_mask=torch.tensor(allowed))
        to.backward(torch.tensor(do))
        np.testing.assert_allclose(o, to.detach().numpy(), rtol=1e-10, atol=1e-12)
        for g, tg in zip((dq, dk, dv), (tq_, tk_, tv_)):
            np.testing.assert_allclose(g, tg.grad.numpy(), rtol=1e-9, atol=1e-12)


def test_a_row_with_every_key_masked_gives_zeros_not_nan():
    (q, k, v, do), _ = _case(5, 9, np.float64, padded=False, seed=3)
    mask = np.zeros((q.shape[0], 9), bool)
    mask[0] = True  # sample 0: every key is padding
    o, lse = attention_forward(q, k, v, key_padding_mask=mask, block=4)
    dq, dk, dv = attention_backward(q, k, v, o, lse, do, key_padding_mask=mask, block=4)
    assert np.all(np.isfinite(o)) and np.all(o[0] == 0) and np.all(np.isneginf(lse[0]))
    assert np.all(dq[0] == 0) and np.all(dk[0] == 0) and np.all(dv[0] == 0)
    ro, p = attention_reference(q, k, v, key_padding_mask=mask)
    np.testing.assert_allclose(o, ro, atol=1e-14)
    assert np.all(np.isfinite(lse[1:]))


def test_one_and_two_threads_give_the_same_bits(threads):
    arrays, mask = _case(257, 257, np.float32, padded=True, seed=9)
    q, k, v, do = arrays
    o, lse = attention_forward(q, k, v, causal=True, key_padding_mask=mask)
    grads = attention_backward(q, k, v, o, lse, do, causal=True, key_padding_mask=mask)
    from distnn import kernels
    kernels.set_num_threads(1)
    o1, lse1 = attention_forward(q, k, v, causal=True, key_padding_mask=mask)
    grads1 = attention_backward(q, k, v, o1, lse1, do, causal=True, key_padding_mask=mask)
    assert np.array_equal(o, o1) and np.array_equal(lse, lse1)
    assert all(np.array_equal(a, b) for a, b in zip(grads, grads1))
    _check_against_reference(257, 257, True, mask, arrays, np.float32)


def test_the_scale_argument_and_dropout_multiplier_of_the_reference():
    (q, k, v, do), _ = _case(6, 6, np.float64, padded=False, seed=4)
    o, lse = attention_forward(q, k, v, scale=0.3)
    ro, p = attention_reference(q, k, v, scale=0.3)
    np.testing.assert_allclose(o, ro, atol=1e-13)
    keep = (np.random.default_rng(0).random(p.shape) > 0.5) / 0.5
    do_, p_ = attention_reference(q, k, v, scale=0.3, dropout=keep)
    np.testing.assert_allclose(do_, np.matmul(p * keep, v), atol=1e-13)
    # the dropout backward against central differences of sum(o * do) in q
    dq = attention_reference_backward(q, k, v, p_, do, scale=0.3, dropout=keep)[0]
    eps, num = 1e-6, np.zeros_like(q)
    for i in np.ndindex(q.shape):
        old = q[i]
        q[i] = old + eps
        fp = np.sum(attention_reference(q, k, v, scale=0.3, dropout=keep)[0] * do)
        q[i] = old - eps
        fm = np.sum(attention_reference(q, k, v, scale=0.3, dropout=keep)[0] * do)
        q[i] = old
        num[i] = (fp - fm) / (2 * eps)
    np.testing.assert_allclose(dq, num, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("change,message", [
    (lambda a: {**a, "q": a["q"][0]}, "q must be (batch, heads, length, dim)"),
    (lambda a: {**a, "k": a["k"].astype(np.float32)}, "share one dtype"),
    (lambda a: {**a, "v": a["v"][:, :, :3]}, "must be (batch, heads, Tk, dim)"),
    (lambda a: {**a, "key_padding_mask": np.zeros((2, 4), bool)}, "key_padding_mask"),
    (lambda a: {**a, "q": a["q"].astype(np.int64)}, "float32 or float64"),
])
def test_bad_arguments_are_named(change, message):
    (q, k, v, _), _ = _case(5, 6, np.float64, padded=False)
    args = change({"q": q, "k": k, "v": v, "key_padding_mask": None})
    with pytest.raises(ValueError, match=re.escape(message)):
        attention_forward(args["q"], args["k"], args["v"],
                          key_padding_mask=args["key_padding_mask"])


def test_the_compiled_float32_exponential_is_within_two_ulp(kernel_backend):
    if kernel_backend == "numpy":
        pytest.skip("the compiled kernels' own exponential")
    from distnn.kernels._numba_attention import _expf
    x = np.concatenate([-np.logspace(-8, np.log10(86.9), 4000), [0.0, 1e-7]]).astype(np.float32)
    got = np.array([_expf(v) for v in x], np.float64)
    want = np.exp(x.astype(np.float64))
    assert np.max(np.abs(got - want) / want) < 2 * np.finfo(np.float32).eps
    assert _expf(np.float32(-np.inf)) == 0 and _expf(np.float32(-100.0)) == 0
