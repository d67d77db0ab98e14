"""Export round trips: every zoo model (and every exportable layer option) written to ONNX
and converted to a torch module computes, in onnxruntime and in PyTorch, what distnn's
engine computes on the same input (inference: running statistics, no dropout)."""
import numpy as np
import pytest

from distnn.models import MODELS, get_model
from distnn.nn import (Add, AvgPool2D, BatchNormalization, Concat, Conv2D, Dense, Dropout,
                       Flatten, GlobalAvgPool2D, LeakyReLU, MaxPool2D, PaddingMask, ReLU,
                       Sequential, Sigmoid, Softmax, Tanh)
from parity import perturb_batch_norms

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
torch = pytest.importorskip("torch")

# ImageNet-sized nets run here on smaller images (the same layers and weights shapes but
# the first Dense of the Flatten heads): 224x224 would take minutes and GBs per net.
SMALL = {"imagenet": (3, 64, 64)}
BIG = {"resnet101", "resnet152", "densenet121", "vgg19bn_imagenet", "vgg19_imagenet"}


def _input_shape(name):
    if name == "alexnet_imagenet":  # its 11x11/4 stem and three 3x3/2 pools need more
        return (3, 99, 99)
    return SMALL.get(MODELS[name][1])


def _outputs(model, x, path):
    y = model.predict(x)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    y_onnx = session.run(["output"], {"input": x.astype(np.float32)})[0]
    module = model.to_torch()
    assert not module.training
    with torch.inference_mode():
        y_torch = module(torch.from_numpy(x)).numpy()
    return y, y_onnx, y_torch


def _assert_close(got, want, what):
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * scale, err_msg=what)


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in BIG else n
                                  for n in sorted(MODELS)])
def test_zoo_model_round_trips(name, tmp_path):
    torch.set_num_threads(1)
    rng = np.random.default_rng(1)
    model = get_model(name, input_shape=_input_shape(name), rng=2)
    perturb_batch_norms(model, rng)
    x = rng.standard_normal((3, *model.input_shape)).astype(np.float32)
    if MODELS[name][1] == "text":  # token ids of the text models' 256 bytes
        x = rng.integers(0, 256, x.shape).astype(np.float32)
    if any(isinstance(layer, PaddingMask) for layer in model.walk()):
        with pytest.raises(ValueError, match="PaddingMask.*no ONNX form"):
            model.to_onnx(tmp_path / f"{name}.onnx")
        return
    path = model.to_onnx(tmp_path / f"{name}.onnx")
    proto = onnx.load(path)
    assert proto.opset_import[0].version >= 17
    assert "Dropout" not in {n.op_type for n in proto.graph.node}
    y, y_onnx, y_torch = _outputs(model, x, path)
    assert y.shape == y_onnx.shape == y_torch.shape == (3, *model.output_shape)
    _assert_close(y_onnx, y, f"{name}: onnxruntime")
    _assert_close(y_torch, y, f"{name}: torch")


def _every_layer():
    return Sequential([
        Conv2D(4, 4, padding="same", use_bias=False),  # even kernel: uneven padding
        BatchNormalization(momentum=0.8, epsilon=1e-3), LeakyReLU(0.2),
        Conv2D(6, 3, strides=2, padding=(1, 2), dilation=(1, 2)), Tanh(),
        AvgPool2D(3, strides=1, padding=1), MaxPool2D(3, strides=2, padding=1),
        Add([Conv2D(6, 1), Sigmoid()], [], [ReLU()]),
        Concat([], [Conv2D(2, 3, padding=1)]), Dropout(0.3),
        Flatten(), Dense(16, use_bias=False), BatchNormalization(), ReLU(),
        Dense(5), Softmax()])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_every_layer_option_round_trips(tmp_path, dtype):
    model = _every_layer()
    model.build((3, 12, 11), rng=0, dtype=dtype)
    rng = np.random.default_rng(3)
    perturb_batch_norms(model, rng)
    x = rng.standard_normal((4, 3, 12, 11)).astype(dtype)
    y, y_onnx, y_torch = _outputs(model, x, model.to_onnx(tmp_path / "every.onnx"))
    assert y_torch.dtype == dtype
    _assert_close(y_onnx, y, "onnxruntime")
    _assert_close(y_torch, y, "torch")


def test_global_pool_model_round_trips(tmp_path):
    model = Sequential([Conv2D(3, 3), ReLU(), GlobalAvgPool2D(), Dense(4)], input_shape=(2, 7, 7))
    x = np.random.default_rng(0).standard_normal((2, 2, 7, 7)).astype(np.float32)
    y, y_onnx, y_torch = _outputs(model, x, model.to_onnx(tmp_path / "g.onnx"))
    _assert_close(y_onnx, y, "onnxruntime")
    _assert_close(y_torch, y, "torch")


def test_torchscript_file_loads_without_distnn_classes(tmp_path):
    from distnn.nn.torch_export import save_torch
    model = get_model("resnet20", rng=0)
    x = np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(np.float32)
    loaded = torch.jit.load(save_torch(model, tmp_path / "r.pt"))
    with torch.inference_mode():
        _assert_close(loaded(torch.from_numpy(x)).numpy(), model.predict(x), "torchscript")


def test_unbuilt_and_foreign_layers_are_refused(tmp_path):
    with pytest.raises(ValueError, match="not built"):
        Sequential([Dense(3)]).to_onnx(tmp_path / "x.onnx")

    class Twice(ReLU):
        pass

    model = Sequential([Flatten(), Twice()], input_shape=(2,))
    with pytest.raises(ValueError, match="Twice.*no ONNX form"):
        model.to_onnx(tmp_path / "x.onnx")
    with pytest.raises(ValueError, match="Twice.*no PyTorch form"):
        model.to_torch()
