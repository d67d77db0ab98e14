"""--parallel partial through the distnn command on sklearn's digits (float64): one chunk is
local SGD averaged every step, the profile counts one chunk a step, bad --partial_chunks
values are refused on every rank."""
from __future__ import annotations

import re

import numpy as np
import pytest

from rulejobs import run_cli
from helpers import distnn_in_process, needs_mpi

from distnn.rules.partial import chunk_edges

pytestmark = needs_mpi
# 1150 training images (the command holds out 20%): a global batch of 83 leaves 71 (shares
# 36 and 35 on 2 ranks), one of 82 leaves 2 (shares 1, 1 and 0 on 3 ranks)
GBS = {2: 83, 3: 82}
COMMON = ["--dataset", "digits", "--model", "simplemlp", "--dtype", "float64",
          "--num_epochs", "2", "--learning_rate", "0.05", "--seed", "3"]
N_WEIGHTS = 563_722  # simplemlp on 8x8 digits


def train(n: int, tmp_path, name: str, *args: str) -> tuple[dict, str]:
    path = tmp_path / f"{name}.npz"
    proc = run_cli(n, "train", *COMMON, "--global_batch_size", str(GBS[n]),
                   "--save_weights", str(path), *args)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    with np.load(path) as z:
        return {k: z[k] for k in z.files}, out


@pytest.fixture(scope="module")
def four_chunks_profiled(tmp_path_factory) -> tuple[dict, str]:
    """2 ranks, 4 chunks, --profile: one run for the profile test and the 4-chunk model."""
    return train(2, tmp_path_factory.mktemp("four"), "four", "--parallel", "partial",
                 "--partial_chunks", "4", "--profile", "--quiet")


@pytest.mark.slow
@pytest.mark.parametrize("n", [2, pytest.param(3, marks=pytest.mark.long)])
def test_one_chunk_equals_localsgd_averaging_every_step(tmp_path, n, request):
    partial, out = train(n, tmp_path, "partial", "--parallel", "partial",
                         "--partial_chunks", "1", "--quiet")
    local, _ = train(n, tmp_path, "localsgd", "--parallel", "localsgd", "--sync_every", "1",
                     "--quiet")
    assert sorted(partial) == sorted(local)
    for key in partial:
        np.testing.assert_allclose(partial[key], local[key], rtol=0, atol=1e-10, err_msg=key)
    accuracy = float(re.search(r"Test: .*accuracy=([0-9.]+)", out).group(1))
    assert accuracy > 0.4, out  # it learned (chance: 0.1)
    # and four chunks train another model (on 2 ranks, the profile test's run)
    four, _ = (request.getfixturevalue("four_chunks_profiled") if n == 2 else
               train(n, tmp_path, "four", "--parallel", "partial", "--partial_chunks", "4",
                     "--quiet"))
    assert max(np.abs(four[k] - partial[k]).max() for k in four) > 1e-4


def test_the_profile_counts_one_chunk_a_step(four_chunks_profiled):
    _, out = four_chunks_profiled
    sizes = np.diff(chunk_edges(N_WEIGHTS, 4))
    steps = -(-1150 // GBS[2])
    found = re.findall(r"partial rank (\d): (\d+) messages sent, ([0-9.]+) MB", out)
    assert [int(r) for r, _, _ in found] == [0, 1, 0, 1], out  # 2 ranks x 2 epochs
    for i, (_, messages, mb) in enumerate(found):
        first = i // 2 * steps  # the turns run on: epoch 2 starts at chunk 14 % 4
        # a step sends its chunk and a sample count; the epoch ends with a full average
        want = sum(8 * (sizes[s % 4] + 1) for s in range(first, first + steps)) \
            + 8 * (N_WEIGHTS + 4)
        assert int(messages) == steps + 1
        assert abs(float(mb) - want / 2**20) < 0.006, (mb, want / 2**20)
    assert abs(float(found[0][2]) - 8 * (steps + 1) * N_WEIGHTS / 2**20) > 10  # not all


def test_more_chunks_than_weights_is_refused_on_every_rank(tmp_path):
    proc = run_cli(2, "train", *COMMON, "--parallel", "partial", "--partial_chunks",
                   "1000000", "--quiet", timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "--partial_chunks" in proc.stderr and str(N_WEIGHTS) in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_zero_chunks_is_refused():
    # in process (the command's entry); the 2-rank refusal above is a real launch
    proc = distnn_in_process("train", "--parallel", "partial", "--partial_chunks", "0", "--quiet")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "partial_chunks" in proc.stderr and "0" in proc.stderr, proc.stderr
