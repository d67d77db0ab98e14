"""Conv2D: shapes, options, gradient checks, agreement with torch."""
import numpy as np
import pytest

from distnn.nn.containers import Sequential
from distnn.nn.conv import Conv2D
from distnn.nn.core import Flatten
from gradcheck import check_layer

pytestmark = pytest.mark.usefixtures("kernel_backend")

RNG = np.random.default_rng(0)


def built(layer, shape, dtype=np.float64, seed=0):
    layer.build(shape, rng=np.random.default_rng(seed), dtype=dtype)
    return layer


@pytest.mark.parametrize("kwargs,in_shape,out_shape", [
    (dict(filters=4, kernel_size=3), (1, 28, 28), (4, 26, 26)),
    (dict(filters=2, kernel_size=3, padding="valid"), (3, 7, 9), (2, 5, 7)),
    (dict(filters=2, kernel_size=3, padding="same"), (3, 7, 9), (2, 7, 9)),
    (dict(filters=2, kernel_size=3, strides=2, padding="same"), (3, 7, 9), (2, 4, 5)),
    (dict(filters=2, kernel_size=(2, 4), strides=(1, 3), padding="same"), (1, 6, 8), (2, 6, 3)),
    (dict(filters=2, kernel_size=3, padding=(1, 2)), (1, 5, 5), (2, 5, 7)),
    (dict(filters=2, kernel_size=3, dilation=2), (1, 9, 8), (2, 5, 4)),
    (dict(filters=2, kernel_size=3, dilation=2, padding="same"), (1, 9, 8), (2, 9, 8)),
    (dict(filters=5, kernel_size=11, strides=4), (3, 227, 227), (5, 55, 55)),
])
def test_output_shape(kwargs, in_shape, out_shape):
    layer = built(Conv2D(**kwargs), in_shape, dtype=np.float32)
    assert layer.output_shape == out_shape
    c = in_shape[0]
    kh, kw = (kwargs["kernel_size"],) * 2 if np.isscalar(kwargs["kernel_size"]) \
        else kwargs["kernel_size"]
    assert layer.params["w"].shape == (kwargs["filters"], c, kh, kw)
    assert layer.params["b"].shape == (kwargs["filters"],)
    if np.prod(in_shape) < 5000:
        y = layer.forward(RNG.standard_normal((2,) + in_shape).astype(np.float32))
        assert y.shape == (2,) + out_shape and y.dtype == np.float32


def test_he_uniform_fan_in_and_bias_zero():
    layer = built(Conv2D(8, 3), (4, 6, 6))
    limit = np.sqrt(6.0 / (4 * 9))
    w = layer.params["w"]
    assert np.abs(w).max() <= limit and np.abs(w).max() > 0.8 * limit
    np.testing.assert_array_equal(layer.params["b"], 0)


OPTIONS = [
    dict(),
    dict(use_bias=False),
    dict(strides=2),
    dict(strides=(1, 2), padding=1),
    dict(padding=(2, 1)),
    dict(padding="same"),
    dict(padding="same", strides=2),
    dict(padding="valid", kernel_size=(2, 3)),
    dict(dilation=2),
    dict(dilation=(2, 1), padding="same"),
    dict(kernel_size=1, strides=2),
]


@pytest.mark.parametrize("opts", OPTIONS, ids=[str(o) for o in OPTIONS])
def test_gradients(opts):
    opts = dict(opts)
    layer = built(Conv2D(3, opts.pop("kernel_size", 3), **opts,
                         bias_initializer="glorot_uniform"), (2, 6, 5))
    check_layer(layer, RNG.standard_normal((2, 2, 6, 5)))
    assert set(layer.grads) == ({"w"} if opts.get("use_bias") is False else {"w", "b"})


def test_first_layer_skips_dx():
    layer = built(Conv2D(3, 3, padding=1), (1, 5, 5))
    layer.need_dx = False
    errors = check_layer(layer, RNG.standard_normal((2, 1, 5, 5)))
    assert "dx" not in errors and set(errors) == {"w", "b"}


