"""Smoke test of benchmarks/compression.py: tiny sizes, every row printed, bytes counted."""
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import checkout_env

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_compression_benchmark_prints_every_row():
    if shutil.which("mpiexec", path=str(Path(sys.executable).parent)) is None:
        pytest.skip("needs mpiexec")
    cmd = [sys.executable, "benchmarks/compression.py", "--models", "simplecnn",
           "--train-samples", "256", "--test-samples", "128", "--epochs", "1",
           "--batch", "32", "--warmups", "0,2"]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600,
                       env=checkout_env())
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [line for line in r.stdout.splitlines() if line.startswith("| simplecnn ")]
    assert len(rows) == 6, r.stdout  # none, fp16, and two warm-ups of topk and powersgd
    assert "failed" not in r.stdout
    ratio = {tuple(c.strip() for c in row.strip("|").split("|")[1:3]):
             float(re.search(r"1/([0-9.]+)", row).group(1)) for row in rows}
    assert ratio[("fp16", "0")] == 2.0
    assert ratio[("topk:0.01", "0")] > 30 and ratio[("topk:0.01", "2")] > 30
