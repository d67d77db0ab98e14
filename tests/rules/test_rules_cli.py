"""The rules through the distnn command on real data (Fashion-MNIST, 3 ranks)."""
from __future__ import annotations

import re

import pytest

from rulejobs import run_cli
from helpers import distnn_in_process, have_fashion_mnist, needs_mpi


@needs_mpi
@pytest.mark.slow
@pytest.mark.skipif(not have_fashion_mnist(), reason="needs Fashion-MNIST on disk")
@pytest.mark.compiled  # Fashion-MNIST for 120 steps
def test_downpour_on_fashion_mnist_with_profile_checkpoint_and_resume(tmp_path):
    ckpt = str(tmp_path / "ck.npz")
    common = ["--mode", "downpour", "--sync-every", "2", "--dataset", "fashion_mnist",
              "--steps_per_epoch", "40", "--quiet", "--download", "false"]
    proc = run_cli(3, "train", *common, "--num_epochs", "2", "--profile",
                   "--checkpoint", ckpt, "--seed", "1")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    # the profile names each rank's messages and waiting, and the master's idle share
    assert re.search(r"downpour rank 0: \d+ messages sent, .* master idle", out), out
    assert re.search(r"downpour rank 2: [1-9]\d* messages sent", out), out
    acc = float(re.search(r"Test: .*accuracy=([0-9.]+)", out).group(1))
    # asynchronous: which worker's gradients the master applies, and how stale, follows the
    # host's scheduling (0.68-0.74 alone on 2 cores, 0.54 once under the full suite's load);
    # chance is 0.1
    assert acc > 0.45, out
    resumed = run_cli(3, "train", *common, "--num_epochs", "3", "--resume", ckpt,
                      "--seed", "1")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "Test:" in resumed.stdout


def test_master_rules_refuse_a_single_process(tmp_path):
    proc = run_cli(0, "train", "--parallel", "gem", "--dataset", "synthetic",
                   "--num_samples", "64", "--steps_per_epoch", "1", "--quiet")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "--parallel gem" in proc.stderr and "mpiexec -n 3" in proc.stderr


def test_unknown_rule_names_the_choices():
    # in process (the command's entry); the refusal above is a real process
    proc = distnn_in_process("train", "--parallel", "ring", "--quiet")
    assert proc.returncode == 2
    assert "gossip" in proc.stderr and "'ring'" in proc.stderr
