"""Conv2D(groups=...): grouped and depthwise convolutions. Shapes, errors, float64 gradient
checks for every option, agreement with torch.nn.Conv2d(groups=...) on both kernel
backends, ONNX export (onnxruntime) and import, and import of a torch-exported
depthwise-separable block."""
import numpy as np
import pytest

from distnn.nn import BatchNormalization, Conv2D, ReLU6, Sequential
from gradcheck import check_layer


def _built(layer, in_shape, seed=0, dtype=np.float64):
    layer.build(in_shape, rng=np.random.default_rng(seed), dtype=dtype)
    if layer.use_bias:  # a zero bias would hide a wrong db
        layer.params["b"][...] = np.random.default_rng(seed + 7).standard_normal(
            layer.params["b"].shape)
    return layer


@pytest.mark.parametrize("filters, groups, kwargs, in_shape, out_shape, w_shape", [
    (8, 8, {}, (8, 10, 10), (8, 8, 8), (8, 1, 3, 3)),  # depthwise
    (16, 8, {"padding": "same"}, (8, 10, 10), (16, 10, 10), (16, 1, 3, 3)),  # multiplier 2
    (6, 2, {"strides": 2, "padding": 1}, (4, 9, 9), (6, 5, 5), (6, 2, 3, 3)),
    (4, 4, {"dilation": 2, "padding": "same"}, (4, 7, 6), (4, 7, 6), (4, 1, 3, 3)),
    (12, 3, {"strides": 2, "padding": "same"}, (6, 8, 8), (12, 4, 4), (12, 2, 3, 3)),
])
def test_output_and_weight_shapes(filters, groups, kwargs, in_shape, out_shape, w_shape):
    layer = _built(Conv2D(filters, 3, groups=groups, **kwargs), in_shape)
    assert layer.output_shape == out_shape
    assert layer.params["w"].shape == w_shape
    y = layer.forward(np.zeros((2, *in_shape)))
    assert y.shape == (2, *out_shape)
    assert f"groups={groups}" in layer.describe()


def test_groups_must_divide_channels_and_filters():
    with pytest.raises(ValueError, match=r"groups=3 must divide the filters \(8\)"):
        Conv2D(8, 3, groups=3)
    with pytest.raises(ValueError, match="groups must be a positive integer, got 0"):
        Conv2D(8, 3, groups=0)
    with pytest.raises(ValueError, match=r"groups=4 must divide both the input channels "
                                         r"\(6\) and the filters \(8\)"):
        _built(Conv2D(8, 3, groups=4), (6, 5, 5))


def test_fan_in_is_per_group():
    """he_uniform bound sqrt(6 / fan_in) with fan_in = C/groups * kh * kw, as torch's."""
    layer = _built(Conv2D(64, 3, groups=64, use_bias=False), (64, 8, 8))
    bound = np.sqrt(6 / 9)
    assert np.abs(layer.params["w"]).max() <= bound
    assert np.abs(layer.params["w"]).max() > 0.9 * bound


CASES = [  # (filters, groups, in_shape): depthwise, groups=2, groups=C with multiplier 2
    (4, 4, (4, 7, 7)), (6, 2, (4, 7, 7)), (8, 4, (4, 7, 7))]
OPTIONS = [{"strides": 2}, {"padding": "same"}, {"dilation": 2},
           {"strides": 2, "padding": "same", "dilation": 2}, {"padding": 1, "use_bias": False}]


