"""ONNX import (``--model FILE.onnx``): a ResNet-18 written in plain PyTorch and exported
by ``torch.onnx.export`` imports and predicts what PyTorch predicts; distnn's own exports
come back as the same model; every op form the importer reads, and one-line refusals of
the rest (an op distnn lacks, a file that is not ONNX) through the command on 1 and 2
ranks."""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import COMMAND, child_env, launcher, needs_mpi

onnx = pytest.importorskip("onnx")
torch = pytest.importorskip("torch")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from distnn.models import get_model  # noqa: E402
from distnn.models.files import is_model_spec  # noqa: E402
from distnn.models.onnx_import import (ModelFileError, load_onnx_model,  # noqa: E402
                                       sequential_from_onnx)
from distnn.nn import Add, BatchNormalization, Conv2D, Dense  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from torch_resnet18 import ResNet18, export, randomize_statistics  # noqa: E402


def _close(got, want):
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * scale)


@pytest.fixture(scope="module")
def resnet18():
    torch.set_num_threads(1)
    torch.manual_seed(0)
    return randomize_statistics(ResNet18(num_classes=10)).eval()


@pytest.mark.parametrize("training", [False, True], ids=["eval-export", "training-export"])
def test_torch_resnet18_imports_and_predicts_as_pytorch(resnet18, tmp_path, training):
    path = export(resnet18, tmp_path / "resnet18.onnx", training=training)
    model = load_onnx_model(path, input_shape=(3, 32, 32))
    x = np.random.default_rng(0).standard_normal((4, 3, 32, 32)).astype(np.float32)
    with torch.inference_mode():
        want = resnet18(torch.from_numpy(x)).numpy()
    _close(model.predict(x), want)
    blocks = [l for l in model.layers if isinstance(l, Add)]
    assert len(blocks) == 8  # two basic blocks per stage
    bns = sum(isinstance(l, BatchNormalization) for l in model.walk())
    # the eval export folds each batch norm into its convolution; the training one keeps
    # all 20 (and then the parameter count is PyTorch's)
    assert bns == (20 if training else 0)
    if training:
        assert model.parameters_flat().size == sum(p.numel() for p in resnet18.parameters())


@pytest.mark.parametrize("name", ["resnet20", "vgg11bn", "alexnet_cifar10", "lenet"])
def test_distnn_exports_import_as_the_same_model(name, tmp_path):
    model = get_model(name, rng=3)
    back = load_onnx_model(model.to_onnx(tmp_path / "m.onnx"), input_shape=model.input_shape)
    assert back.parameters_flat().size == model.parameters_flat().size
    assert [type(l) for l in back.walk()][1:] == [type(l) for l in model.walk()
                                                  if type(l).__name__ != "Dropout"][1:]
    x = np.random.default_rng(1).standard_normal((3, *model.input_shape)).astype(np.float32)
    _close(back.predict(x), model.predict(x))


def _graph(nodes, inits, in_shape, out_shape, extra=()):
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", *in_shape])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", *out_shape])],
        initializer=[numpy_helper.from_array(v.astype(np.float32), k)
                     for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _run(proto, x):
    import onnxruntime as ort
    return ort.InferenceSession(proto.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def test_other_op_forms(tmp_path):
    """SAME_UPPER padding, ReduceMean over H and W, Reshape to (N, -1), Gemm with transB,
    alpha and beta, MatMul then a constant Add (a bias), a Concat block and a Sum."""
    rng = np.random.default_rng(0)
    w1, w2 = rng.normal(size=(4, 2, 4, 4)), rng.normal(size=(3, 2, 1, 1))
    g1, g2 = rng.normal(size=(5, 7)), rng.normal(size=(5, 3))
    b1, b2 = rng.normal(size=5), rng.normal(size=3)
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["a"], auto_pad="SAME_UPPER", kernel_shape=[4, 4]),
        helper.make_node("Conv", ["x", "w2"], ["b"]),
        helper.make_node("Concat", ["a", "b"], ["c"], axis=1),
        helper.make_node("LeakyRelu", ["c"], ["d"], alpha=0.1),
        helper.make_node("Sigmoid", ["d"], ["s1"]), helper.make_node("Tanh", ["d"], ["s2"]),
        helper.make_node("Sum", ["s1", "s2"], ["e"]),
        helper.make_node("ReduceMean", ["e", "axes"], ["f"], keepdims=1),
        helper.make_node("Reshape", ["f", "shape"], ["g"]),
        helper.make_node("Gemm", ["g", "g1", "b1"], ["h"], transB=1, alpha=0.5, beta=2.0),
        helper.make_node("MatMul", ["h", "g2"], ["i"]),
        helper.make_node("Add", ["i", "b2"], ["j"]),
        helper.make_node("Softmax", ["j"], ["y"], axis=-1)]
    inits = {"w1": w1, "w2": w2, "g1": g1, "b1": b1, "g2": g2, "b2": b2}
    proto = _graph(nodes, inits, (2, 6, 6), (3,))
    proto.graph.initializer.extend([numpy_helper.from_array(np.array([2, 3], np.int64), "axes"),
                                    numpy_helper.from_array(np.array([0, -1], np.int64),
                                                            "shape")])
    model = sequential_from_onnx(proto, input_shape=(2, 6, 6))
    assert [type(l).__name__ for l in model.layers][-3:] == ["Dense", "Dense", "Softmax"]
    assert model.layers[-2].use_bias
    x = rng.standard_normal((3, 2, 6, 6)).astype(np.float32)
    _close(model.predict(x), _run(proto, x))


