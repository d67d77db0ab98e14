"""Element-wise kernels of the transformer blocks: the tanh GELU (GPT-2's) and the layer
norm over the last axis, forward and backward.

The NumPy code here is the reference; with the compiled backend (``_numba_transformer``)
the layer norm and the float32 GELU are one fused pass over memory each. The NumPy GELU
works in place on one temporary (2.4x faster than the textbook expression: 7 ms against
17 ms for 16x64x512 float32, 1 thread), and stays the float64 path on both backends; the
backward recomputes tanh from x instead of keeping it (one array fewer held per block
between the passes). The layer norm works on
rows (R, D): ``center=False`` is RMSNorm's form (no mean removed, no beta).

    y = gelu_tanh_forward(x);  dx = gelu_tanh_backward(x, dy)
    y, xhat, invstd = layer_norm_forward(x2, gamma, beta, eps)
    dx, dgamma, dbeta = layer_norm_backward(dy2, xhat, invstd, gamma)
"""
from __future__ import annotations

import math

import numpy as np

from .backend import compiled

__all__ = ["gelu_tanh_forward", "gelu_tanh_backward", "layer_norm_forward",
           "layer_norm_backward"]

_C = math.sqrt(2.0 / math.pi)
_K = 0.044715


def _fast():
    if compiled() is None:
        return None
    from . import _numba_transformer
    return _numba_transformer


def _float(name: str, a: np.ndarray) -> np.ndarray:
    if a.dtype not in (np.float32, np.float64):
        raise ValueError(f"{name} must be float32 or float64, got {a.dtype}")
    return np.ascontiguousarray(a)


def gelu_tanh_forward(x: np.ndarray) -> np.ndarray:
    """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), a new array of x's shape and dtype."""
    x = _float("gelu_tanh_forward: x", x)
    fast = _fast()
    if fast is not None and x.dtype == np.float32:
        y = np.empty_like(x)
        fast.gelu_tanh_forward(x.reshape(-1), y.reshape(-1))
        return y
    t = x.dtype.type
    u = x * x
    u *= x
    u *= t(_K)
    u += x
    u *= t(_C)
    np.tanh(u, out=u)
    u += 1
    u *= x
    u *= t(0.5)
    return u


def gelu_tanh_backward(x: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """dy times the derivative of ``gelu_tanh_forward`` at x."""
    x = _float("gelu_tanh_backward: x", x)
    dy = _float("gelu_tanh_backward: dy", dy).astype(x.dtype, copy=False)
    if dy.shape != x.shape:
        raise ValueError(f"gelu_tanh_backward: dy {dy.shape} must have x's shape {x.shape}")
    fast = _fast()
    if fast is not None and x.dtype == np.float32:
        dx = np.empty_like(x)
        fast.gelu_tanh_backward(x.reshape(-1), dy.reshape(-1), dx.reshape(-1))
        return dx
    t = x.dtype.type
    x2 = x * x
    th = x2 * t(_K)
    th += 1
    th *= x
    th *= t(_C)
    np.tanh(th, out=th)
    # d/dx = 0.5 (1 + th) + 0.5 x (1 - th^2) C (1 + 3 K x^2)
    x2 *= t(3 * _K)
    x2 += 1
    x2 *= t(_C)
    x2 *= x
    x2 *= t(0.5)
    sech2 = th * th
    np.subtract(1, sech2, out=sech2)
    sech2 *= x2
    th += 1
    th *= t(0.5)
    th += sech2
    th *= dy
    return th


def _rows(name: str, a: np.ndarray) -> np.ndarray:
    a = _float(name, a)
    if a.ndim != 2:
        raise ValueError(f"{name} must be rows (R, D), got shape {a.shape}")
    return a


def layer_norm_forward(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray | None,
                       eps: float, center: bool = True
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(y, xhat, invstd)`` of rows x (R, D): xhat = (x - mean) * invstd (no mean when
    ``center`` is False), invstd = 1 / sqrt(var + eps) (R,), y = xhat * gamma + beta."""
    x = _rows("layer_norm_forward: x", x)
    dt = x.dtype
    d = x.shape[1]
    gamma = np.ascontiguousarray(gamma, dtype=dt)
    beta = np.zeros(d, dt) if beta is None else np.ascontiguousarray(beta, dtype=dt)
    fast = _fast()
    if fast is not None and center:
        y, xhat = np.empty_like(x), np.empty_like(x)
        invstd = np.empty(x.shape[0], dt)
        fast.layer_norm_forward(x, gamma, beta, float(eps), y, xhat, invstd)
        return y, xhat, invstd
    xc = x - x.mean(axis=1, keepdims=True) if center else x
    invstd = 1.0 / np.sqrt(np.mean(xc * xc, axis=1) + dt.type(eps))
    xhat = xc * invstd[:, None]
    return xhat * gamma + beta, xhat, invstd.astype(dt, copy=False)


def layer_norm_backward(dy: np.ndarray, xhat: np.ndarray, invstd: np.ndarray,
                        gamma: np.ndarray, center: bool = True
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(dx, dgamma, dbeta)`` of ``layer_norm_forward`` from its ``xhat``, ``invstd``
    and the output's gradient dy (R, D)."""
    dy = _rows("layer_norm_backward: dy", dy)
    xhat = _rows("layer_norm_backward: xhat", xhat)
    if dy.shape != xhat.shape or invstd.shape != dy.shape[:1]:
        raise ValueError(f"layer_norm_backward: dy {dy.shape}, xhat {xhat.shape} and invstd "
                         f"{invstd.shape} must be the forward's (R, D), (R, D), (R,)")
    dt = xhat.dtype
    dy = dy.astype(dt, copy=False)
    gamma = np.ascontiguousarray(gamma, dtype=dt)
    fast = _fast()
    if fast is not None:
        d = dy.shape[1]
        dx = np.empty_like(dy)
        dg = np.empty((fast.PARTS, d), dt)
        db = np.empty((fast.PARTS, d), dt)
        fast.layer_norm_backward(dy, xhat, np.ascontiguousarray(invstd, dtype=dt), gamma,
                                 bool(center), dx, dg, db)
        return dx, dg.sum(axis=0), db.sum(axis=0)
    dgamma = np.sum(dy * xhat, axis=0)
    dbeta = np.sum(dy, axis=0)
    g = dy * gamma
    proj = np.mean(g * xhat, axis=1, keepdims=True)
    if center:
        return invstd[:, None] * (g - g.mean(axis=1, keepdims=True) - xhat * proj), dgamma, dbeta
    return invstd[:, None] * (g - xhat * proj), dgamma, dbeta
