"""Smoke test of ``benchmarks/winograd_tiles.py`` (the F(2x2)/F(4x4)/im2col table behind
the Winograd tile choice): it runs end to end and prints a row per shape."""
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import checkout_env

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.timeout(120)
def test_winograd_tiles_prints_a_row_per_shape():
    pytest.importorskip("numba")
    cmd = [sys.executable, "benchmarks/winograd_tiles.py", "--batch", "2", "--repeat", "1",
           "--threads", "1,2"]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=110,
                       env=checkout_env())
    assert r.returncode == 0, r.stderr[-3000:]
    assert "| C->F HxW | im2col 1t | F(2x2) 1t | F(4x4) 1t | im2col 2t" in r.stdout
    rows = [line for line in r.stdout.splitlines() if line.startswith("| ") and "->" in line
            and "HxW" not in line]
    assert [row.split("|")[1].strip() for row in rows][:3] == [
        "16->16 32x32", "32->32 16x16", "64->64 8x8"]
    assert len(rows) == 14
    for row in rows:
        cells = [float(c) for c in row.strip("|").split("|")[1:]]
        assert len(cells) == 7 and all(c >= 0 for c in cells), row
