"""``distnn train --model FILE.py`` through the real command: a torch module trains on N
ranks exactly as on one process (float64, uneven last batch, SGD-momentum and Adam),
checkpoint/resume, evaluate and predict work on it, and bad files give one-line errors."""
from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys

import numpy as np
import pytest

from distnn.cli.main import main
from torchjobs import ROOT, distnn, needs_mpi

TORCH_NET = '''
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self, classes=3):
        super().__init__()
        self.conv = nn.Conv2d(1, 3, 3)
        self.fc1 = nn.Linear(3 * 3 * 3, 8)
        self.fc2 = nn.Linear(8, classes)

    def forward(self, x):
        x = torch.max_pool2d(torch.relu(self.conv(x)), 2)
        return self.fc2(torch.tanh(self.fc1(torch.flatten(x, 1))))


def build_model(num_classes):
    return Net(num_classes)
'''

BN_NET = '''
from torch import nn


def build_model(num_classes):
    return nn.Sequential(nn.Conv2d(1, 3, 3), nn.BatchNorm2d(3), nn.ReLU(), nn.Flatten(),
                         nn.Linear(108, num_classes))
'''

DISTNN_NET = '''
from distnn.nn import Dense, Flatten, ReLU, Sequential


def make(input_shape, num_classes, seed):
    return Sequential([Flatten(), Dense(8), ReLU(), Dense(num_classes)])
'''

# 82 samples, global batch 20: the 5th (last) global batch has 2 samples, so on 3 ranks
# one rank's share is empty.
DATA = ["--dataset", "synthetic", "--input_shape", "1,8,8", "--num_classes", "3",
        "--num_samples", "82", "--validation_split", "0", "--dtype", "float64",
        "--global_batch_size", "20", "--quiet"]
