"""Keras 3 models (torch backend) trained by distnn: the same updates as the same network
written as a torch module, on 1 and 2 real ranks; Keras's weights files; the layout,
training flag and parameters of ``distnn.torch.keras.KerasModel``."""
from __future__ import annotations

import numpy as np
import pytest

from distnn.models.keras_files import select_backend
from torchjobs import distnn, needs_mpi

select_backend()  # KERAS_BACKEND=torch before keras is imported (here or in conftest)
pytest.importorskip("keras")

KERAS_NET = '''
import keras


def get_model(**args):
    return keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(4, 3, activation="relu", name="conv"),
        keras.layers.Flatten(),
        keras.layers.Dense(6, activation="relu", name="fc1"),
        keras.layers.Dense(3, activation="softmax", name="fc2"),
    ])
'''

# The same network on NCHW batches: it flattens in Keras's NHWC order and ends in
# log_softmax (what KerasModel makes of Keras's softmax output).
TORCH_NET = '''
import torch


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 4, 3)
        self.fc1 = torch.nn.Linear(6 * 6 * 4, 6)
        self.fc2 = torch.nn.Linear(6, 3)

    def forward(self, x):
        x = torch.relu(self.conv(x)).permute(0, 2, 3, 1).flatten(1)
        return torch.log_softmax(self.fc2(torch.relu(self.fc1(x))), dim=1)


def build_model():
    return Net()
'''

DATA = ["--dataset", "synthetic", "--input_shape", "1,8,8", "--num_classes", "3",
        "--num_samples", "120", "--dtype", "float64", "--global_batch_size", "24",
        "--num_epochs", "2", "--evaluate", "false", "--quiet", "--optimizer", "sgd",
        "--momentum", "0.9", "--learning_rate", "0.1", "--loss", "categorical_crossentropy"]


def _as_torch(keras_arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Keras's kernels in torch's layout (conv HWIO -> OIHW, dense (in, out) -> (out, in))."""
    k = keras_arrays
    return {"conv/weight": k["conv/kernel"].transpose(3, 2, 0, 1), "conv/bias": k["conv/bias"],
            "fc1/weight": k["fc1/kernel"].T, "fc1/bias": k["fc1/bias"],
            "fc2/weight": k["fc2/kernel"].T, "fc2/bias": k["fc2/bias"]}


def _load(path) -> dict[str, np.ndarray]:
    with np.load(path) as data:
        return {k: data[k] for k in data.files}


@pytest.fixture(scope="module")
def nets(tmp_path_factory):
    """The two model files, and the torch net's initial weights = the Keras net's."""
    from distnn.run.build import model_from_spec
    folder = tmp_path_factory.mktemp("keras")
    (folder / "knet.py").write_text(KERAS_NET)
    (folder / "tnet.py").write_text(TORCH_NET)
    kmodel = model_from_spec(str(folder / "knet.py"), input_shape=(1, 8, 8), num_classes=3,
                             dtype=np.float64, seed=0)
    start = {k: np.array(v) for k, v in kmodel.named_arrays().items()}
    tmodel = model_from_spec(str(folder / "tnet.py"), input_shape=(1, 8, 8), num_classes=3,
                             dtype=np.float64, seed=0)
    for key, value in _as_torch(start).items():
        tmodel.named_arrays()[key][...] = value
    tmodel.save_weights(str(folder / "torch_start.npz"))
    return folder, start


def test_keras_model_is_a_distnn_model_with_one_unit_per_layer(nets):
    import torch

    from distnn.run.build import model_from_spec
    from distnn.torch.keras import KerasModel
    folder, start = nets
    model = model_from_spec(str(folder / "knet.py"), input_shape=(1, 8, 8), num_classes=3,
                            dtype=np.float64, seed=0)
    assert isinstance(model, KerasModel) and model.module.layout == "nhwc"
    assert [u.name for u in model.layers] == ["conv", "fc1", "fc2"]
    # the same seed gives the same initial weights; the optimizer's parameters are Keras's
    for key, value in model.named_arrays().items():
        np.testing.assert_array_equal(value, start[key])
    kernel = model.keras_model.get_layer("conv").kernel
    assert any(p is kernel.value for p in model.module.parameters())
    model.parameters_flat()[:] = 0.5  # what a broadcast of initial weights writes
    assert float(np.asarray(kernel.value.detach()).min()) == 0.5
    x = np.random.default_rng(0).normal(size=(5, 1, 8, 8))
    y = model.forward(x)
    np.testing.assert_allclose(np.exp(y).sum(axis=1), 1.0, rtol=1e-12)
    direct = model.keras_model(torch.from_numpy(x.transpose(0, 2, 3, 1))).detach().numpy()
    np.testing.assert_allclose(np.exp(y), direct, rtol=1e-12)


def test_dropout_follows_the_training_flag(tmp_path):
    import keras

    from distnn.torch.keras import KerasModel
    net = keras.Sequential([keras.Input((4,), dtype="float64"),
                            keras.layers.Dropout(0.5, dtype="float64"),
                            keras.layers.Dense(2, name="d", dtype="float64")])
    model = KerasModel(net, (4,), dtype=np.float64)
    x = np.ones((64, 4))
    np.testing.assert_array_equal(model.forward(x), model.forward(x))  # inference: no dropout
    assert not np.allclose(model.forward(x, training=True), model.forward(x))


def _train(n, folder, model, name, *extra):
    proc = distnn(n, "train", "--model", model, *DATA, "--save_weights", name, *extra,
                  cwd=folder)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return _load(folder / name)


@needs_mpi
@pytest.mark.parametrize("n", [1, 2])
def test_keras_and_torch_nets_train_to_the_same_weights(nets, n):
    folder, start = nets
    keras_end = _train(n, folder, "knet.py", f"keras_{n}.npz")
    torch_end = _train(1, folder, "tnet.py", "torch_1.npz", "--weights_and_bias_filename",
                       "torch_start.npz") if not (folder / "torch_1.npz").exists() \
        else _load(folder / "torch_1.npz")
    assert sorted(keras_end) == sorted(start)
    assert min(np.abs(keras_end[k] - start[k]).max() for k in start) > 1e-3  # it trained
    mapped = _as_torch(keras_end)
    for key, value in torch_end.items():
        np.testing.assert_allclose(mapped[key], value, rtol=0, atol=1e-10, err_msg=key)


@needs_mpi
def test_keras_weights_file_round_trip(nets):
    """--save_weights FILE.weights.h5 is Keras's file (Keras loads it), and
    --weights_and_bias_filename reads it back into distnn."""

    folder, _ = nets
    proc = distnn(2, "train", "--model", "knet.py", *DATA, "--save_weights", "k.weights.h5",
                  cwd=folder)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    reference = _load(folder / "keras_1.npz") if (folder / "keras_1.npz").exists() else None
    import importlib.util
    spec = importlib.util.spec_from_file_location("knet_for_keras", folder / "knet.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    from distnn.models.keras_files import keras_build
    with keras_build(np.float64, needed=True):
        net = module.get_model()
    net.load_weights(str(folder / "k.weights.h5"))
    if reference is not None:  # the same run as keras_1.npz's, written by Keras
        np.testing.assert_allclose(net.get_layer("fc1").kernel.numpy(), reference["fc1/kernel"],
                                   rtol=0, atol=1e-10)
    evaluated = distnn(0, "evaluate", "--model", "knet.py", *DATA[:10],
                       "--weights_and_bias_filename", "k.weights.h5", "--quiet", cwd=folder)
    assert evaluated.returncode == 0, evaluated.stdout + evaluated.stderr
    assert "loss=" in evaluated.stdout
