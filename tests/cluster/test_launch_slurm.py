"""distnn launch inside a Slurm allocation on the emulated cluster: with no --hosts it takes
the hosts from the allocation (SLURM_JOB_NODELIST), mpiexec starts its proxies with srun,
and a host killed mid-run is dropped: the run resumes on the others from its step
checkpoint and ends with the weights of a manual resume of that checkpoint.

Needs root and Debian's Slurm packages (skipped otherwise); the only Slurm cluster of the
tests, prefix ``s`` and 198.18.5.0/24 as in test_slurm.py (never run the two at once)."""
from __future__ import annotations

import re
import shutil
import subprocess
import time

import numpy as np
import pytest
from cluster_util import DISTNN, MPIEXEC, run
from helpers import finish
from test_slurm import needs_slurm

from distnn.cluster import EmulatedCluster
from distnn.cluster.slurm import EmulatedSlurm
from distnn.training.checkpoint import load_checkpoint

TRAIN = ["--dataset", "fashion_mnist", "--model", "simplemlp", "--dtype", "float64",
         "--global_batch_size", "48", "--steps_per_epoch", "12", "--num_epochs", "2",
         "--validation_split", "0", "--random_seed", "7", "--learning_rate", "0.05",
         "--quiet"]
HOSTS = ["s1", "s2", "s3"]


@pytest.fixture(scope="module")
def slurm3():
    with EmulatedCluster(3, rate="1gbit", prefix="s", net=5) as cluster:
        with EmulatedSlurm(cluster, timeout=30) as slurm_:
            yield cluster, slurm_


def salloc_launch(slurm_, tmp_path, *words):
    """``salloc -N 3 --no-kill distnn launch -- train WORDS`` (no --hosts)."""
    cmd = ["salloc", "-N", "3", "--no-kill", DISTNN, "launch", "--mpiexec", MPIEXEC,
           "--min_hosts", "2", "--", "train", *TRAIN, *words]
    return subprocess.Popen(cmd, cwd=tmp_path, env=slurm_.env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


@needs_slurm
@pytest.mark.timeout(300)
def test_launch_takes_the_hosts_of_the_allocation(slurm3, tmp_path):
    cluster, slurm_ = slurm3
    before = cluster.link_bytes()
    out, err = finish(salloc_launch(slurm_, tmp_path, "--checkpoint", "ck.npz"))
    after = cluster.link_bytes()
    assert "starting on 3 hosts (s1,s2,s3), 3 ranks" in err, err[-3000:]
    assert "finished on 3 hosts after 0 restarts" in err, err[-3000:]
    assert re.search(r"Test: loss=\S+ accuracy=", out + err), (out + err)[-2000:]
    assert load_checkpoint(tmp_path / "ck.npz").meta["global_step"] == 24
    # every host took part: each sent at least its gradients once per step (932,362 float64)
    for host in HOSTS:
        assert after[host]["sent"] - before[host]["sent"] >= 24 * 932_362 * 8, host


@needs_slurm
@pytest.mark.long  # a killed host dropped and resumed: tests/cluster/test_launch.py
@pytest.mark.timeout(420)
def test_a_killed_host_of_the_allocation_is_dropped_and_the_run_resumes(slurm3, tmp_path):
    # last in this module: the killed host's slurmd is gone with it (the node stays down)
    cluster, slurm_ = slurm3
    ck = tmp_path / "ck.npz"
    proc = salloc_launch(slurm_, tmp_path, "--checkpoint", "ck.npz", "--checkpoint_steps", "5",
                         "--save_weights", "final.npz")
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if ck.exists() and load_checkpoint(ck).meta["global_step"] >= 5:
                assert cluster.kill("s2")  # every process of the host, slurmd included
                break
            time.sleep(0.05)
        else:
            raise AssertionError("the run never reached step 5")
        shutil.copy(ck, tmp_path / "at_kill.npz")
    finally:
        out, err = finish(proc)
    assert proc.returncode == 0, err[-3000:]
    line = next((x for x in err.splitlines() if "restart 1/3" in x), None)
    assert line is not None, err[-3000:]
    assert "lost host s2" in line and "on 2 hosts (s1,s3)" in line, line
    at_kill = load_checkpoint(tmp_path / "at_kill.npz")
    assert f"(global step {at_kill.meta['global_step']}) of ck.npz" in line, line
    redone = re.search(r"redoing (\d+) steps? \((\d+) samples\)", line)
    assert redone and int(redone.group(1)) <= 5, line
    assert "finished on 2 hosts after 1 restart" in err, err[-3000:]
    manual = run(cluster, [DISTNN, "train", *TRAIN, "--resume", "at_kill.npz",
                           "--save_weights", "manual.npz", "--evaluate", "false"],
                 hosts=["s1", "s3"], cwd=tmp_path)
    assert manual.returncode == 0, manual.stderr[-3000:]
    with np.load(tmp_path / "final.npz") as a, np.load(tmp_path / "manual.npz") as b:
        for key in a.files:
            np.testing.assert_array_equal(a[key], b[key])
