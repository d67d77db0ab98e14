"""Smoke test of benchmarks/inference.py: tiny sizes, every system's row printed with a
rate, distnn on 1 and 2 ranks set against the fastest peer on the same cores."""
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import checkout_env

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_inference_benchmark_prints_every_row():
    pytest.importorskip("onnxruntime")
    pytest.importorskip("torch")
    if shutil.which("mpiexec", path=str(Path(sys.executable).parent)) is None:
        pytest.skip("needs mpiexec")
    cmd = [sys.executable, "benchmarks/inference.py", "--quick", "--models", "lenet",
           "--configs", "1p1t,2r1t", "--torch-modes", "eager,channels_last"]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900,
                       env=checkout_env())
    assert r.returncode == 0, r.stderr[-3000:]
    rows = {tuple(c.strip() for c in line.strip("|").split("|")[1:3])
            for line in r.stdout.splitlines() if line.startswith("| lenet ")}
    for system in ("distnn", "onnxruntime", "torch", "torch-channels_last"):
        assert ("1p1t", system) in rows, r.stdout
        # 2 ranks x 1 thread against the peers on the same 2 cores (1 process x 2 threads)
        assert ("1p2t" if system != "distnn" else "2r1t", system) in rows, r.stdout
    assert "failed" not in r.stdout and "SKIP" not in r.stdout + r.stderr, r.stdout
    ratios = re.findall(r"\*\*distnn ÷ fastest peer\*\* \((\S+) 1p(\d)t\).*\*\*([0-9.]+)\*\*",
                        r.stdout)
    assert len(ratios) == 2 and all(float(v) > 0 for _, _, v in ratios), r.stdout