def test_inside_model_grads_stay_views_of_the_flat_buffer():
    model = Sequential([Conv2D(2, 3, name="c1"), Conv2D(3, 3, padding="same", name="c2"),
                        Flatten()], input_shape=(1, 6, 6), dtype=np.float64, rng=0)
    x = RNG.standard_normal((4, 1, 6, 6))
    for _ in range(2):
        y = model.forward(x, training=True)
        assert model.backward(np.ones_like(y)) is None  # first layer: no dx
    flat = model.gradients_flat()
    for layer in model.layers[:2]:
        for g in layer.grads.values():
            assert np.shares_memory(g, flat)
    assert np.abs(flat).sum() > 0
    # the same numbers as a stand-alone layer
    c2 = model.layers[1]
    ref = built(Conv2D(3, 3, padding="same"), (2, 4, 4))
    ref.params["w"][...] = c2.params["w"]
    ref.params["b"][...] = c2.params["b"]
    h = model.layers[0].forward(x)
    ref.forward(h)
    ref.backward(np.ones((4, 3, 4, 4)))
    np.testing.assert_allclose(c2.grads["w"], ref.grads["w"])


DIRECT_CASES = [  # the model zoo's few-channel stride-1 convolutions, scaled down
    dict(filters=4, kernel_size=3, padding=1, shape=(1, 7, 6)),     # simplecnn_pydtnn 1
    dict(filters=8, kernel_size=3, padding=1, shape=(4, 6, 5)),     # simplecnn_pydtnn 2
    dict(filters=6, kernel_size=5, padding=2, shape=(1, 6, 7)),     # lenet 1
    dict(filters=5, kernel_size=3, padding="same", shape=(3, 6, 6)),  # resnet20 1
    dict(filters=3, kernel_size=(2, 4), dilation=(2, 1), padding=(3, 1), shape=(2, 5, 6)),
]


@pytest.mark.parametrize("opts", DIRECT_CASES, ids=str)
def test_gradients_few_channels(opts, kernel_backend):
    """On the compiled backend these layers run the direct kernels (no im2col)."""
    opts = dict(opts)
    shape = opts.pop("shape")
    layer = built(Conv2D(**opts, bias_initializer="glorot_uniform"), shape)
    x = RNG.standard_normal((3,) + shape)
    layer.forward(x, training=True)
    assert layer._cache.direct == (kernel_backend == "numba")
    errors = check_layer(layer, x)
    assert set(errors) == {"dx", "w", "b"}


@pytest.mark.parametrize("strides", [1, 2, (2, 3)])
def test_gradients_1x1(strides, kernel_backend):
    """On the compiled backend 1x1 layers run as a strided slice + GEMMs (no im2col)."""
    layer = built(Conv2D(3, 1, strides=strides, bias_initializer="glorot_uniform"),
                  (4, 7, 6))
    x = RNG.standard_normal((3, 4, 7, 6))
    layer.forward(x, training=True)
    assert layer._cache.pointwise == (kernel_backend == "numba")
    assert set(check_layer(layer, x)) == {"dx", "w", "b"}


def test_float32_end_to_end():
    layer = built(Conv2D(4, 3, padding="same"), (3, 8, 8), dtype=np.float32)
    x = RNG.standard_normal((2, 3, 8, 8)).astype(np.float32)
    y = layer.forward(x, training=True)
    dx = layer.backward(np.ones_like(y))
    assert y.dtype == dx.dtype == np.float32
    assert layer.grads["w"].dtype == np.float32


@pytest.mark.parametrize("opts", [dict(), dict(strides=2, padding="same")], ids=str)
def test_empty_batch(opts):
    layer = built(Conv2D(3, 3, **opts), (2, 5, 5), dtype=np.float32)
    y = layer.forward(np.zeros((0, 2, 5, 5), np.float32))
    assert y.shape == (0,) + layer.output_shape
    assert layer.backward(y).shape == (0, 2, 5, 5)
    np.testing.assert_array_equal(layer.grads["w"], 0)


