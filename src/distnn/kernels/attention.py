"""Scaled dot-product attention, forward and backward, in the flash-attention manner.

``o = softmax(q k^T * scale + mask) v`` over arrays (B, H, T, D). The forward walks the keys
in tiles of ``block`` with an online softmax (a running row maximum ``m``, a running sum
``l`` and the output accumulated so far, rescaled when the maximum grows), so the Tq x Tk
score matrix never exists whole: the largest temporary is one (B, H, Tq, block) tile and
memory grows linearly in the sequence length. What it keeps for the backward is the
output ``o`` and one statistic per row, its log-sum-exp ``lse = m + log(l)``; the backward
recomputes each tile's probabilities as ``exp(s - lse)`` and uses
``D_i = rowsum(do * o)`` for the softmax's Jacobian (``ds = p * (dp - D_i)``).

Masks, both optional, PyTorch's conventions:
- ``causal``: query i attends keys j <= i + Tk - Tq, the causal mask aligned to the *end*
  when Tq != Tk, so that the last Tq positions of a sequence whose first Tk - Tq keys are
  cached (a key/value-cache decode) see what the full causal pass shows them. Tiles wholly
  above the diagonal are skipped.
- ``key_padding_mask``: bool (B, Tk), True where that key is padding and is ignored.
A row whose every key is masked gives a zero output (not NaN), ``lse`` = -inf, and zero
gradients. ``lse`` has the dtype of the inputs, float32 or float64.

The compiled backend (``_numba_attention``) runs the same algorithm, parallel over (batch,
head), with each tile's masking and exponentials fused in one pass; the NumPy code here is
its reference, ``attention_reference`` the naive whole-matrix one (which also takes an
explicit dropout multiplier, for the layer's attention dropout).
"""
from __future__ import annotations

import math

import numpy as np

from .backend import compiled

__all__ = ["attention_forward", "attention_backward", "attention_reference",
           "attention_reference_backward"]


def _fast():
    if compiled() is None:
        return None
    from . import _numba_attention
    return _numba_attention if _numba_attention.BLAS else None


def _check(q, k, v, key_padding_mask, block) -> tuple[int, int, int, int, int]:
    for name, a in (("q", q), ("k", k), ("v", v)):
        if a.ndim != 4:
            raise ValueError(f"attention: {name} must be (batch, heads, length, dim), got "
                             f"shape {a.shape}")
        if a.dtype not in (np.float32, np.float64):
            raise ValueError(f"attention: {name} must be float32 or float64, got {a.dtype}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"attention: q, k, v must share one dtype, got {q.dtype}, {k.dtype}, "
                         f"{v.dtype}; cast them first")
    b, h, tq, d = q.shape
    tk = k.shape[2]
    if k.shape != (b, h, tk, d) or v.shape[:3] != (b, h, tk):
        raise ValueError(f"attention: k {k.shape} and v {v.shape} must be (batch, heads, "
                         f"Tk, dim) matching q {q.shape}")
    if key_padding_mask is not None and (key_padding_mask.shape != (b, tk)
                                         or key_padding_mask.dtype != np.bool_):
        raise ValueError(f"attention: key_padding_mask must be bool (batch, Tk) = ({b}, "
                         f"{tk}), got {key_padding_mask.dtype} {key_padding_mask.shape}")
    if int(block) < 1:
        raise ValueError(f"attention: block must be a positive integer, got {block!r}")
    return b, h, tq, tk, d


def _scale(scale, d: int) -> float:
    return 1.0 / math.sqrt(d) if scale is None else float(scale)


def _first_row(causal: bool, j0: int, off: int) -> int:
    """The first query row that sees key j0 (all rows without the causal mask)."""
    return max(0, j0 - off) if causal else 0


def _mask_tile(s, i0, j0, j1, off, causal, key_padding_mask) -> None:
    """-inf where query i0+r may not see key j0+c, in place on the tile s (B, H, R, C)."""
    if causal and j1 - 1 > i0 + off:  # the tile crosses the diagonal
        rows = np.arange(i0, i0 + s.shape[2])[:, None] + off
        s[:, :, np.arange(j0, j1)[None, :] > rows] = -np.inf
    if key_padding_mask is not None:
        pad = key_padding_mask[:, j0:j1]
        if pad.any():
            np.copyto(s, -np.inf, where=pad[:, None, None, :])


