"""The layers a transformer applies token by token: GELU (exact and tanh) and SiLU, Dense
over the last axis of any rank; gradient checks, torch parity, ONNX in onnxruntime."""
import math

import numpy as np
import pytest

from distnn.nn import GELU, Dense, Sequential, SiLU
from distnn.nn.activations import normal_cdf
from gradcheck import check_layer
from parity import onnx_matches, torch_export_matches, torch_parity

RNG = np.random.default_rng(0)
ACTS = [lambda: GELU(), lambda: GELU(approximate="tanh"), lambda: SiLU()]


def built(layer, shape, dtype=np.float64, seed=0):
    layer.build(shape, rng=np.random.default_rng(seed), dtype=dtype)
    return layer


def test_normal_cdf_against_math_erf():
    x = np.concatenate([np.linspace(-40, 40, 4001), RNG.standard_normal(2000)])
    want = np.array([0.5 * math.erfc(-v / math.sqrt(2)) for v in x])
    # relative error 1e-14 near 0, 3e-13 in the far tail (z*z rounded before exp)
    np.testing.assert_allclose(normal_cdf(x.copy()), want, rtol=5e-13, atol=1e-290)
    got32 = normal_cdf(x.astype(np.float32))
    assert got32.dtype == np.float32
    np.testing.assert_allclose(got32, want, rtol=0, atol=5e-7)


@pytest.mark.parametrize("make", ACTS, ids=["gelu", "gelu_tanh", "silu"])
@pytest.mark.parametrize("shape", [(6,), (4, 6)])
def test_activation_shapes_and_gradients(make, shape):
    layer = built(make(), shape)
    x = 2.5 * RNG.standard_normal((3,) + shape)
    assert layer.forward(x).shape == x.shape
    check_layer(layer, x)
    y32 = built(make(), shape, dtype=np.float32).forward(x.astype(np.float32))
    assert y32.dtype == np.float32


@pytest.mark.parametrize("make", ACTS, ids=["gelu", "gelu_tanh", "silu"])
def test_activations_match_torch(make):
    pytest.importorskip("torch")
    layer = built(make(), (5, 8))
    x = 4.0 * RNG.standard_normal((3, 5, 8))
    torch_parity(layer, x, {}, tol=1e-12)


def test_gelu_option_error():
    with pytest.raises(ValueError, match="approximate must be 'none' or 'tanh'"):
        GELU("erf")


@pytest.mark.parametrize("use_bias", [True, False])
@pytest.mark.parametrize("shape", [(5,), (4, 5), (2, 3, 5)])
def test_dense_over_last_axis(use_bias, shape):
    layer = built(Dense(3, use_bias=use_bias), shape)
    assert layer.output_shape == shape[:-1] + (3,)
    x = RNG.standard_normal((2,) + shape)
    y = layer.forward(x)
    assert y.shape == (2,) + shape[:-1] + (3,)
    np.testing.assert_allclose(y, x @ layer.params["w"] + (layer.params["b"] if use_bias else 0))
    check_layer(layer, x)


@pytest.mark.parametrize("use_bias", [True, False])
def test_dense_nd_matches_torch_linear(use_bias):
    pytest.importorskip("torch")
    layer = built(Dense(4, use_bias=use_bias), (3, 6))
    grads = {"w": ("weight", lambda g: g.T)}
    if use_bias:
        grads["b"] = ("bias", lambda g: g)
    torch_parity(layer, RNG.standard_normal((2, 3, 6)), grads)


def test_dense_2d_path_unchanged():
    """(N, in) input is one matrix product, the same bits as before N-D input was taken."""
    layer = built(Dense(7), (9,), dtype=np.float32)
    x = RNG.standard_normal((16, 9)).astype(np.float32)
    y = layer.forward(x)
    want = np.matmul(x, layer.params["w"])
    want += layer.params["b"]
    np.testing.assert_array_equal(y, want)
    dy = RNG.standard_normal(y.shape).astype(np.float32)
    dx = layer.backward(dy)
    np.testing.assert_array_equal(dx, np.matmul(dy, layer.params["w"].T))
    np.testing.assert_array_equal(layer.grads["w"], np.matmul(x.T, dy))


def test_export_of_token_layers():
    pytest.importorskip("onnxruntime")
    pytest.importorskip("torch")
    model = Sequential([Dense(8), GELU(), Dense(8, use_bias=False), GELU("tanh"), Dense(6),
                        SiLU(), Dense(3)], input_shape=(4, 5), dtype=np.float64, rng=0)
    x = RNG.standard_normal((3, 4, 5))
    ops = onnx_matches(model, x)
    assert {"Erf", "Tanh", "Sigmoid", "MatMul"} <= set(ops) and "Gemm" not in ops
    torch_export_matches(model, x)
    flat = Sequential([Dense(4), GELU()], input_shape=(5,), dtype=np.float64, rng=0)
    assert "Gemm" in onnx_matches(flat, RNG.standard_normal((2, 5)))
