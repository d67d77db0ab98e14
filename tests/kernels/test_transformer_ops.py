"""distnn.kernels.transformer_ops on both backends: the fused tanh GELU and layer norm
(forward and backward over rows) against float64 formulas written out here and against
torch's ``F.gelu(approximate="tanh")`` / ``F.layer_norm`` with autograd; both dtypes, 1 and
2 threads (the layer norm's parameter gradients are the same at every thread count)."""
from __future__ import annotations

import numpy as np
import pytest

from distnn.kernels.transformer_ops import (gelu_tanh_backward, gelu_tanh_forward,
                                            layer_norm_backward, layer_norm_forward)

TOL = {np.float32: 3e-5, np.float64: 1e-12}
SHAPES = [(1,), (7, 5), (3, 64, 512), (2, 4097)]


def _close(got, want, dtype):
    scale = max(1.0, float(np.max(np.abs(want))))
    np.testing.assert_allclose(got, want, rtol=TOL[dtype], atol=TOL[dtype] * scale)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_gelu_tanh_matches_torch(shape, dtype, threads):
    import torch
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(shape) * 3).astype(dtype)
    dy = rng.standard_normal(shape).astype(dtype)
    tx = torch.tensor(x.astype(np.float64), requires_grad=True)
    ty = torch.nn.functional.gelu(tx, approximate="tanh")
    ty.backward(torch.tensor(dy.astype(np.float64)))
    y = gelu_tanh_forward(x)
    dx = gelu_tanh_backward(x, dy)
    assert y.dtype == dtype and dx.dtype == dtype and y.shape == shape
    _close(y, ty.detach().numpy(), dtype)
    _close(dx, tx.grad.numpy(), dtype)


def test_float32_gelu_is_close_to_the_float64_formula_everywhere():
    """Every float32 input from -30 to 30 in steps of ~1e-4 (the tanh's two branches meet
    at |u| = 0.625; far out it saturates to 0 and x), against the float64 formula, and
    the same bits at 1 and 2 threads (each element is computed alone). The bound is
    float32's own: where tanh is near -1, 1 + tanh cancels (NumPy's float32 evaluation
    is 1.8e-6 off in the gradient there, the compiled one 1.6e-6)."""
    from distnn import kernels
    x = np.concatenate([np.linspace(-30, 30, 600_001), [0.0, -0.0, 1e-30, -1e-30]])
    x = x.astype(np.float32)
    dy = np.full_like(x, 1.5)
    xd = x.astype(np.float64)
    u = np.sqrt(2 / np.pi) * (xd + 0.044715 * xd ** 3)
    th = np.tanh(u)
    want = 0.5 * xd * (1 + th)
    dwant = 1.5 * (0.5 * (1 + th) + 0.5 * xd * (1 - th ** 2) * np.sqrt(2 / np.pi)
                   * (1 + 3 * 0.044715 * xd ** 2))
    out = []
    previous = kernels.get_num_threads()
    try:
        for n in (1, 2):
            kernels.set_num_threads(n)
            out.append((gelu_tanh_forward(x), gelu_tanh_backward(x, dy)))
    finally:
        kernels.set_num_threads(previous)
    for got, ref in zip(out[0], (want, dwant)):
        np.testing.assert_allclose(got, ref, rtol=2e-6, atol=2.5e-6)
    for a, b in zip(*out):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("rows,d", [(1, 1), (5, 3), (1024, 128), (33, 257)])
def test_layer_norm_matches_torch(rows, d, dtype, threads):
    import torch
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((rows, d)) * 2 + 0.5).astype(dtype)
    gamma = rng.standard_normal(d).astype(dtype)
    beta = rng.standard_normal(d).astype(dtype)
    dy = rng.standard_normal((rows, d)).astype(dtype)
    t = {k: torch.tensor(v.astype(np.float64), requires_grad=True)
         for k, v in (("x", x), ("g", gamma), ("b", beta))}
    ty = torch.nn.functional.layer_norm(t["x"], (d,), t["g"], t["b"], eps=1e-5)
    ty.backward(torch.tensor(dy.astype(np.float64)))
    y, xhat, invstd = layer_norm_forward(x, gamma, beta, 1e-5)
    dx, dgamma, dbeta = layer_norm_backward(dy, xhat, invstd, gamma)
    assert y.dtype == dx.dtype == dgamma.dtype == dtype
    _close(y, ty.detach().numpy(), dtype)
    _close(dx, t["x"].grad.numpy(), dtype)
    _close(dgamma, t["g"].grad.numpy(), dtype)
    _close(dbeta, t["b"].grad.numpy(), dtype)


def test_layer_norm_gradients_do_not_depend_on_threads():
    from distnn import kernels
    rng = np.random.default_rng(2)
    x, dy = rng.standard_normal((2, 300, 64)).astype(np.float32)
    gamma = rng.standard_normal(64).astype(np.float32)
    out = []
    previous = kernels.get_num_threads()
    try:
        for n in (1, 2):
            kernels.set_num_threads(n)
            _, xhat, invstd = layer_norm_forward(x, gamma, np.zeros(64, np.float32), 1e-5)
            out.append(layer_norm_backward(dy, xhat, invstd, gamma))
    finally:
        kernels.set_num_threads(previous)
    for a, b in zip(*out):
        np.testing.assert_array_equal(a, b)


def test_rows_are_checked():
    x = np.ones((2, 3, 4), np.float32)
    with pytest.raises(ValueError, match=r"layer_norm_forward: x must be rows \(R, D\)"):
        layer_norm_forward(x, np.ones(4), np.zeros(4), 1e-5)
    with pytest.raises(ValueError, match="float32 or float64, got int64"):
        gelu_tanh_forward(np.arange(3))
    with pytest.raises(ValueError, match="dy .* must have x's shape"):
        gelu_tanh_backward(np.ones(3), np.ones(4))