def attention_forward(q: np.ndarray, k: np.ndarray, v: np.ndarray, *, causal: bool = False,
                      key_padding_mask: np.ndarray | None = None, scale: float | None = None,
                      block: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """``(o, lse)``: the attention output (B, H, Tq, Dv) and each row's log-sum-exp of
    scaled, masked scores (B, H, Tq), in q's dtype (the module doc gives the masks; a
    row with every key masked: o = 0, lse = -inf). ``scale`` defaults to 1/sqrt(D);
    ``block`` is the number of keys per tile."""
    b, h, tq, tk, d = _check(q, k, v, key_padding_mask, block)
    sc = _scale(scale, d)
    fast = _fast()
    if fast is not None:
        o = np.empty((b, h, tq, v.shape[3]), q.dtype)
        lse = np.empty((b, h, tq), q.dtype)
        fast.attention_forward(*_compiled_args(q, k, v, key_padding_mask), bool(causal),
                               sc, int(block), o, lse)
        return o, lse
    off = tk - tq
    dt = q.dtype
    m = np.full((b, h, tq), -np.inf, dt)
    l = np.zeros((b, h, tq), dt)
    acc = np.zeros((b, h, tq, v.shape[3]), dt)
    for j0 in range(0, tk, block):
        j1 = min(j0 + block, tk)
        i0 = _first_row(causal, j0, off)
        if i0 >= tq:
            break
        s = np.matmul(q[:, :, i0:], k[:, :, j0:j1].swapaxes(-1, -2))
        s *= dt.type(sc)
        _mask_tile(s, i0, j0, j1, off, causal, key_padding_mask)
        m_new = np.maximum(m[:, :, i0:], s.max(axis=-1))
        # rows with nothing seen yet keep m = -inf; subtracting 0 there keeps exp at 0
        shift = np.where(np.isfinite(m_new), m_new, dt.type(0))
        np.subtract(s, shift[..., None], out=s)
        p = np.exp(s, out=s)
        alpha = np.exp(m[:, :, i0:] - shift)
        l[:, :, i0:] = l[:, :, i0:] * alpha + p.sum(axis=-1)
        acc[:, :, i0:] *= alpha[..., None]
        acc[:, :, i0:] += np.matmul(p, v[:, :, j0:j1])
        m[:, :, i0:] = m_new
    seen = l > 0
    o = np.divide(acc, l[..., None], out=np.zeros_like(acc), where=seen[..., None])
    lse = np.full((b, h, tq), -np.inf, dt)
    np.add(m, np.log(l, out=np.zeros_like(l), where=seen), out=lse, where=seen)
    return o, lse


def attention_backward(q: np.ndarray, k: np.ndarray, v: np.ndarray, o: np.ndarray,
                       lse: np.ndarray, do: np.ndarray, *, causal: bool = False,
                       key_padding_mask: np.ndarray | None = None,
                       scale: float | None = None, block: int = 64
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(dq, dk, dv)`` of ``attention_forward`` given its ``o`` and ``lse`` and the
    output's gradient ``do``; the same masks, scale and block as the forward."""
    b, h, tq, tk, d = _check(q, k, v, key_padding_mask, block)
    if o.shape != do.shape or o.shape != (b, h, tq, v.shape[3]) or lse.shape != (b, h, tq):
        raise ValueError(f"attention_backward: o {o.shape}, do {do.shape} and lse "
                         f"{lse.shape} must be the forward's (B, H, Tq, Dv) and (B, H, Tq)")
    sc = _scale(scale, d)
    dt = q.dtype
    do = do.astype(dt, copy=False)
    drow = np.einsum("bhid,bhid->bhi", do, o.astype(dt, copy=False))
    # a row that saw no key: lse = -inf; +inf makes every recomputed probability 0
    lse_safe = np.where(np.isfinite(lse), lse, np.inf).astype(dt, copy=False)
    fast = _fast()
    if fast is not None:
        dq = np.empty_like(q, dtype=dt, order="C")
        dk = np.empty(k.shape, dt)
        dv = np.empty(v.shape, dt)
        fast.attention_backward(*_compiled_args(q, k, v, key_padding_mask),
                                np.ascontiguousarray(do), np.ascontiguousarray(lse_safe),
                                np.ascontiguousarray(drow), bool(causal), sc, int(block),
                                dq, dk, dv)
        return dq, dk, dv
    off = tk - tq
    dq = np.zeros(q.shape, dt)
    dk = np.zeros(k.shape, dt)
    dv = np.zeros(v.shape, dt)
    for j0 in range(0, tk, block):
        j1 = min(j0 + block, tk)
        i0 = _first_row(causal, j0, off)
        if i0 >= tq:
            break
        kb, vb, qi, doi = k[:, :, j0:j1], v[:, :, j0:j1], q[:, :, i0:], do[:, :, i0:]
        s = np.matmul(qi, kb.swapaxes(-1, -2))
        s *= dt.type(sc)
        _mask_tile(s, i0, j0, j1, off, causal, key_padding_mask)
        np.subtract(s, lse_safe[:, :, i0:, None], out=s)
        p = np.exp(s, out=s)
        dv[:, :, j0:j1] = np.matmul(p.swapaxes(-1, -2), doi)
        dp = np.matmul(doi, vb.swapaxes(-1, -2))
        np.subtract(dp, drow[:, :, i0:, None], out=dp)
        ds = np.multiply(p, dp, out=dp)
        ds *= dt.type(sc)
        dq[:, :, i0:] += np.matmul(ds, kb)
        dk[:, :, j0:j1] = np.matmul(ds.swapaxes(-1, -2), qi)
    return dq, dk, dv


def _compiled_args(q, k, v, key_padding_mask):
    pad = (np.zeros((0, 0), np.uint8) if key_padding_mask is None
           else np.ascontiguousarray(key_padding_mask).view(np.uint8))
    return (np.ascontiguousarray(q), np.ascontiguousarray(k), np.ascontiguousarray(v), pad)


# -- the naive reference: the whole score matrix ------------------------------------------
def attention_reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, *, causal: bool = False,
                        key_padding_mask: np.ndarray | None = None,
                        scale: float | None = None, dropout: np.ndarray | None = None
                        ) -> tuple[np.ndarray, np.ndarray]:
    """``(o, p)`` from the whole (B, H, Tq, Tk) matrix: p the softmax probabilities (a
    row with every key masked: all 0), o = (p * dropout) @ v. ``dropout``: an optional
    multiplier broadcast to p (a keep mask already divided by 1 - rate), as torch applies
    attention dropout after the softmax."""
    b, h, tq, tk, d = _check(q, k, v, key_padding_mask, 1)
    s = np.matmul(q, k.swapaxes(-1, -2)) * q.dtype.type(_scale(scale, d))
    _mask_tile(s, 0, 0, tk, tk - tq, causal, key_padding_mask)
    m = s.max(axis=-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(m), m, 0))
    tot = e.sum(axis=-1, keepdims=True)
    p = np.divide(e, tot, out=np.zeros_like(e), where=tot > 0)
    return np.matmul(p if dropout is None else p * dropout, v), p


def attention_reference_backward(q: np.ndarray, k: np.ndarray, v: np.ndarray, p: np.ndarray,
                                 do: np.ndarray, *, scale: float | None = None,
                                 dropout: np.ndarray | None = None
                                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(dq, dk, dv)`` of ``attention_reference`` from its probabilities ``p`` (the masks
    are in p: masked entries are 0 and get no gradient) and the same ``dropout``."""
    sc = q.dtype.type(_scale(scale, q.shape[3]))
    pd = p if dropout is None else p * dropout
    dv = np.matmul(pd.swapaxes(-1, -2), do)
    dp = np.matmul(do, v.swapaxes(-1, -2))
    if dropout is not None:
        dp *= dropout
    ds = p * (dp - np.sum(dp * p, axis=-1, keepdims=True)) * sc
    return np.matmul(ds, k), np.matmul(ds.swapaxes(-1, -2), q), dv
