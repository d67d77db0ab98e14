"""Keras models from users' files (models/keras_files.py, models/ranges.py): every way
NNLO takes a model (get_model/build_model/ModelBuilder, Sequential/functional/subclassed,
tensorflow.keras imports, model.to_json()), its parameter_range, and the one line that
names the extra to install."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from distnn.models.keras_files import select_backend

select_backend()
keras = pytest.importorskip("keras")

from distnn.models.files import ModelFileError, load_model_spec  # noqa: E402

SHAPE = (1, 28, 28)

FILES = {
    # NNLO's spelling: tensorflow.keras imports inside get_model(**args), Sequential.add
    "tf_style.py": '''
def get_model(**args):
    from tensorflow.keras.models import Sequential
    from tensorflow.keras.layers import Activation, Convolution2D, Dense, Flatten
    import tensorflow.keras.backend as K
    shape = (28, 28, 1) if K.image_data_format() == "channels_last" else (1, 28, 28)
    model = Sequential()
    model.add(Convolution2D(args.get("filters", 4), (3, 3), input_shape=shape))
    model.add(Activation("relu"))
    model.add(Flatten())
    model.add(Dense(10))
    model.add(Activation("softmax"))
    return model
''',
    "functional.py": '''
import keras


def build_model(num_classes):
    x = keras.Input((28, 28, 1))
    h = keras.layers.Conv2D(4, 3, activation="relu")(x)
    h = keras.layers.GlobalAveragePooling2D()(h)
    return keras.Model(x, keras.layers.Dense(num_classes)(h))
''',
    "subclassed.py": '''
import keras


class Net(keras.Model):
    def __init__(self):
        super().__init__()
        self.conv = keras.layers.Conv2D(4, 3, activation="relu")
        self.pool = keras.layers.GlobalAveragePooling2D()
        self.out = keras.layers.Dense(10)

    def call(self, x, training=None):
        return self.out(self.pool(self.conv(x)))


def build_model():
    return Net()
''',
    "builder.py": '''
import keras


class MnistBuilder:
    """NNLO's ModelBuilder: constructed with the communicator, build_model() gives Keras's."""

    def __init__(self, comm):
        self.comm = comm

    def build_model(self):
        return keras.Sequential([keras.Input((784,)), keras.layers.Dense(10)])
''',
    "tf_other.py": '''
import tensorflow as tf


def get_model():
    return tf.constant(1.0)
''',
}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("kerasfiles")
    for name, text in FILES.items():
        (path / name).write_text(text)
    return path


def _train(spec, dtype=np.float32):
    """Build spec's model as distnn train does and take one SGD step on random data."""
    from distnn.run.build import model_from_spec
    model = model_from_spec(spec, input_shape=SHAPE, num_classes=10, dtype=dtype, seed=3)
    x = np.random.default_rng(0).normal(size=(4, *SHAPE)).astype(dtype)
    before = model.parameters_flat().copy()
    y = model.forward(x, training=True)
    model.backward(np.ones_like(y) / len(y))
    model.parameters_flat()[:] -= 0.1 * model.gradients_flat()
    assert y.shape == (4, 10)
    assert np.abs(model.parameters_flat() - before).max() > 0
    return model


@pytest.mark.parametrize("name, layout", [("tf_style.py", "nhwc"), ("functional.py", "nhwc"),
                                          ("subclassed.py", "nhwc"), ("builder.py:MnistBuilder",
                                                                      "flat")])
def test_every_kind_of_keras_model_file_trains(folder, name, layout):
    model = _train(str(folder / name))
    assert model.module.layout == layout
    assert model.num_params == sum(int(np.prod(v.shape)) for v in
                                   model.keras_model.trainable_variables)


def test_the_tensorflow_alias_is_only_keras_and_only_while_the_file_runs(folder):
    if "tensorflow" in sys.modules:
        pytest.skip("TensorFlow is installed: files use it as it is")
    _train(str(folder / "tf_style.py"))
    assert "tensorflow" not in sys.modules and "tensorflow.keras" not in sys.modules
    with pytest.raises(ModelFileError, match=r"tensorflow\.constant: TensorFlow is not "
                                             r"installed; distnn provides only "
                                             r"tensorflow\.keras"):
        load_model_spec(str(folder / "tf_other.py"), input_shape=SHAPE, num_classes=10)


