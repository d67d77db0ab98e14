"""Smoke test of benchmarks/bn_relu.py: one round of each variant prints a table row with
numbers; a bad --variants value is refused with a message naming it."""
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import checkout_env

ROOT = Path(__file__).resolve().parents[1]


def run(*args):
    return subprocess.run([sys.executable, "benchmarks/bn_relu.py", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=170,
                          env=checkout_env())


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_one_round_prints_every_variant():
    r = run("--model", "resnet20", "--batch", "4", "--rounds", "1", "--steps", "1")
    assert r.returncode == 0, r.stderr[-3000:]
    rows = {line.split("|")[1].strip(): line for line in r.stdout.splitlines()
            if line.startswith("| ") and "variant" not in line}
    assert set(rows) == {"fused+keep", "fused", "apart+keep", "apart"}
    for line in rows.values():
        cells = [c.strip() for c in line.strip("|").split("|")[1:]]
        assert len(cells) == 5 and all(float(c) >= 0 for c in cells)


def test_bad_variant_is_refused():
    r = run("--variants", "fused,both")
    assert r.returncode != 0 and "'both'" in r.stderr and "fused|apart" in r.stderr
