"""SINGA's CNN example and Needle's ddp ResNet9 script, as their users launch them
(``mpiexec -n N python examples/...``), and Needle's model and data through the real
``distnn train`` command; shortened (few steps, tiny CIFAR files)."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from helpers import needs_fashion_mnist
from torchjobs import EXAMPLES, distnn, mpirun, needs_mpi

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data"))
from datafiles import write_cifar_python  # noqa: E402


@needs_mpi
@pytest.mark.slow
@needs_fashion_mnist
@pytest.mark.compiled  # a CNN on Fashion-MNIST, evaluated on its 10,000 test images
@pytest.mark.parametrize("ranks,option", [pytest.param(2, "plain", marks=pytest.mark.long),
                                          (3, "half")])
def test_singa_cnn_example_trains_on_n_ranks(tmp_path, ranks, option):
    proc = mpirun(ranks, sys.executable, EXAMPLES / "singa_mnist_cnn.py", "cnn", "mnist",
                  "-m", "1", "--steps", "60", "-l", "0.05", "-d", option, cwd=tmp_path,
                  timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    # SINGA's own log lines, once (rank 0)
    assert proc.stdout.count("Starting Epoch 0:") == 1
    assert re.search(r"^Training loss = [\d.]+, training accuracy = [\d.]+$", proc.stdout, re.M)
    assert re.search(r"^Evaluation accuracy = [\d.]+, Elapsed Time = [\d.]+s$", proc.stdout,
                     re.M)
    result = json.loads(proc.stdout.split("RESULT ", 1)[1].splitlines()[0])
    assert result["ranks"] == ranks and result["dist_option"] == option
    assert result["steps_per_epoch"] == 60
    # 60 steps of ranks x 64 samples: far above chance (0.1) already
    assert result["accuracy"] > 0.45, proc.stdout[-2000:]


@pytest.fixture
def cifar_py(tmp_path):
    folder = tmp_path / "data" / "cifar-10-batches-py"
    write_cifar_python(folder, per_file=16)
    return folder


@needs_mpi
@pytest.mark.parametrize("ranks", [2, 3])
def test_needle_ddp_script_runs_on_n_ranks(tmp_path, cifar_py, ranks):
    proc = mpirun(ranks, sys.executable, EXAMPLES / "needle_ddp_cifar10.py", cifar_py,
                  "--batch_size", "24", "--epochs", "2", cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert f"original dataset length: 80; batch size per rank: {24 // ranks}" in proc.stdout
    assert proc.stdout.count("epoch: 2/2") == 1
    match = re.search(r"train accuracy \(last epoch, all ranks\): ([\d.]+)", proc.stdout)
    assert match and 0.0 <= float(match.group(1)) <= 1.0


@needs_mpi
def test_resnet9_on_cifar10_python_version_through_the_command(tmp_path, cifar_py):
    proc = distnn(3, "train", "--model", "resnet9", "--dataset", "cifar10", "--dataset_path",
                  cifar_py, "--num_epochs", "1", "--batch_size", "8", "--validation_split",
                  "0", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "resnet9 (431,946 parameters) on cifar10 (train 80, test 16); ranks 3" \
        in proc.stdout
    assert re.search(r"^Test: loss=[\d.]+ accuracy=[\d.]+ \(16 samples", proc.stdout, re.M)