def test_float64_models_are_built_and_run_in_float64(folder):
    model = _train(str(folder / "functional.py"), np.float64)
    assert {v.dtype for v in model.keras_model.variables} == {"float64"}
    assert keras.config.floatx() == "float32"  # restored after building


def test_keras3_json_builds_the_same_network(folder):
    net = keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Conv2D(2, 3),
                            keras.layers.Flatten(), keras.layers.Dense(10,
                                                                       activation="softmax")])
    (folder / "net.json").write_text(net.to_json())
    model = _train(str(folder / "net.json"), np.float64)
    assert model.module.probabilities and model.dtype == np.float64
    assert [u.name for u in model.layers] == [layer.name for layer in net.layers
                                              if layer.weights]


@pytest.mark.parametrize("content, message", [
    ({"class_name": "Sequential", "keras_version": "2.4.0", "backend": "tensorflow",
      "config": {"layers": []}}, "written by Keras 2.4.0, whose JSON Keras 3 cannot read"),
    ({"module": "os", "class_name": "system", "config": {}}, "names module 'os'"),
    ({"module": "keras", "class_name": "Sequential", "config": {"layers": [
        {"module": "keras.layers", "class_name": "Lambda", "config": {}}]}},
     "holds a Lambda layer"),
    ([1, 2], "not a Keras model JSON"),
])
def test_a_json_that_keras3_cannot_or_must_not_read_is_one_line(folder, content, message):
    (folder / "bad.json").write_text(json.dumps(content))
    with pytest.raises(ModelFileError, match=message) as info:
        load_model_spec(str(folder / "bad.json"), input_shape=SHAPE, num_classes=10)
    assert "\n" not in str(info.value)


def test_parameter_range_becomes_a_search_space(tmp_path):
    pytest.importorskip("skopt")
    from distnn.models.ranges import space_table
    from distnn.search import SearchSpace
    (tmp_path / "ranged.py").write_text('''
from skopt.space import Categorical, Integer, Real


def get_model(**args):
    raise AssertionError("not built to read its ranges")


get_model.parameter_range = [Integer(10, 50, name="nb_filters"),
                             Real(1e-4, 1e-1, prior="log-uniform", name="learning_rate"),
                             Real(0.0, 1.0, name="dropout"),
                             Categorical(["relu", "tanh"], name="activation")]
''')
    table = space_table(str(tmp_path / "ranged.py"))
    assert table == {"nb_filters": {"int": [10, 50]},
                     "learning_rate": {"log_uniform": [1e-4, 1e-1]},
                     "dropout": {"uniform": [0.0, 1.0]},
                     "activation": {"choice": ["relu", "tanh"]}}
    assert SearchSpace.from_dict(table).names == list(table)


def without_module(tmp_path, name: str) -> dict[str, str]:
    """A child environment in which ``import name`` fails as it does where the package is
    not installed: a package of that name first on PYTHONPATH that raises
    ModuleNotFoundError."""
    from helpers import child_env
    fake = tmp_path / "fake" / name
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(
        f"raise ModuleNotFoundError(\"No module named '{name}'\", name='{name}')\n")
    env = child_env()
    env["PYTHONPATH"] = f"{tmp_path / 'fake'}:{env.get('PYTHONPATH', '')}"
    return env


def test_a_missing_extra_is_one_line_on_every_rank_before_data_is_read(tmp_path):
    from helpers import COMMAND, MPIEXEC
    if MPIEXEC is None:
        pytest.skip("needs mpiexec")
    env = without_module(tmp_path, "keras")
    (tmp_path / "net.py").write_text(FILES["functional.py"])
    # a data set path that does not exist: reading data would be another error
    proc = subprocess.run([MPIEXEC, "-n", "2", *COMMAND, "train", "--model", "net.py",
                           "--dataset", "mnist", "--dataset_path", "nowhere", "--quiet"],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if "error" in line]
    assert len(lines) == 2, proc.stderr
    assert all("pip install 'distnn[keras]'" in line for line in lines)


