"""The example model files train through ``mpiexec -n 2 distnn train --model examples/...``
on Fashion-MNIST (shortened here; the full 3-epoch runs are in the README/report)."""
from __future__ import annotations

import re

import pytest

from helpers import needs_fashion_mnist
from torchjobs import EXAMPLES, distnn, needs_mpi


pytestmark = [pytest.mark.slow,
              needs_fashion_mnist]


@needs_mpi
@pytest.mark.parametrize("example", ["mnist_torch.py", "mnist_distnn.py"])
def test_example_file_trains_on_two_ranks(tmp_path, example):
    proc = distnn(2, "train", "--model", EXAMPLES / example, "--num_epochs", "1",
                  "--steps_per_epoch", "60", "--validation_split", "0", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    match = re.search(r"^Test: loss=\S+ accuracy=(\S+) \((\d+) samples", proc.stdout, re.M)
    assert match, proc.stdout[-2000:]
    # 60 global batches of 128 samples: far above chance (0.1) already
    assert float(match.group(1)) > 0.6, proc.stdout[-2000:]
