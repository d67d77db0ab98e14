"""``distnn search`` with NNLO's topology options (``--n-masters``, ``--n-processes``; distnn's
``--masters``, ``--group_size``): every trial runs on a block of ranks as ``mpiexec -n
BLOCK distnn train`` would, with those masters and worker groups; a block too small for
them, or whose workers make no whole groups, is refused in one line before any trial."""
from __future__ import annotations

import json
import subprocess

import pytest
from helpers import COMMAND, MPIEXEC, child_env
from helpers import needs_mpiexec as needs_mpi

pytest.importorskip("optuna")
pytest.importorskip("matplotlib")

MODEL = ("from distnn.nn import Dense, Flatten, Sequential\n\n\n"
         "def get_model():\n"
         "    return Sequential([Flatten(), Dense(3)])\n")
# NNLO's spellings: --model, --mode, --loss, --epochs, --batch
BASE = ["--model", "mlp.py", "--loss", "categorical_crossentropy", "--dataset", "synthetic",
        "--input_shape", "1,4,4", "--num_classes", "3", "--num_samples", "120", "--epochs",
        "1", "--batch", "4", "--num_iterations", "1", "--quiet"]


def search(n: int, *args, cwd) -> subprocess.CompletedProcess:
    """``distnn search`` on n ranks (n = 0: one process, no mpiexec)."""
    (cwd / "mlp.py").write_text(MODEL)
    launcher = [MPIEXEC, "-n", str(n)] if n else []
    return subprocess.run([*launcher, *COMMAND, "search", *BASE, *args],
                          capture_output=True, text=True, cwd=cwd, timeout=300,
                          env=child_env())


@needs_mpi
@pytest.mark.mpi
@pytest.mark.slow
def test_each_trial_runs_with_two_masters_on_its_block(tmp_path):
    # 6 ranks = the coordinator + one block of 5: top master, 2 sub-masters, 2 workers
    proc = search(6, "--mode", "downpour", "--n-masters", "2", "--block_size", "5",
                  "--output_dir", "out", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    trials = json.loads((tmp_path / "out" / "trials.json").read_text())["trials"]
    assert [t["state"] for t in trials] == ["complete"], trials
    best = (tmp_path / "out" / "best.toml").read_text()
    assert 'parallel = "downpour"' in best and "masters = 2" in best, best


@needs_mpi
@pytest.mark.mpi
@pytest.mark.parametrize("n, args, need", [
    (0, ["--mode", "downpour", "--masters", "2", "--block_size", "1"],
     "--block_size 1: each trial runs on one block of 1 rank, and --parallel downpour with "
     "--masters 2 (--n-masters) and --group_size 1 (--n-processes) needs at least 5 ranks "
     "there; give --block_size 5 or 6 or 7"),
    (5, ["--mode", "easgd", "--n-processes", "2", "--block_size", "4"],
     "--block_size 4: each trial runs on one block of 4 ranks, and --parallel easgd with "
     "--masters 1 (--n-masters) and --group_size 2 (--n-processes) needs 1 master rank + a "
     "multiple of 2 worker ranks there; give --block_size 3 or 5 or 7"),
])
def test_a_block_that_cannot_hold_the_topology_is_refused_in_one_line(tmp_path, n, args,
                                                                        need):
    proc = search(n, *args, "--output_dir", "out", cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    errors = [ln for ln in proc.stderr.splitlines() if "error:" in ln]
    assert len(errors) == 1 and need in errors[0], proc.stderr[-3000:]
    assert "trial" not in proc.stdout and not (tmp_path / "out" / "trials.json").exists()
