"""distnn launch on the emulated cluster: a host killed mid-run is dropped and the run
resumes on the others from its step checkpoint, ending with the weights of a manual
resume of that checkpoint on the same hosts; exits 2/3 are never restarted; a spent
restart budget names the last good checkpoint."""
from __future__ import annotations

import re
import shutil
import subprocess
import time

import numpy as np
import pytest
from cluster_util import DISTNN, MPIEXEC, NET, PREFIX, ROOT, needs_cluster, run
from helpers import reaped

from distnn.cluster import EmulatedCluster
from distnn.training.checkpoint import load_checkpoint

TRAIN = ["--dataset", "fashion_mnist", "--model", "simplemlp", "--dtype", "float64",
         "--global_batch_size", "48", "--steps_per_epoch", "12", "--num_epochs", "2",
         "--validation_split", "0", "--random_seed", "7", "--learning_rate", "0.05",
         "--quiet"]


@pytest.fixture(scope="module")
def cluster():
    with EmulatedCluster(3, rate="1gbit", prefix=PREFIX, net=NET) as c:
        yield c


def launch(tmp_path, *args, timeout=240, **popen):
    cmd = [DISTNN, "launch", "--cluster", PREFIX, "--mpiexec", MPIEXEC, *args]
    return subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **popen)