@pytest.mark.parametrize("filters, groups, in_shape", CASES, ids=["dw", "g2", "dw-x2"])
@pytest.mark.parametrize("opts", OPTIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
def test_gradients(filters, groups, in_shape, opts, kernel_backend):
    layer = _built(Conv2D(filters, 3, groups=groups, **opts), in_shape)
    x = np.random.default_rng(3).standard_normal((2, *in_shape))
    errors = check_layer(layer, x)
    assert set(errors) == {"dx", "w"} | ({"b"} if layer.use_bias else set())


def test_first_layer_skips_dx_and_grads_are_overwritten(kernel_backend):
    layer = _built(Conv2D(4, 3, groups=4), (4, 6, 6))
    layer.need_dx = False
    x = np.random.default_rng(0).standard_normal((2, 4, 6, 6))
    dy = np.ones((2, 4, 4, 4))
    layer.forward(x, training=True)
    assert layer.backward(dy) is None
    first = layer.grads["w"].copy()
    layer.forward(x, training=True)
    layer.backward(dy)
    np.testing.assert_allclose(layer.grads["w"], first, rtol=1e-12)


@pytest.mark.parametrize("filters, groups, in_shape", CASES, ids=["dw", "g2", "dw-x2"])
@pytest.mark.parametrize("opts", OPTIONS[:4], ids=lambda o: ",".join(o))
@pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-10), (np.float32, 1e-4)])
def test_matches_torch(filters, groups, in_shape, opts, dtype, tol, kernel_backend):
    torch = pytest.importorskip("torch")
    layer = _built(Conv2D(filters, 3, groups=groups, **opts), in_shape, dtype=dtype)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, *in_shape)).astype(dtype)
    conv = layer.torch_module()  # nn.Conv2d(groups=...) with the same weights
    convs = [m for m in conv.modules() if isinstance(m, torch.nn.Conv2d)]
    assert len(convs) == 1 and convs[0].groups == groups
    conv = conv.to(torch.float64 if dtype == np.float64 else torch.float32)
    xt = torch.tensor(x, requires_grad=True)
    yt = conv(xt)
    y = layer.forward(x, training=True)
    dy = rng.standard_normal(y.shape).astype(dtype)
    yt.backward(torch.tensor(dy))
    dx = layer.backward(dy)

    def close(a, t, what):
        want = t.detach().numpy()
        np.testing.assert_allclose(a, want, rtol=tol, atol=tol * max(1, np.abs(want).max()),
                                   err_msg=what)
    close(y, yt, "y")
    close(dx, xt.grad, "dx")
    close(layer.grads["w"], convs[0].weight.grad, "dw")
    close(layer.grads["b"], convs[0].bias.grad, "db")


def _block():
    """A depthwise-separable block with a grouped pointwise: depthwise 3x3 / 2 (same),
    batch norm, ReLU6, grouped 1x1 (groups=2)."""
    return Sequential([Conv2D(8, 3, strides=2, padding="same", groups=8),
                       BatchNormalization(), ReLU6(), Conv2D(6, 1, groups=2)])


def test_onnx_round_trip_in_onnxruntime(tmp_path):
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from distnn.models.onnx_import import load_onnx_model

    model = _block()
    model.build((8, 9, 9), rng=np.random.default_rng(0), dtype=np.float32)
    bn = [m for m in model.walk() if isinstance(m, BatchNormalization)][0]
    bn.buffers["running_mean"][...] = np.linspace(-0.3, 0.3, 8)
    bn.buffers["running_var"][...] = np.linspace(0.5, 2.0, 8)
    x = np.random.default_rng(1).standard_normal((3, 8, 9, 9)).astype(np.float32) * 3
    path = model.to_onnx(tmp_path / "block.onnx")
    convs = [n for n in onnx.load(path).graph.node if n.op_type == "Conv"]
    groups = [{a.name: a.i for a in n.attribute}.get("group") for n in convs]
    assert groups == [8, 2]
    y = model.predict(x)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    y_ort = session.run(["output"], {"input": x})[0]
    np.testing.assert_allclose(y_ort, y, rtol=1e-5, atol=1e-5)
    back = load_onnx_model(path, input_shape=(8, 9, 9))
    kinds = [(type(m).__name__, getattr(m, "groups", None)) for m in back.walk()
             if isinstance(m, (Conv2D, ReLU6))]
    assert kinds == [("Conv2D", 8), ("ReLU6", None), ("Conv2D", 2)]
    np.testing.assert_allclose(back.predict(x), y, rtol=1e-5, atol=1e-5)


def test_torch_exported_depthwise_separable_block_imports(tmp_path):
    torch = pytest.importorskip("torch")
    pytest.importorskip("onnx")
    from distnn.models.onnx_import import load_onnx_model
    from torch import nn

    torch.manual_seed(0)
    block = nn.Sequential(
        nn.Conv2d(3, 12, 1, bias=False), nn.BatchNorm2d(12), nn.ReLU6(),
        nn.Conv2d(12, 12, 3, stride=2, padding=1, groups=12, bias=False),
        nn.BatchNorm2d(12), nn.ReLU6(),
        nn.Conv2d(12, 8, 1, groups=4), nn.Conv2d(8, 16, 3, padding=1, groups=8))
    for m in block.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
    block.eval()
    path = tmp_path / "dws.onnx"
    with torch.no_grad():
        torch.onnx.export(block, (torch.zeros(2, 3, 16, 16),), str(path), dynamo=False,
                          opset_version=17, input_names=["input"], output_names=["output"],
                          dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}})
    model = load_onnx_model(path, input_shape=(3, 16, 16))
    groups = [m.groups for m in model.walk() if isinstance(m, Conv2D)]
    assert groups == [1, 12, 4, 8]
    x = np.random.default_rng(2).standard_normal((4, 3, 16, 16)).astype(np.float32) * 2
    with torch.no_grad():
        want = block(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(model.predict(x), want, rtol=1e-4, atol=1e-4)
