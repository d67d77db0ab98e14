"""--checkpoint_steps: a run killed after a step checkpoint and resumed ends with the weights
of an uninterrupted run, bit for bit (float64, real Fashion-MNIST), on 1 and 2 ranks, and on
another number of ranks where the global batch allows it."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time

import numpy as np
import pytest
from helpers import COMMAND, MPIEXEC, child_env, launcher
from helpers import needs_mpiexec as needs_mpi

from distnn.training import load_checkpoint

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_hardening import distnn, ok, weights  # noqa: E402

# Fashion-MNIST, 16 steps of global batch 32 per epoch, 2 epochs, float64.
RUN = ["--dataset", "fashion_mnist", "--model", "simplecnn", "--dtype", "float64",
       "--global_batch_size", "32", "--steps_per_epoch", "16", "--num_epochs", "2",
       "--evaluate", "false", "--validation_split", "0", "--random_seed", "5",
       "--learning_rate", "0.05", "--momentum", "0.9", "--quiet"]


def _kill_after_a_step_checkpoint(tmp_path, ranks):
    """Run with --checkpoint_steps 4 and SIGKILL every rank once the checkpoint is a
    mid-epoch one (some steps after it, as a crash would); return that checkpoint."""
    proc = subprocess.Popen([*launcher(ranks), *COMMAND, "train", *RUN, "--checkpoint", "ck.npz",
                             "--checkpoint_steps", "4"], cwd=tmp_path, env=child_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    deadline = time.time() + 120
    ck, mid = tmp_path / "ck.npz", tmp_path / "ck_mid.npz"
    try:
        while proc.poll() is None and time.time() < deadline:
            # What the disk holds after a crash right after a step checkpoint: the run may
            # write the next one before the kill lands, so keep a copy (the file is replaced
            # atomically, so a copy is whole) and look at the copy.
            if ck.exists() and load_checkpoint(shutil.copy(ck, mid)).epoch_step:
                time.sleep(0.05)
                os.killpg(proc.pid, signal.SIGKILL)
                break
            time.sleep(0.01)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stderr.close()
    shutil.copy(mid, ck)
    state = load_checkpoint(ck)
    assert state.epoch_step and state.epoch_step % 4 == 0, state.meta
    return state


@pytest.mark.slow
@pytest.mark.parametrize("ranks", [1, 2])
def test_killed_after_a_step_checkpoint_resumes_bit_identical(tmp_path, ranks):
    if ranks > 1 and MPIEXEC is None:
        pytest.skip("needs mpiexec")
    ok(distnn("train", *RUN, "--save_weights", "a.npz", cwd=tmp_path, ranks=ranks))
    state = _kill_after_a_step_checkpoint(tmp_path, ranks)
    shutil.copy(tmp_path / "ck.npz", tmp_path / "ck2.npz")
    proc = ok(distnn("train", *RUN[:-1], "--resume", "ck.npz", "--save_weights", "b.npz",
                     cwd=tmp_path, ranks=ranks))
    assert f"resuming from {state.where()} of ck.npz" in proc.stdout, proc.stdout
    assert load_checkpoint(tmp_path / "ck.npz").epochs_done == 2
    a, b = weights(tmp_path / "a.npz"), weights(tmp_path / "b.npz")
    for key in a:
        np.testing.assert_array_equal(a[key], b[key])
    if ranks == 2:  # on another number of ranks: the same global batches, summed otherwise
        ok(distnn("train", *RUN, "--resume", "ck2.npz", "--save_weights", "c.npz",
                  cwd=tmp_path, ranks=1))
        c = weights(tmp_path / "c.npz")
        for key in a:
            np.testing.assert_allclose(c[key], a[key], rtol=1e-9, atol=1e-12)


@needs_mpi
def test_checkpoint_steps_is_refused_under_a_rule_whose_ranks_do_not_step_together(tmp_path):
    proc = distnn("train", *RUN, "--parallel", "downpour", "--checkpoint", "ck.npz",
                  "--checkpoint_steps", "2", cwd=tmp_path, ranks=2)
    assert proc.returncode == 2 and "--checkpoint_steps" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