def test_errors():
    layer = built(Conv2D(2, 3, name="conv_a"), (1, 5, 5))
    with pytest.raises(ValueError, match=r"conv_a.*expects input of shape \(batch, 1, 5, 5\).*"
                                         r"\(2, 1, 6, 5\)"):
        layer.forward(np.zeros((2, 1, 6, 5)))
    with pytest.raises(ValueError, match="conv_b.*needs per-sample input"):
        built(Conv2D(2, 3, name="conv_b"), (25,))
    with pytest.raises(ValueError, match="conv_c.*smaller than"):
        built(Conv2D(2, 5, name="conv_c"), (1, 3, 3))
    with pytest.raises(ValueError, match="filters"):
        Conv2D(0, 3)
    with pytest.raises(ValueError, match="kernel_size"):
        Conv2D(2, (3, 0))
    with pytest.raises(ValueError, match="padding"):
        Conv2D(2, 3, padding="full")
    with pytest.raises(ValueError, match="strides"):
        Conv2D(2, 3, strides=(1, 2, 3))
    with pytest.raises(RuntimeError, match="before forward"):
        built(Conv2D(2, 3), (1, 5, 5)).backward(np.zeros((1, 2, 3, 3)))


def test_describe():
    assert Conv2D(4, 3).describe() == "4, 3x3"
    assert Conv2D(4, (3, 5), strides=2, padding="same", dilation=(1, 2),
                  use_bias=False).describe() == \
        "4, 3x5, strides=2, padding=same, dilation=1x2, use_bias=False"


TORCH_CASES = [
    dict(kernel_size=3),
    dict(kernel_size=3, padding=1, strides=2),
    dict(kernel_size=(3, 2), padding=(1, 0), dilation=(1, 2)),
    dict(kernel_size=3, padding="same", strides=2),  # asymmetric: bottom/right get the extra
    dict(kernel_size=4, padding="same"),
    dict(kernel_size=5, strides=3, use_bias=False),
]


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-5), (np.float32, 1e-4)])
@pytest.mark.parametrize("opts", TORCH_CASES, ids=[str(o) for o in TORCH_CASES])
def test_matches_torch(opts, dtype, tol):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    opts = dict(opts)
    layer = built(Conv2D(5, opts.pop("kernel_size"), **opts,
                         bias_initializer="he_uniform"), (3, 11, 10), dtype=dtype)
    x = RNG.standard_normal((4, 3, 11, 10)).astype(dtype)
    y = layer.forward(x, training=True)
    dy = RNG.standard_normal(y.shape).astype(dtype)
    dx = layer.backward(dy)

    pt, pb, pl, pr = layer._pads
    xt = torch.tensor(x, requires_grad=True)
    wt = torch.tensor(layer.params["w"], requires_grad=True)
    bt = torch.tensor(layer.params["b"], requires_grad=True) if layer.use_bias else None
    yt = F.conv2d(F.pad(xt, (pl, pr, pt, pb)), wt, bt, stride=layer.strides,
                  dilation=layer.dilation)
    yt.backward(torch.tensor(dy))
    close = dict(rtol=tol, atol=tol)
    np.testing.assert_allclose(y, yt.detach().numpy(), **close)
    np.testing.assert_allclose(dx, xt.grad.numpy(), **close)
    np.testing.assert_allclose(layer.grads["w"], wt.grad.numpy(), **close)
    if layer.use_bias:
        np.testing.assert_allclose(layer.grads["b"], bt.grad.numpy(), **close)


@pytest.mark.filterwarnings("ignore:Using padding=.same.")
def test_same_padding_matches_torch_same_for_stride_1():
    torch = pytest.importorskip("torch")
    layer = built(Conv2D(2, 4, padding="same"), (1, 7, 7))
    x = RNG.standard_normal((1, 1, 7, 7))
    yt = torch.nn.functional.conv2d(torch.tensor(x), torch.tensor(layer.params["w"]),
                                    torch.tensor(layer.params["b"]), padding="same")
    np.testing.assert_allclose(layer.forward(x), yt.numpy(), atol=1e-12)
