"""LayerNormalization and RMSNorm over the last axis: shapes, gradient checks of dx and every
parameter for every option, torch.nn.LayerNorm / RMSNorm parity, ONNX in onnxruntime."""
import numpy as np
import pytest

from distnn.nn import Dense, LayerNormalization, RMSNorm, Sequential
from gradcheck import check_layer
from parity import built, onnx_matches, randomized, same, torch_export_matches, torch_parity

RNG = np.random.default_rng(0)
OPTIONS = [(cls, affine) for cls in (LayerNormalization, RMSNorm) for affine in (True, False)]
SHAPES = [(7,), (4, 7), (2, 3, 7)]



def sample(shape, n=3):
    return 2.0 + 3.0 * RNG.standard_normal((n,) + shape)


@pytest.mark.parametrize("cls,affine", OPTIONS)
@pytest.mark.parametrize("shape", SHAPES)
def test_shape_params_and_gradients(cls, affine, shape):
    layer = randomized(built(cls(elementwise_affine=affine), shape))
    keys = ({"gamma", "beta"} if cls is LayerNormalization else {"gamma"}) if affine else set()
    assert set(layer.params) == keys and layer.output_shape == shape
    x = sample(shape)
    assert layer.forward(x).shape == x.shape
    errors = check_layer(layer, x)
    assert set(errors) == keys | {"dx"}


@pytest.mark.parametrize("cls", [LayerNormalization, RMSNorm])
def test_normalizes_each_token(cls):
    layer = built(cls(epsilon=1e-12), (4, 9))
    y = layer.forward(sample((4, 9)))
    if cls is LayerNormalization:
        np.testing.assert_allclose(y.mean(axis=-1), 0, atol=1e-12)
        np.testing.assert_allclose(y.var(axis=-1), 1, rtol=1e-9)
    else:
        np.testing.assert_allclose(np.mean(y * y, axis=-1), 1, rtol=1e-9)
    assert layer.forward(sample((2, 9))).shape == (3, 2, 9)  # a shorter sequence


@pytest.mark.parametrize("cls,affine", OPTIONS)
def test_matches_torch(cls, affine):
    pytest.importorskip("torch")
    eps = 1e-5 if cls is LayerNormalization else 1e-6
    layer = randomized(built(cls(epsilon=eps, elementwise_affine=affine), (4, 7)))
    grads = {"gamma": ("weight", same), "beta": ("bias", same)} if affine else {}
    if cls is RMSNorm:
        grads.pop("beta", None)
    torch_parity(layer, sample((4, 7)), grads)


@pytest.mark.parametrize("affine", [True, False])
def test_onnx_and_torch_export(affine):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("torch")
    model = Sequential([Dense(6), LayerNormalization(elementwise_affine=affine), Dense(5),
                        RMSNorm(epsilon=1e-4, elementwise_affine=affine)], input_shape=(3, 4),
                       dtype=np.float64, rng=0)
    for layer in model.layers:
        randomized(layer)
    x = sample((3, 4), n=4)
    ops = onnx_matches(model, x)
    assert "LayerNormalization" in ops and "MatMul" in ops and "ReduceMean" in ops
    torch_export_matches(model, x)


def test_errors():
    with pytest.raises(ValueError, match="epsilon must be > 0"):
        RMSNorm(epsilon=0)
    layer = built(LayerNormalization(name="ln"), (4, 7))
    with pytest.raises(ValueError, match=r"'ln'.*\(batch, \.\.\., 7\)"):
        layer.forward(np.zeros((2, 4, 6)))


@pytest.mark.parametrize("affine", [True, False])
def test_layernorm_from_onnx(affine):
    pytest.importorskip("onnx")
    from distnn.models.onnx_import import _attrs, _Graph
    from distnn.nn.onnx_export import onnx_model
    model = Sequential([LayerNormalization(epsilon=1e-3, elementwise_affine=affine)],
                       input_shape=(4, 7), rng=0)
    for p in model.layers[0].params.values():
        p[...] = RNG.standard_normal(p.shape)
    g = _Graph(onnx_model(model), "ln.onnx")
    (node,) = g.nodes[:1]
    assert node.op_type in LayerNormalization.onnx_ops and not RMSNorm.onnx_ops
    layer, arrays = LayerNormalization.from_onnx(g, node, _attrs(node))
    assert layer.epsilon == pytest.approx(1e-3)
    gamma = model.layers[0].params["gamma"] if affine else np.ones(7)
    np.testing.assert_allclose(arrays["gamma"], gamma, rtol=1e-6)
    np.testing.assert_allclose(arrays["beta"], model.layers[0].params["beta"] if affine else 0,
                               rtol=1e-6)