def kill_at_step(cluster, proc, ck, host, step):
    """kill -9 every process of ``host`` once ``ck`` holds global step >= ``step``."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if ck.exists() and load_checkpoint(ck).meta["global_step"] >= step:
            assert cluster.kill(host)
            return
        time.sleep(0.05)
    raise AssertionError("the run never reached the step")


@needs_cluster
def test_a_killed_host_is_dropped_and_the_run_resumes_bit_identical(cluster, tmp_path):
    ck = tmp_path / "ck.npz"
    proc = launch(tmp_path, "--max_restarts", "3", "--min_hosts", "2", "--", "train", *TRAIN,
                  "--checkpoint", "ck.npz", "--checkpoint_steps", "5", "--save_weights",
                  "final.npz")
    with reaped(proc):
        kill_at_step(cluster, proc, ck, f"{PREFIX}2", 5)
        shutil.copy(ck, tmp_path / "at_kill.npz")
        out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err[-3000:]
    restart = [line for line in err.splitlines() if "restart 1/3" in line]
    assert len(restart) == 1, err[-3000:]
    line = restart[0]
    print(line)
    assert f"lost host {PREFIX}2" in line and f"on 2 hosts ({PREFIX}1,{PREFIX}3)" in line
    at_kill = load_checkpoint(tmp_path / "at_kill.npz")
    assert f"resuming from {at_kill.where()} (global step {at_kill.meta['global_step']})" \
        in line, line
    redone = re.search(r"redoing (\d+) steps? \((\d+) samples\)", line)
    assert redone and int(redone.group(1)) <= 5 and int(redone.group(2)) <= 5 * 48, line
    accuracy = re.search(r"test.*accuracy\D*([\d.]+)", out + err, re.I)
    assert accuracy, out[-2000:]
    print("final test accuracy:", accuracy.group(1))
    manual = run(cluster, [DISTNN, "train", *TRAIN, "--resume", "at_kill.npz",
                           "--save_weights", "manual.npz", "--evaluate", "false"],
                 hosts=[f"{PREFIX}1", f"{PREFIX}3"], cwd=tmp_path)
    assert manual.returncode == 0, manual.stderr[-3000:]
    with np.load(tmp_path / "final.npz") as a, np.load(tmp_path / "manual.npz") as b:
        for key in a.files:
            np.testing.assert_array_equal(a[key], b[key])


@needs_cluster
def test_a_spent_budget_names_the_last_checkpoint_and_exits_2_3_are_not_restarted(
        cluster, tmp_path):
    ck = tmp_path / "ck.npz"
    proc = launch(tmp_path, "--max_restarts", "0", "--", "train", *TRAIN, "--num_epochs",
                  "50", "--checkpoint", "ck.npz", "--checkpoint_steps", "5")
    with reaped(proc):
        kill_at_step(cluster, proc, ck, f"{PREFIX}3", 5)
        _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert f"lost host {PREFIX}3; the restart budget (--max_restarts 0) is spent; the last " \
           f"good checkpoint: ck.npz (epoch" in err, err[-2000:]
    for extra, code, why in ((["--model", "nosuchmodel"], 2, "a user error"),
                             (["--learning_rate", "1e12"], 3, "the loss diverged")):
        proc = launch(tmp_path, "--", "train", *TRAIN, "--checkpoint", "other.npz",
                      "--overwrite", *extra)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == code, err[-2000:]
        assert err.count("distnn launch: starting on") == 1, err[-2000:]
        assert f"not restarting: {why}" in err, err[-2000:]


def test_launch_needs_a_checkpoint():
    proc = subprocess.run([DISTNN, "launch", "--hosts", "a,b", "--", "train"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--checkpoint" in proc.stderr


@needs_cluster
def test_ctrl_c_stops_everything(cluster, tmp_path):
    import signal
    ck = tmp_path / "ck.npz"
    proc = launch(tmp_path, "--", "train", *TRAIN, "--num_epochs", "50", "--checkpoint",
                  "ck.npz", "--checkpoint_steps", "5")
    with reaped(proc):
        deadline = time.monotonic() + 120
        while not ck.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert ck.exists()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err[-2000:]
    assert "interrupted" in err
    for host in cluster.hosts:
        assert cluster.wait_gone(host.name, timeout=10), f"processes left on {host.name}"
    load_checkpoint(ck)  # whole


def test_slurm_nodelists_expand():
    from distnn.launch.supervisor import expand_nodelist
    assert expand_nodelist("node[1-3,07],gpu5") == ["node1", "node2", "node3", "node07", "gpu5"]
    assert expand_nodelist("a[08-10]x") == ["a08x", "a09x", "a10x"]


@needs_cluster
def test_a_hung_rank_ends_the_job_at_the_stall_timeout_and_its_host_is_dropped(cluster,
                                                                               tmp_path):
    import os
    import signal
    ck = tmp_path / "ck.npz"
    proc = launch(tmp_path, "--min_hosts", "2", "--", "train", *TRAIN, "--checkpoint",
                  "ck.npz", "--checkpoint_steps", "5", "--stall_warning", "1",
                  "--stall_timeout", "4")
    with reaped(proc):
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if ck.exists() and load_checkpoint(ck).meta["global_step"] >= 5:
                break
            time.sleep(0.05)
        ranks = [p for p in cluster.pids(f"{PREFIX}2")
                 if b"distnn" in open(f"/proc/{p}/cmdline", "rb").read()
                 and b"hydra" not in open(f"/proc/{p}/cmdline", "rb").read()]
        assert ranks
        for pid in ranks:
            os.kill(pid, signal.SIGSTOP)
        out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err[-3000:]
    assert "stall timeout: rank 1 did not arrive within 4 s" in err, err[-3000:]
    line = next(x for x in err.splitlines() if "restart 1/3" in x)
    assert f"a rank hung (exit 4): lost host {PREFIX}2" in line, line
    assert f"on 2 hosts ({PREFIX}1,{PREFIX}3)" in line, line


def test_a_checkpoint_that_will_not_load_is_not_restarted(tmp_path):
    import io

    from distnn.launch.supervisor import Supervisor
    fake = tmp_path / "mpiexec"
    fake.write_text("#!/bin/sh\necho '[b] lost: its processes ended by signal 9' >&2\nexit 1\n")
    fake.chmod(0o755)
    (tmp_path / "ck.npz").write_bytes(b"not a checkpoint")
    out = io.StringIO()
    sup = Supervisor(["a", "b", "c"], ["--checkpoint", str(tmp_path / "ck.npz")],
                     mpiexec=str(fake), probe=lambda host: True, min_hosts=2, out=out)
    assert sup.run() == 2
    text = out.getvalue()
    assert "lost host b; not restarting: the checkpoint will not load" in text, text
    assert text.count("starting on") == 1