def test_keras_callbacks_a_model_file_lists_are_refused_by_name(tmp_path, capsys):
    from distnn.cli.main import main
    (tmp_path / "cb.py").write_text('''
import keras


def get_model():
    return keras.Sequential([keras.Input((784,)), keras.layers.Dense(10)])


def get_callbacks():
    return [keras.callbacks.EarlyStopping(patience=2), keras.callbacks.CSVLogger("h.csv")]
''')
    code = main(["train", "--model", str(tmp_path / "cb.py"), "--dataset", "synthetic",
                 "--quiet"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "EarlyStopping: --early_stopping" in err and "CSVLogger: --history_file" in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("code, expected", [
    # another backend chosen in the environment: overridden, with a note
    ("from distnn.models.keras_files import select_backend\n"
     "print(select_backend())\nimport keras\nprint(keras.backend.backend())",
     "KERAS_BACKEND=numpy in the environment: distnn runs Keras models on its torch backend"),
])
def test_the_backend_is_torch_or_one_line_says_why_not(code, expected):
    import os
    env = dict(os.environ, KERAS_BACKEND="numpy")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert expected in proc.stdout, proc.stdout + proc.stderr
    if "torch backend" in expected:
        assert proc.stdout.strip().endswith("torch")


def test_keras_imported_on_another_backend_is_one_line(monkeypatch):
    import types

    from distnn.models.keras_files import KerasFileError
    other = types.SimpleNamespace(backend=types.SimpleNamespace(backend=lambda: "jax"))
    monkeypatch.setitem(sys.modules, "keras", other)  # as if imported with KERAS_BACKEND=jax
    with pytest.raises(KerasFileError, match="Keras was imported with its 'jax' backend "
                                             "before distnn could select 'torch'"):
        select_backend()


def test_a_missing_scikit_optimize_is_one_line_on_every_rank_of_a_search(tmp_path):
    from helpers import COMMAND, MPIEXEC
    if MPIEXEC is None:
        pytest.skip("needs mpiexec")
    env = without_module(tmp_path, "skopt")
    # NNLO's way: the file imports scikit-optimize for its parameter_range
    (tmp_path / "net.py").write_text(
        "from skopt.space import Integer\n\nfrom distnn.nn import Dense, Flatten, Sequential\n"
        "\n\ndef get_model(units=4):\n    return Sequential([Flatten(), Dense(units), "
        "Dense(3)])\n\n\nget_model.parameter_range = [Integer(2, 6, name='units')]\n")
    # a data set path that does not exist: reading data would be another error
    proc = subprocess.run([MPIEXEC, "-n", "2", *COMMAND, "search", "--model", "net.py",
                           "--dataset", "mnist", "--dataset_path", "nowhere", "--block_size",
                           "1", "--num_iterations", "1", "--quiet"],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if "error" in line]
    assert len(lines) == 2, proc.stderr
    assert all("scikit-optimize is not installed" in line
               and "pip install 'distnn[keras]'" in line for line in lines), proc.stderr


KERAS_FREE = ("from distnn.nn import Dense, Flatten, Sequential\n\n"
              "def ModelClass(num_classes):\n"
              "    return Sequential([Flatten(), Dense(num_classes)])\n")


LOAD = ("import sys; from distnn.models.files import load_model_spec; "
        "m = load_model_spec(sys.argv[1], input_shape=(1, 4, 4), num_classes=3); "
        "print(type(m).__name__, 'keras' in sys.modules)")


@pytest.mark.parametrize("spec", ["plain.py:ModelClass", "pkg.sub.modelfile:ModelClass",
                                  "nspkg.modelfile:ModelClass"])
def test_a_model_file_that_names_no_keras_does_not_import_it(tmp_path, spec):
    """Keras costs seconds to import: a model file (or module, in a package or a namespace
    folder) whose text names neither keras nor tensorflow is loaded without it."""
    (tmp_path / "plain.py").write_text(KERAS_FREE)
    for folder, init in (("pkg/sub", True), ("nspkg", False)):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "modelfile.py").write_text(KERAS_FREE)
        if init:
            (tmp_path / "pkg" / "__init__.py").write_text("")
            (tmp_path / "pkg" / "sub" / "__init__.py").write_text("")
    out = subprocess.run([sys.executable, "-c", LOAD, spec], cwd=tmp_path, capture_output=True,
                         text=True, check=True).stdout.split()
    assert out == ["Sequential", "False"]


def test_a_model_file_that_names_keras_gets_its_scope(tmp_path):
    (tmp_path / "kerasy.py").write_text("import keras  # the file names Keras\n" + KERAS_FREE)
    out = subprocess.run([sys.executable, "-c", LOAD, "kerasy.py:ModelClass"], cwd=tmp_path,
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == ["Sequential", "True"]