EVAL_DATA = ["--dataset", "synthetic", "--input_shape", "1,8,8", "--num_classes", "3",
             "--num_samples", "82", "--dtype", "float64"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("models")
    (folder / "net.py").write_text(TORCH_NET)
    (folder / "dnet.py").write_text(DISTNN_NET)
    (folder / "bnnet.py").write_text(BN_NET)
    return folder


def _weights(path) -> dict[str, np.ndarray]:
    with np.load(path) as data:
        return {k: data[k] for k in data.files}


def _initial_weights(path) -> dict[str, np.ndarray]:
    """The weights the command starts from (seed 0), built in this process."""
    from distnn.run.build import model_from_spec
    model = model_from_spec(str(path), input_shape=(1, 8, 8), num_classes=3,
                            dtype=np.float64, seed=0)
    return {k: np.array(v) for k, v in model.named_arrays().items()}


def _command(n, *args, cwd):
    """The distnn command on n ranks; n == 0 runs its entry point in this process (no
    interpreter and torch start-up per run)."""
    if n:
        return distnn(n, *args, cwd=cwd)
    out, err, here = io.StringIO(), io.StringIO(), os.getcwd()
    try:
        os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main([str(a) for a in args])
    finally:
        os.chdir(here)
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


def _train(n, folder, name, *extra, model="net.py"):
    proc = _command(n, "train", "--model", model, *DATA, "--save_weights", name, *extra,
                    cwd=folder)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return _weights(folder / name), proc


@needs_mpi
@pytest.mark.parametrize("n, optimizer, model", [
    pytest.param(3, "sgd", "bnnet.py", marks=pytest.mark.long), (2, "adam", "net.py")])
def test_torch_model_file_on_n_ranks_equals_one_process(files, n, optimizer, model):
    # bnnet.py has a BatchNorm2d: with --sync_batchnorm it becomes distnn.torch's
    # SyncBatchNorm (statistics of the global batch), so 3 ranks still equal 1 process.
    opts = ["--optimizer", optimizer, "--learning_rate", "0.05", "--num_epochs", "1",
            "--evaluate", "false", "--sync_batchnorm"]
    one, _ = _train(0, files, f"one_{optimizer}.npz", *opts, model=model)
    many, _ = _train(n, files, f"many_{optimizer}.npz", *opts, model=model)
    expected = (["0/bias", "0/weight", "1/bias", "1/num_batches_tracked", "1/running_mean",
                 "1/running_var", "1/weight", "4/bias", "4/weight"] if model == "bnnet.py"
                else ["conv/bias", "conv/weight", "fc1/bias", "fc1/weight", "fc2/bias",
                      "fc2/weight"])
    assert sorted(one) == sorted(many) == expected
    start = _initial_weights(files / model)
    # it did train (a bias followed by BatchNorm has zero gradient)
    assert sum(np.abs(one[k] - start[k]).max() > 1e-3 for k in one) >= len(one) - 1
    for key in one:
        np.testing.assert_allclose(many[key], one[key], rtol=0, atol=1e-10)


def test_checkpoint_resume_evaluate_and_predict_on_a_torch_model(files):
    opts = ["--optimizer", "adam", "--learning_rate", "0.01"]
    full, proc = _train(0, files, "full.npz", *opts, "--num_epochs", "2")
    _train(0, files, "half.npz", *opts, "--num_epochs", "1", "--checkpoint", "ck.npz",
           "--evaluate", "false")
    resumed, _ = _train(0, files, "resumed.npz", *opts, "--num_epochs", "2", "--resume",
                        "ck.npz")
    for key in full:  # model and Adam state came back exactly
        np.testing.assert_array_equal(resumed[key], full[key])
    test_line = [ln for ln in proc.stdout.splitlines() if ln.startswith("Test:")][0]
    ev = _command(0, "evaluate", "--model", "net.py", *EVAL_DATA, "--weights", "full.npz",
                  cwd=files)
    assert ev.returncode == 0, ev.stderr
    assert test_line.split(" (")[0] in ev.stdout
    pred = _command(0, "predict", "--model", "net.py", *EVAL_DATA, "--weights", "full.npz",
                    "--output", "p.npz", cwd=files)
    assert pred.returncode == 0, pred.stderr
    with np.load(files / "p.npz") as p:
        assert p["logits"].shape == (20, 3)
        acc = float(test_line.split("accuracy=")[1].split()[0])
        assert np.mean(p["predicted"] == p["labels"]) == pytest.approx(acc)


def test_distnn_model_file_with_a_named_callable(files):
    trained, proc = _train(0, files, "d.npz", "--num_epochs", "1", model="dnet.py:make")
    assert sorted(trained) == ["dense_0/b", "dense_0/w", "dense_1/b", "dense_1/w"]
    assert trained["dense_0/w"].shape == (64, 8)
    assert "Test: loss=" in proc.stdout


@pytest.mark.parametrize("content, spec, expected", [
    ("import no_such_module_xyz\n", "bad.py", "importing 'bad.py' failed: ModuleNotFoundError"),
    ("x = 1\n", "bad.py", "defines neither build_model() nor get_model()"),
    ("def build_model():\n    return [1]\n", "bad.py",
     "build_model() returned a list; expected a distnn.nn.Sequential, a torch.nn.Module or a "
     "keras.Model"),
    ("def build_model():\n    return 1\n", "bad.py:other", "'bad.py' defines no 'other'"),
    ("", "missing.py", "file 'missing.py' does not exist"),
    ("import torch\ndef build_model():\n    return torch.nn.Linear(5, 2)\n", "bad.py",
     "cannot run on inputs of shape (batch, 1, 8, 8)"),
])
def test_a_bad_model_file_is_a_one_line_error(tmp_path, monkeypatch, capsys, content, spec,
                                              expected):
    (tmp_path / "bad.py").write_text(content)
    monkeypatch.chdir(tmp_path)
    code = main(["train", "--model", spec, *DATA, "--num_epochs", "1"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and expected in err and spec in err, err


def test_import_distnn_and_the_numpy_path_never_import_torch(tmp_path):
    code = (
        "import sys\n"
        "import distnn, distnn.distributed, distnn.rules, distnn.training, distnn.models\n"
        "from distnn.cli.main import main\n"
        "rc = main(['train', '--model', 'simplemlp', '--dataset', 'synthetic', "
        "'--input_shape', '1,4,4', '--num_samples', '32', '--num_epochs', '1', '--quiet'])\n"
        "assert rc == 0, rc\n"
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]"
    assert (ROOT / "src" / "distnn" / "torch" / "__init__.py").exists()
