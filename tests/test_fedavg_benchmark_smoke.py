"""Smoke test of benchmarks/fedavg_flower.py: one round each side, the same first-round
accuracy from the same weights, partitions, draws and shuffles, and the table."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import checkout_env, have_fashion_mnist

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = str(ROOT / "benchmarks" / "fedavg_flower.py")


@pytest.mark.slow
@pytest.mark.skipif(not have_fashion_mnist(), reason="needs Fashion-MNIST on disk")
def test_one_round_on_each_side_agrees(tmp_path):
    pytest.importorskip("flwr")
    pytest.importorskip("torch")
    mpiexec = shutil.which("mpiexec", path=str(Path(sys.executable).parent))
    if mpiexec is None:
        pytest.skip("needs mpiexec")
    env = checkout_env()
    for cmd in ([mpiexec, "-n", "2", sys.executable, SCRIPT, "distnn", "--rounds", "1"],
                [sys.executable, SCRIPT, "flower", "--rounds", "1"],
                [sys.executable, SCRIPT, "table"]):
        r = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600,
                           env=env)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    ours = json.loads((tmp_path / "fedavg_bench" / "distnn.json").read_text())
    flower = json.loads((tmp_path / "fedavg_bench" / "flower.json").read_text())
    assert ours["ranks"] == 2 and len(ours["clients_per_round"][0]) == 5
    assert abs(ours["accuracy"][0] - flower["accuracy"][0]) < 0.005, (ours, flower)
    assert "| 1 | " in r.stdout and "Flower FedAvg" in r.stdout
