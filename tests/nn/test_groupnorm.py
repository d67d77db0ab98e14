"""GroupNormalization: shapes, float64 gradient checks of dx, gamma and beta for every option,
torch.nn.GroupNorm parity (forward and backward), ONNX (opset 17: the decomposition) in
onnxruntime and back through the importer, torch export."""
import numpy as np
import pytest

import distnn.nn as nn
from distnn.nn import Conv2D, Dense, GroupNormalization, ReLU, Sequential
from gradcheck import check_layer
from parity import built, onnx_matches, randomized, same, torch_export_matches, torch_parity

RNG = np.random.default_rng(0)
SHAPES = [(6,), (6, 5), (6, 3, 4)]
OPTIONS = [(center, scale) for center in (True, False) for scale in (True, False)]



def sample(shape, n=3):
    return 2.0 + 3.0 * RNG.standard_normal((n,) + shape)


def reference(x, groups, gamma, beta, eps):
    """The definition, one sample and one group at a time."""
    y = np.empty_like(x)
    per = x.shape[1] // groups
    for i in range(x.shape[0]):
        for k in range(groups):
            part = x[i, k * per:(k + 1) * per]
            y[i, k * per:(k + 1) * per] = (part - part.mean()) / np.sqrt(part.var() + eps)
    shape = (-1,) + (1,) * (x.ndim - 2)
    return y * gamma.reshape(shape) + beta.reshape(shape)


def test_exported_from_distnn_nn():
    assert nn.GroupNormalization is GroupNormalization and "GroupNormalization" in nn.__all__


@pytest.mark.parametrize("center,scale", OPTIONS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("groups", [1, 2, 3, 6])
def test_shape_params_and_gradients(groups, shape, center, scale):
    # epsilon near the groups' variance: with a tiny one, a group of 1 or 2 values is
    # almost invariant to x, its dx ~0, and the check would compare noise
    eps = 0.5
    layer = randomized(built(GroupNormalization(groups, eps, center=center, scale=scale),
                             shape))
    keys = ({"gamma"} if scale else set()) | ({"beta"} if center else set())
    assert set(layer.params) == keys and layer.output_shape == shape
    x = sample(shape)
    y = layer.forward(x, training=True)
    assert y.shape == x.shape and y.dtype == np.float64
    ones, zeros = np.ones(shape[0]), np.zeros(shape[0])
    np.testing.assert_allclose(y, reference(x, groups, layer.params.get("gamma", ones),
                                            layer.params.get("beta", zeros), eps),
                               rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(layer.forward(x, training=False), y)
    errors = check_layer(layer, x)
    assert set(errors) == keys | {"dx"}


def test_float32_and_no_dx():
    layer = built(GroupNormalization(2), (4, 3, 3), dtype=np.float32)
    x = sample((4, 3, 3)).astype(np.float32)
    y = layer.forward(x, training=True)
    assert y.dtype == np.float32
    layer.need_dx = False
    assert layer.backward(np.ones_like(y)) is None
    assert layer.grads["beta"].dtype == np.float32
    np.testing.assert_allclose(layer.grads["beta"], 3 * 9, rtol=1e-6)  # N * H * W


@pytest.mark.parametrize("center,scale", OPTIONS)
@pytest.mark.parametrize("shape", SHAPES)
def test_matches_torch(shape, center, scale):
    pytest.importorskip("torch")
    import torch
    layer = randomized(built(GroupNormalization(3, epsilon=1e-4, center=center, scale=scale),
                             shape))
    module = torch.nn.GroupNorm(3, shape[0], eps=1e-4, affine=True).double()
    with torch.no_grad():
        module.weight.copy_(torch.tensor(layer.params.get("gamma", np.ones(shape[0]))))
        module.bias.copy_(torch.tensor(layer.params.get("beta", np.zeros(shape[0]))))
    grads = {k: v for k, v in (("gamma", ("weight", same)), ("beta", ("bias", same)))
             if k in layer.params}
    torch_parity(layer, sample(shape, n=4), grads, module=module, tol=1e-11)
    torch_parity(layer, sample(shape, n=4), grads, tol=1e-11)  # its own torch_module


@pytest.mark.parametrize("center,scale", OPTIONS)
def test_onnx_round_trip_and_torch_export(center, scale):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("torch")
    from distnn.models.onnx_import import sequential_from_onnx
    from distnn.nn.onnx_export import OPSET, onnx_model
    model = Sequential([Conv2D(6, 3, padding="same"),
                        GroupNormalization(3, epsilon=1e-3, center=center, scale=scale),
                        ReLU(), GroupNormalization(2), Dense(4),
                        GroupNormalization(2, center=center, scale=scale)],
                       input_shape=(2, 5, 5), dtype=np.float64, rng=0)
    for layer in model.layers:
        randomized(layer)
    x = sample((2, 5, 5), n=4)
    ops = onnx_matches(model, x)
    assert OPSET < 18 and "GroupNormalization" not in ops  # opset 17: the decomposition
    assert ops.count("InstanceNormalization") == 3 and "Conv" in ops
    torch_export_matches(model, x)
    back = sequential_from_onnx(onnx_model(model), input_shape=(2, 5, 5), dtype=np.float64)
    norms = [l for l in back.layers if isinstance(l, GroupNormalization)]
    assert [(l.groups, l.center, l.scale) for l in norms] == [
        (3, center, scale), (2, True, True), (2, center, scale)]
    assert norms[0].epsilon == pytest.approx(1e-3)
    np.testing.assert_allclose(back.predict(x), model.predict(x), rtol=1e-5, atol=1e-5)


def test_errors():
    with pytest.raises(ValueError, match="groups must be an integer >= 1"):
        GroupNormalization(0)
    with pytest.raises(ValueError, match="epsilon must be > 0"):
        GroupNormalization(2, epsilon=0)
    with pytest.raises(ValueError, match=r"'gn'.*groups=4 must divide the channels.*\(6, 3\)"):
        built(GroupNormalization(4, name="gn"), (6, 3))
    with pytest.raises(RuntimeError, match="before forward"):
        built(GroupNormalization(2), (6,)).backward(np.ones((1, 6)))
    assert repr(GroupNormalization(2, center=False)) == "GroupNormalization(groups=2, center=False)"
