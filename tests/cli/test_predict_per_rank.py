"""``distnn predict`` and ``evaluate`` report samples/s; ``--predictions_per_rank`` has every
rank write its own rows with their dataset indices, which together are the gathered
predictions (1 and 2 ranks, an odd number of samples so a global batch splits unevenly)."""

import numpy as np
import pytest
from helpers import needs_mpi
from helpers import run_distnn as distnn  # one rank by default

DATA = ["--dataset", "synthetic", "--input_shape", "1,8,8", "--num_samples", "148",
        "--batch_size", "5", "--quiet"]


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    folder = tmp_path_factory.mktemp("w")
    proc = distnn("train", *DATA, "--num_epochs", "1", "--steps_per_epoch", "2",
                  "--evaluate", "false", "--save_weights", "w.npz", cwd=folder)
    assert proc.returncode == 0, proc.stderr
    return folder / "w.npz"


@pytest.mark.parametrize("ranks", [1, pytest.param(2, marks=needs_mpi)])
def test_per_rank_files_hold_the_gathered_predictions(weights, tmp_path, ranks):
    proc = distnn("predict", *DATA, "--weights", weights, "--output", "all.npz", cwd=tmp_path,
                  ranks=ranks)
    assert proc.returncode == 0, proc.stderr
    assert "samples/s" in proc.stdout and f"{ranks} rank" in proc.stdout, proc.stdout
    proc = distnn("predict", *DATA, "--weights", weights, "--output", "part.npz",
                  "--predictions_per_rank", cwd=tmp_path, ranks=ranks)
    assert proc.returncode == 0, proc.stderr
    assert "part.rank0.npz" in proc.stdout and "37 test samples" in proc.stdout, proc.stdout
    with np.load(tmp_path / "all.npz") as whole:
        logits = whole["logits"]
    seen = np.zeros(len(logits), int)
    for r in range(ranks):
        with np.load(tmp_path / f"part.rank{r}.npz") as part:
            np.testing.assert_array_equal(part["logits"], logits[part["index"]])
            seen[part["index"]] += 1
    assert np.all(seen == 1)  # every sample on exactly one rank
    assert not (tmp_path / "part.npz").exists()


def test_per_rank_csv_and_refused_npy(weights, tmp_path):
    proc = distnn("predict", *DATA, "--weights", weights, "--output", "p{rank}.csv",
                  "--predictions_per_rank", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    rows = (tmp_path / "p0.csv").read_text().splitlines()
    assert rows[0] == "index,predicted,label" and len(rows) == 38
    proc = distnn("predict", *DATA, "--weights", weights, "--output", "p.npy",
                  "--predictions_per_rank", cwd=tmp_path)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "--output p.npy" in proc.stderr and ".npz or .csv" in proc.stderr


def test_evaluate_reports_samples_per_second(weights, tmp_path):
    proc = distnn("evaluate", *DATA, "--weights", weights, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "(37 samples, " in proc.stdout and " samples/s)" in proc.stdout, proc.stdout
