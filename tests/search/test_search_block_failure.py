"""A trial that fails on only some ranks of a block, in the middle of an epoch (its other
ranks are then waiting in a collective the failed rank never joins): the real ``distnn
search`` under mpiexec must report the trial as failed, naming the failing rank and its
error, and go on with the next trials. Before the fix the block's other ranks waited
forever; the timeout turns such a regression into a failure instead of a hung CI."""
from __future__ import annotations

import json
import re

import pytest

from test_search_command import BASE, distnn, needs_data, needs_mpi

pytest.importorskip("optuna")

MODEL = '''
import os
from pathlib import Path

from distnn.nn import Sequential
from distnn.nn.activations import ReLU
from distnn.nn.core import Dense, Flatten

RANK = int(os.environ.get("PMI_RANK", "0"))
FAIL_RANK = int(os.environ["FAIL_RANK"])
DONE = Path("failed-once")  # the file is imported afresh for every trial


class Fragile(ReLU):
    """Raises in the forward of the 3rd training step of the first trial, on one rank."""

    calls = 0

    def forward(self, x, training=False):
        if training and RANK == FAIL_RANK and not DONE.exists():
            self.calls += 1
            if self.calls == 3:
                DONE.write_text("yes")
                raise RuntimeError(f"disk quota exceeded on world rank {RANK}")
        return super().forward(x, training)


def build_model():
    return Sequential([Flatten(), Dense(32), Fragile(), Dense(10)])
'''


@pytest.mark.mpi
@pytest.mark.slow
@needs_mpi
@needs_data
@pytest.mark.parametrize("fail_rank,who", [(2, "block rank 1"),
                                           pytest.param(1, "block rank 0", marks=pytest.mark.long)])
def test_a_trial_failing_on_one_rank_of_a_block_fails_alone(tmp_path, monkeypatch, fail_rank,
                                                            who):
    (tmp_path / "fragile.py").write_text(MODEL)
    monkeypatch.setenv("FAIL_RANK", str(fail_rank))
    # 3 ranks = coordinator + one block of 2: world rank 2 is the block's second rank,
    # world rank 1 its leader (the rank that talks to the coordinator)
    proc = distnn("search", *BASE, "--model", "fragile.py", "--block_size", 2,
                  "--num_iterations", 3, "--sampler", "random", "--output_dir", "out",
                  n=3, cwd=tmp_path, timeout=150)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    trials = json.loads((tmp_path / "out" / "trials.json").read_text())["trials"]
    assert [t["state"] for t in trials] == ["fail", "complete", "complete"], trials
    message = trials[0]["message"]
    assert message.startswith(f"[{who}] RuntimeError: disk quota exceeded on world rank "
                              f"{fail_rank}"), message
    assert all(t["value"] > 0 for t in trials[1:])
    assert re.search(rf"^trial +0 +block 0 .* FAILED: \[{who}\] RuntimeError: disk quota",
                     proc.stdout, re.M), proc.stdout


HANGING = MODEL.replace('DONE.write_text("yes")\n                raise RuntimeError(f"disk quota '
                        'exceeded on world rank {RANK}")',
                        'import time\n                time.sleep(3600)  # hangs, never fails')


@pytest.mark.mpi
@pytest.mark.slow
@needs_mpi
@needs_data
def test_a_rank_that_hangs_in_a_trial_ends_the_search_at_the_stall_timeout(tmp_path,
                                                                           monkeypatch):
    assert HANGING != MODEL
    (tmp_path / "fragile.py").write_text(HANGING)
    monkeypatch.setenv("FAIL_RANK", "2")
    proc = distnn("search", *BASE, "--model", "fragile.py", "--block_size", 2,
                  "--num_iterations", 3, "--output_dir", "out", "--stall_warning", 1,
                  "--stall_timeout", 4, n=3, cwd=tmp_path, timeout=150)
    assert proc.returncode == 4, proc.stdout[-3000:] + proc.stderr[-3000:]
    # the block's waiting rank names the hung one (block rank 1) past --stall_warning
    assert re.search(r"stall: waited \d+\.\d s in .*not arrived: rank 1 \(host", proc.stderr), \
        proc.stderr[-3000:]
    assert re.search(r"stall timeout: rank 1 did not arrive within 4 s", proc.stderr), \
        proc.stderr[-3000:]