def _pad_graph():
    return _graph([helper.make_node("Pad", ["x", "pads"], ["p"]),
                   helper.make_node("Conv", ["p", "w"], ["y"], name="conv_after_pad")],
                  {"w": np.ones((2, 1, 3, 3)), "pads": np.zeros(8)}, (1, 6, 6), (2, 6, 6))


def test_an_op_distnn_lacks_is_refused_in_one_line(tmp_path):
    path = tmp_path / "padded.onnx"
    onnx.save(_pad_graph(), path)
    with pytest.raises(ModelFileError) as err:
        load_onnx_model(str(path), input_shape=(1, 6, 6))
    text = str(err.value)
    assert "\n" not in text and str(path) in text and "'Pad'" in text
    # a grouped Conv is no longer refused: it reads as a depthwise Conv2D
    model = sequential_from_onnx(_graph([helper.make_node("Conv", ["x", "w"], ["y"], group=2)],
                                        {"w": np.ones((2, 1, 3, 3))}, (2, 6, 6), (2, 4, 4)),
                                 input_shape=(2, 6, 6))
    assert [layer.groups for layer in model.walk() if isinstance(layer, Conv2D)] == [2]


def test_a_file_that_is_not_onnx_is_refused_in_one_line(tmp_path):
    path = tmp_path / "notes.onnx"
    path.write_text("these are not protobuf bytes\n" * 10)
    with pytest.raises(ModelFileError) as err:
        load_onnx_model(str(path), input_shape=(1, 6, 6))
    assert "\n" not in str(err.value) and str(path) in str(err.value)
    assert "not an ONNX model" in str(err.value)
    assert is_model_spec("net.onnx") and is_model_spec("NET.ONNX")


DATA = ["--dataset", "synthetic", "--input_shape", "1,6,6", "--num_samples", "32",
        "--batch_size", "8", "--quiet", "--evaluate", "false", "--num_epochs", "1",
        "--steps_per_epoch", "1"]


@pytest.mark.parametrize("ranks", [1, pytest.param(2, marks=needs_mpi)])
@pytest.mark.parametrize("case", ["op", "garbage"])
def test_the_command_refuses_in_one_line_with_status_2(tmp_path, ranks, case):
    path = tmp_path / f"{case}.onnx"
    if case == "op":
        onnx.save(_pad_graph(), path)
    else:
        path.write_bytes(b"\x00\xff" * 50)
    proc = subprocess.run([*launcher(ranks), *COMMAND, "train", "--model", str(path), *DATA],
                          capture_output=True, text=True, timeout=180, cwd=tmp_path,
                          env=child_env())
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0], proc.stderr
    assert ("'Pad'" if case == "op" else "not an ONNX model") in lines[0]
    assert "Traceback" not in proc.stderr


def test_imported_weights_are_the_files(tmp_path):
    model = get_model("resnet20", rng=5)
    back = load_onnx_model(model.to_onnx(tmp_path / "r.onnx"), input_shape=(3, 32, 32))
    convs = [l for l in back.walk() if isinstance(l, Conv2D)]
    want = [l for l in model.walk() if isinstance(l, Conv2D)]
    assert all(np.array_equal(a.params["w"], b.params["w"]) for a, b in zip(convs, want))
    assert isinstance(back.layers[-1], Dense)


def test_a_missing_onnx_package_names_the_extra(tmp_path, monkeypatch):
    path = get_model("lenet", rng=0).to_onnx(tmp_path / "l.onnx")
    monkeypatch.setitem(sys.modules, "onnx", None)  # import onnx now raises ImportError
    with pytest.raises(ModelFileError, match=r"pip install 'distnn\[onnx\]'") as err:
        load_onnx_model(path, input_shape=(1, 28, 28))
    assert "\n" not in str(err.value) and path in str(err.value)
    with pytest.raises(ImportError, match=r"pip install 'distnn\[onnx\]'"):
        get_model("lenet", rng=0).to_onnx(tmp_path / "again.onnx")


@pytest.mark.slow
def test_the_default_dynamo_exporters_resnet18_imports(resnet18, tmp_path):
    """torch.onnx.export's default exporter (torch.export based; opset 18+, ReduceMean and
    Reshape where the TorchScript exporter writes GlobalAveragePool and Flatten)."""
    pytest.importorskip("onnxscript")
    path = export(resnet18, tmp_path / "dynamo.onnx", dynamo=True)
    assert "ReduceMean" in {n.op_type for n in onnx.load(path).graph.node}
    x = np.random.default_rng(2).standard_normal((3, 3, 32, 32)).astype(np.float32)
    with torch.inference_mode():
        want = resnet18(torch.from_numpy(x)).numpy()
    _close(load_onnx_model(path, input_shape=(3, 32, 32)).predict(x), want)
