"""MaxPool2D, AvgPool2D, GlobalAvgPool2D: shapes, gradient checks, agreement with torch."""
import numpy as np
import pytest

from distnn.nn.pooling import AvgPool2D, GlobalAvgPool2D, MaxPool2D
from gradcheck import check_layer

pytestmark = pytest.mark.usefixtures("kernel_backend")

RNG = np.random.default_rng(0)


def built(layer, shape, dtype=np.float64, seed=0):
    layer.build(shape, rng=np.random.default_rng(seed), dtype=dtype)
    return layer


def distinct(shape):
    """Random values with no near-ties, so max pooling is differentiable everywhere."""
    x = RNG.permutation(int(np.prod(shape))).astype(np.float64).reshape(shape)
    return x / x.size + 0.01 * RNG.standard_normal(shape) / x.size


@pytest.mark.parametrize("cls", [MaxPool2D, AvgPool2D])
@pytest.mark.parametrize("kwargs,in_shape,out_shape", [
    (dict(), (8, 24, 24), (8, 12, 12)),
    (dict(pool_size=2), (2, 5, 7), (2, 2, 3)),
    (dict(pool_size=3, strides=2), (2, 13, 13), (2, 6, 6)),
    (dict(pool_size=3, strides=2, padding=1), (2, 112, 112), (2, 56, 56)),
    (dict(pool_size=(2, 3), strides=(1, 2), padding=(1, 0)), (1, 4, 7), (1, 5, 3)),
])
def test_output_shape(cls, kwargs, in_shape, out_shape):
    layer = built(cls(**kwargs), in_shape, dtype=np.float32)
    assert layer.output_shape == out_shape and not layer.params
    y = layer.forward(RNG.standard_normal((2,) + in_shape).astype(np.float32))
    assert y.shape == (2,) + out_shape and y.dtype == np.float32


OPTIONS = [dict(), dict(pool_size=3), dict(pool_size=3, strides=2),
           dict(pool_size=3, strides=1, padding=1), dict(pool_size=(2, 3), strides=(1, 2)),
           dict(pool_size=2, strides=1, padding=(1, 0))]


@pytest.mark.parametrize("cls", [MaxPool2D, AvgPool2D])
@pytest.mark.parametrize("opts", OPTIONS, ids=[str(o) for o in OPTIONS])
@pytest.mark.parametrize("hw", [(6, 6), (5, 7)])
def test_gradients(cls, opts, hw):
    layer = built(cls(**opts), (2,) + hw)
    check_layer(layer, distinct((2, 2) + hw))


def test_global_avgpool_shape_and_gradient():
    layer = built(GlobalAvgPool2D(), (3, 4, 5))
    assert layer.output_shape == (3,)
    x = RNG.standard_normal((2, 3, 4, 5))
    assert layer.forward(x).shape == (2, 3)
    check_layer(layer, x)


def test_first_layer_returns_none():
    for layer in (built(MaxPool2D(), (1, 4, 4)), built(AvgPool2D(), (1, 4, 4)),
                  built(GlobalAvgPool2D(), (1, 4, 4))):
        layer.need_dx = False
        y = layer.forward(RNG.standard_normal((2, 1, 4, 4)))
        assert layer.backward(np.ones_like(y)) is None


@pytest.mark.parametrize("layer", [MaxPool2D(), MaxPool2D(3, 2, 1), AvgPool2D(3, 1, 1),
                                   GlobalAvgPool2D()], ids=str)
def test_empty_batch(layer):
    built(layer, (2, 6, 6), dtype=np.float32)
    y = layer.forward(np.zeros((0, 2, 6, 6), np.float32))
    assert y.shape == (0,) + layer.output_shape
    assert layer.backward(y).shape == (0, 2, 6, 6)


def test_errors():
    layer = built(MaxPool2D(name="pool_a"), (2, 4, 4))
    with pytest.raises(ValueError, match=r"pool_a.*expects input of shape \(batch, 2, 4, 4\)"):
        layer.forward(np.zeros((1, 2, 4, 5)))
    with pytest.raises(ValueError, match="at most half"):
        MaxPool2D(2, padding=2)
    with pytest.raises(ValueError, match="pool_size"):
        AvgPool2D(0)
    with pytest.raises(ValueError, match="pool_b.*smaller than"):
        built(MaxPool2D(3, name="pool_b"), (1, 2, 2))
    with pytest.raises(ValueError, match="pool_c.*needs per-sample input"):
        built(GlobalAvgPool2D(name="pool_c"), (4,))


def test_describe():
    assert MaxPool2D().describe() == "2"
    assert MaxPool2D(3, strides=2, padding=1).describe() == "3, strides=2, padding=1"
    assert AvgPool2D((2, 3)).describe() == "2x3"


TORCH_CASES = [dict(), dict(pool_size=3, strides=2), dict(pool_size=3, strides=2, padding=1),
               dict(pool_size=(2, 3), strides=(1, 2), padding=(1, 1)), dict(pool_size=2, strides=1)]


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-5), (np.float32, 1e-4)])
@pytest.mark.parametrize("opts", TORCH_CASES, ids=[str(o) for o in TORCH_CASES])
@pytest.mark.parametrize("kind", ["max", "avg"])
def test_matches_torch(kind, opts, dtype, tol):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    layer = built((MaxPool2D if kind == "max" else AvgPool2D)(**opts), (3, 10, 9), dtype=dtype)
    x = RNG.standard_normal((2, 3, 10, 9)).astype(dtype)
    x[0, 0, :4, :4] = 1.5  # a tied plateau: the gradient must go where torch sends it
    y = layer.forward(x, training=True)
    dy = RNG.standard_normal(y.shape).astype(dtype)
    dx = layer.backward(dy)
    xt = torch.tensor(x, requires_grad=True)
    args = dict(kernel_size=layer.pool_size, stride=layer.strides, padding=layer.padding)
    yt = F.max_pool2d(xt, **args) if kind == "max" else \
        F.avg_pool2d(xt, count_include_pad=True, **args)
    yt.backward(torch.tensor(dy))
    np.testing.assert_allclose(y, yt.detach().numpy(), rtol=tol, atol=tol)
    np.testing.assert_allclose(dx, xt.grad.numpy(), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-5), (np.float32, 1e-4)])
def test_global_avgpool_matches_torch(dtype, tol):
    torch = pytest.importorskip("torch")
    layer = built(GlobalAvgPool2D(), (3, 5, 6), dtype=dtype)
    x = RNG.standard_normal((2, 3, 5, 6)).astype(dtype)
    y = layer.forward(x)
    dy = RNG.standard_normal(y.shape).astype(dtype)
    dx = layer.backward(dy)
    xt = torch.tensor(x, requires_grad=True)
    yt = torch.nn.functional.adaptive_avg_pool2d(xt, 1).flatten(1)
    yt.backward(torch.tensor(dy))
    np.testing.assert_allclose(y, yt.detach().numpy(), rtol=tol, atol=tol)
    np.testing.assert_allclose(dx, xt.grad.numpy(), rtol=tol, atol=tol)
