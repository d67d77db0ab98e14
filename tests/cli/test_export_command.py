"""``distnn export``: trained weights written as ONNX and TorchScript compute what distnn
computes; bad inputs are one line with exit status 2; ``--engine torch`` trains distnn's
layers as a torch module."""
import json
import subprocess

import numpy as np
import pytest
from helpers import COMMAND, child_env

ort = pytest.importorskip("onnxruntime")
torch = pytest.importorskip("torch")

DATA = ["--dataset", "synthetic", "--input_shape", "1,12,12", "--num_samples", "64",
        "--batch_size", "16", "--quiet", "--evaluate", "false", "--num_epochs", "1",
        "--steps_per_epoch", "2"]


def distnn(*args, cwd):
    return subprocess.run([*COMMAND, *map(str, args)], capture_output=True, text=True,
                          timeout=300, cwd=cwd, env=child_env())


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    folder = tmp_path_factory.mktemp("export")
    proc = distnn("train", "--model", "lenet", *DATA, "--save_weights", "w.npz", cwd=folder)
    assert proc.returncode == 0, proc.stderr
    return folder


def _distnn_outputs(folder, x):
    from distnn.models import get_model
    model = get_model("lenet", input_shape=(1, 12, 12))
    model.load_weights(folder / "w.npz")
    return model.predict(x)


def test_exported_files_compute_what_distnn_computes(trained):
    x = np.random.default_rng(0).standard_normal((5, 1, 12, 12)).astype(np.float32)
    want = _distnn_outputs(trained, x)
    for fmt, name in (("onnx", "l.onnx"), ("torch", "l.pt")):
        proc = distnn("export", "--model", "lenet", "--input_shape", "1,12,12", "--format",
                      fmt, "--weights", "w.npz", "-o", name, cwd=trained)
        assert proc.returncode == 0, proc.stderr
        assert f"as {fmt} to {name}" in proc.stdout
    got = ort.InferenceSession(str(trained / "l.onnx")).run(None, {"input": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    with torch.inference_mode():
        got = torch.jit.load(str(trained / "l.pt"))(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("args, words", [
    (["--weights", "missing.npz"], ["--weights_and_bias_filename", "missing.npz"]),
    (["--model", "mine.py"], ["--model", "mine.py", "does not exist"]),
    (["--model", "nozoo"], ["--model nozoo", "not in the zoo"]),
    (["-o", "nodir/sub/x.onnx", "--weights", "w.npz", "--model", "resnet20"], ["w.npz"]),
])
def test_bad_inputs_are_one_line(trained, args, words):
    proc = distnn("export", "--model", "lenet", "--input_shape", "1,12,12", *args, cwd=trained)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and all(w in lines[0] for w in words), proc.stderr


def test_engine_torch_trains_distnns_layers_in_pytorch(tmp_path):
    proc = distnn("train", "--model", "lenet", "--engine", "torch", *DATA, "--history_file",
                  "h.json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "h.json").read_text())
