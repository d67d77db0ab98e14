"""A ResNet-18 written in plain PyTorch, exported by ``torch.onnx.export``, fine-tunes on 2
ranks with ``distnn train --model resnet18.onnx`` under every training rule (CIFAR-shaped
synthetic data, a few steps each), and ``distnn evaluate`` reads the weights it saved; a
torch module file trains on distnn's engine with ``--engine distnn``."""
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import needs_mpi, run_distnn

torch = pytest.importorskip("torch")
pytest.importorskip("onnx")

sys.path.insert(0, str(Path(__file__).parent))
from torch_resnet18 import ResNet18, export, randomize_statistics  # noqa: E402

HERE = Path(__file__).parent
RULES = ["data", "localsgd", "downpour", "easgd", "gossip", "gem", "partial"]
DATA = ["--dataset", "synthetic", "--input_shape", "3,32,32", "--num_samples", "128",
        "--validation_split", "0", "--batch_size", "8",
        "--learning_rate", "0.01", "--num_epochs", "1", "--steps_per_epoch", "3", "--quiet",
        "--evaluate", "false"]


def distnn(*args, cwd, ranks=2):
    return run_distnn(*args, cwd=cwd, ranks=ranks, timeout=600)


@pytest.fixture(scope="module")
def onnx_file(tmp_path_factory):
    folder = tmp_path_factory.mktemp("resnet18")
    torch.manual_seed(0)
    return Path(export(randomize_statistics(ResNet18(num_classes=10)).eval(),
                       folder / "resnet18.onnx"))


def _weights_moved(onnx_file, weights):
    from distnn.models.onnx_import import load_onnx_model
    start = load_onnx_model(str(onnx_file), input_shape=(3, 32, 32))
    tuned = load_onnx_model(str(onnx_file), input_shape=(3, 32, 32))
    tuned.load_weights(weights)
    delta = np.abs(tuned.parameters_flat() - start.parameters_flat())
    return float(delta.max()), bool(np.all(np.isfinite(tuned.parameters_flat())))


@pytest.mark.slow
@needs_mpi
@pytest.mark.parametrize("rule", [r if r in ("data", "downpour") else
                                  pytest.param(r, marks=pytest.mark.long) for r in RULES])
def test_resnet18_onnx_fine_tunes_on_two_ranks(onnx_file, tmp_path, rule):
    proc = distnn("train", "--model", onnx_file, "--parallel", rule, *DATA,
                  "--save_weights", "tuned.npz", "--history_file", "h.json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    history = json.loads((tmp_path / "h.json").read_text())
    losses = [e["loss"] for e in history["epochs"]] if "epochs" in history else \
        history["loss"]
    assert all(np.isfinite(losses)), losses
    moved, finite = _weights_moved(onnx_file, tmp_path / "tuned.npz")
    assert finite and moved > 0, f"{rule}: the weights did not change"


@pytest.mark.slow
@needs_mpi
def test_evaluate_reads_the_tuned_weights(onnx_file, tmp_path):
    proc = distnn("train", "--model", onnx_file, *DATA, "--save_weights", "tuned.npz",
                  cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = DATA[:DATA.index("--validation_split")]
    proc = distnn("evaluate", "--model", onnx_file, *data, "--weights", "tuned.npz",
                  cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "samples/s" in proc.stdout and "32 samples" in proc.stdout, proc.stdout


@pytest.mark.slow
def test_a_torch_module_file_trains_on_distnns_engine(tmp_path):
    proc = distnn("train", "--model", HERE / "torch_resnet18.py", "--engine", "distnn",
                  *DATA, "--save_weights", "w.npz", cwd=tmp_path, ranks=1)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with np.load(tmp_path / "w.npz") as w:  # distnn's layers, the batch norms kept
        names = w.files
    assert sum(k.startswith("batchnormalization_") and k.endswith("/running_mean")
               for k in names) == 20, names
    assert sum(k.startswith("conv2d_") and k.endswith("/w") for k in names) == 20, names
