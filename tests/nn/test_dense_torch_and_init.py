"""Dense against torch.nn.functional.linear; initializer statistics; float32/float64 models."""
import numpy as np
import pytest

from distnn.models import get_model
from distnn.nn.core import Dense
from distnn.nn.init import INITIALIZERS, get_initializer


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-5), (np.float32, 1e-4)])
@pytest.mark.parametrize("use_bias", [True, False])
def test_dense_matches_torch(dtype, tol, use_bias):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    layer = Dense(7, use_bias=use_bias)
    layer.build((5,), rng=rng, dtype=dtype)
    if use_bias:
        layer.params["b"][...] = rng.standard_normal(7)
    x = rng.standard_normal((4, 5)).astype(dtype)
    dy = rng.standard_normal((4, 7)).astype(dtype)
    y = layer.forward(x, training=True)
    dx = layer.backward(dy)
    tx = torch.tensor(x, requires_grad=True)
    tw = torch.tensor(layer.params["w"].T.copy(), requires_grad=True)
    tb = torch.tensor(layer.params["b"], requires_grad=True) if use_bias else None
    ty = torch.nn.functional.linear(tx, tw, tb)
    ty.backward(torch.tensor(dy))
    np.testing.assert_allclose(y, ty.detach().numpy(), rtol=tol, atol=tol)
    np.testing.assert_allclose(dx, tx.grad.numpy(), rtol=tol, atol=tol)
    np.testing.assert_allclose(layer.grads["w"], tw.grad.numpy().T, rtol=tol, atol=tol)
    if use_bias:
        np.testing.assert_allclose(layer.grads["b"], tb.grad.numpy(), rtol=tol, atol=tol)


@pytest.mark.parametrize("name,expected_std", [
    ("glorot_uniform", np.sqrt(2 / (300 + 200))), ("glorot_normal", np.sqrt(2 / (300 + 200))),
    ("he_uniform", np.sqrt(2 / 300)), ("he_normal", np.sqrt(2 / 300)),
])
def test_initializer_statistics(name, expected_std):
    w = get_initializer(name)((300, 200), 300, 200, np.random.default_rng(0), np.float32)
    assert w.dtype == np.float32 and w.shape == (300, 200)
    assert abs(w.mean()) < 0.01 * expected_std * 10
    assert w.std() == pytest.approx(expected_std, rel=0.02)
    if "uniform" in name:
        assert np.abs(w).max() <= np.sqrt(3) * expected_std + 1e-6


def test_constant_initializers_and_errors():
    rng = np.random.default_rng(0)
    assert np.all(INITIALIZERS["zeros"]((3,), 1, 1, rng, np.float64) == 0)
    assert np.all(INITIALIZERS["ones"]((3,), 1, 1, rng, np.float64) == 1)
    with pytest.raises(ValueError, match="he_uniform"):
        get_initializer("he_unifrom")


def test_same_seed_same_weights_and_float64_end_to_end():
    a = get_model("lenet", rng=7, dtype=np.float64)
    b = get_model("lenet", rng=7, dtype=np.float64)
    np.testing.assert_array_equal(a.parameters_flat(), b.parameters_flat())
    x = np.random.default_rng(0).random((3, 1, 28, 28))
    y = a.forward(x, training=True)
    assert y.dtype == np.float64
    a.backward(np.ones_like(y))
    assert a.gradients_flat().dtype == np.float64
