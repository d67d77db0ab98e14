"""Checkpoint faults of the chaos run (issue 44) in a short form, on 2 real ranks: a full
disk while a checkpoint is written (a real tmpfs filled to ENOSPC), a truncated newest
checkpoint (the previous one kept beside it is used), and node-local copies that differ
(each rank's checkpoint folder its own bind mount, as on separate disks).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time

import numpy as np
import pytest
from helpers import COMMAND, child_env, launcher
from helpers import needs_mpiexec as needs_mpi

from distnn.training import load_checkpoint

RUN = ["--dataset", "fashion_mnist", "--model", "simplemlp", "--dtype", "float64",
       "--global_batch_size", "32", "--steps_per_epoch", "16", "--evaluate", "false",
       "--validation_split", "0", "--random_seed", "5", "--learning_rate", "0.05",
       "--momentum", "0.9", "--quiet"]
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (mount)")


def _train(*args, cwd, prefix=(), stdout=subprocess.PIPE):
    return subprocess.Popen([*launcher(2), *prefix, *COMMAND, "train", *RUN, *map(str, args)],
                            cwd=cwd, env=child_env(), text=True, stdout=stdout,
                            stderr=subprocess.PIPE, start_new_session=True)


def _finish(proc, timeout=240):
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
    return proc.returncode, (out or "") + err


def _model(path):
    return load_checkpoint(path).model_arrays()


@pytest.fixture
def small_disk(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m", "ck", str(disk)], check=True)
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def _fill(disk):
    with open(disk / "filler", "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass


def _fill_after_first_checkpoint(disk, proc, lines, free_after_warnings):
    """Fill ``disk`` once a checkpoint is there; free it after that many warnings (None:
    never). Reads the run's stderr into ``lines``."""
    def read():
        for line in proc.stderr:
            lines.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    while proc.poll() is None and not (disk / "ck.npz").exists():
        time.sleep(0.005)
    _fill(disk)
    while free_after_warnings is not None and proc.poll() is None:
        if sum("warning: could not write checkpoint" in s for s in lines) >= \
                free_after_warnings:
            os.unlink(disk / "filler")
            break
        time.sleep(0.02)
    proc.wait(240)
    reader.join(10)


@needs_mpi
@root_only
def test_a_full_disk_is_warned_and_training_goes_on(tmp_path, small_disk):
    proc = _train("--num_epochs", 2, "--checkpoint", small_disk / "ck.npz",
                  "--checkpoint_steps", 2, cwd=tmp_path, stdout=subprocess.DEVNULL)
    lines: list[str] = []
    try:
        _fill_after_first_checkpoint(small_disk, proc, lines, free_after_warnings=2)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
    said = "".join(lines)
    assert proc.returncode == 0, said
    warnings = [s for s in lines if "warning: could not write checkpoint" in s]
    assert len(warnings) >= 2, said
    assert "No space left on device; free space on that disk" in warnings[0]
    assert "training goes on" in warnings[0] and "the last good checkpoint: --resume" \
        in warnings[0] and "1 failed in a row" in warnings[0] and "2 failed in a row" \
        in warnings[1], said
    assert not [n for n in os.listdir(small_disk) if n.endswith(".part")]  # no partial file
    final = load_checkpoint(small_disk / "ck.npz")  # written once the disk had room again
    assert final.epochs_done == 2 and final.global_step == 32
    assert load_checkpoint(small_disk / "ck.prev.npz").global_step < 32


@needs_mpi
@root_only
def test_a_full_disk_at_the_final_save_is_an_error_naming_the_last_good(tmp_path,
                                                                        small_disk):
    proc = _train("--num_epochs", 1, "--checkpoint", small_disk / "ck.npz",
                  "--checkpoint_steps", 4, cwd=tmp_path, stdout=subprocess.DEVNULL)
    lines: list[str] = []
    try:
        _fill_after_first_checkpoint(small_disk, proc, lines, free_after_warnings=None)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
    said = "".join(lines)
    assert proc.returncode == 2, said
    good = load_checkpoint(small_disk / "ck.npz")  # the one before the disk filled
    assert good.global_step == 4, good.meta["global_step"]
    errors = [s for s in lines if "error" in s and "could not write checkpoint" in s]
    assert errors and len(set(errors)) == 1, said  # one line (the same on every rank)
    assert "No space left on device" in errors[0] and \
        f"the last good checkpoint: --resume {small_disk / 'ck.npz'} (epoch 1 step 4, " \
        "global step 4)" in errors[0], said


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """An uninterrupted 2-epoch run (whole/ck.npz) and a 1-epoch run with step
    checkpoints (cut/ck.npz at its end, cut/ck.prev.npz at epoch 1 step 12), together."""
    base = tmp_path_factory.mktemp("runs")
    whole, cut = base / "whole", base / "cut"
    whole.mkdir()
    cut.mkdir()
    a = _train("--num_epochs", 2, "--checkpoint", "ck.npz", cwd=whole)
    b = _train("--num_epochs", 1, "--checkpoint", "ck.npz", "--checkpoint_steps", 6, cwd=cut)
    (rc_a, said_a), (rc_b, said_b) = _finish(a), _finish(b)
    assert rc_a == 0 and rc_b == 0, said_a + said_b
    return whole, cut


@needs_mpi
def test_a_truncated_checkpoint_falls_back_to_the_previous_and_redoes_the_same_run(
        tmp_path, two_runs):
    whole, cut = two_runs[0], tmp_path / "cut"
    shutil.copytree(two_runs[1], cut)
    prev = load_checkpoint(cut / "ck.prev.npz")
    assert (prev.epochs_done, prev.epoch_step) == (0, 12), prev.meta  # kept beside it
    size = os.path.getsize(cut / "ck.npz")
    os.truncate(cut / "ck.npz", size // 2)
    rc, said = _finish(_train("--num_epochs", 2, "--resume", "ck.npz", cwd=cut))
    assert rc == 0, said
    assert "warning: --resume: checkpoint 'ck.npz' is truncated or corrupt" in said and \
        "using the previous one, 'ck.prev.npz' (epoch 1 step 12, global step 12): the " \
        "steps after global step 12 are redone" in said, said
    mine, ref = _model(cut / "ck.npz"), _model(whole / "ck.npz")
    assert mine.keys() == ref.keys()
    for key in ref:
        np.testing.assert_array_equal(mine[key], ref[key], err_msg=key)
    # neither loads: the error names the newest, exit 2 on every rank
    shutil.copy(cut / "ck.npz", cut / "ck.prev.npz")
    os.truncate(cut / "ck.prev.npz", 100)
    os.truncate(cut / "ck.npz", 100)
    rc, said = _finish(_train("--num_epochs", 3, "--resume", "ck.npz", cwd=cut))
    assert rc == 2 and "--resume: checkpoint 'ck.npz' is truncated or corrupt" in said, said


@needs_mpi
@root_only
def test_node_local_copies_that_differ_agree_on_the_newest(tmp_path, two_runs):
    """Rank 0's node holds a truncated newest and an older previous copy, rank 1's node
    the newest whole: every rank resumes from the newest (sent from rank 1), and the run
    ends with the weights of an uninterrupted one."""
    whole, cut, run = two_runs[0], two_runs[1], tmp_path / "run"
    nodes = [tmp_path / "node0", tmp_path / "node1"]
    for d in (run, *nodes, run / "ck"):
        d.mkdir()
    for name in ("ck.npz", "ck.prev.npz"):
        shutil.copy(cut / name, nodes[0] / name)
    shutil.copy(cut / "ck.npz", nodes[1] / "ck.npz")
    os.truncate(nodes[0] / "ck.npz", os.path.getsize(nodes[0] / "ck.npz") // 3)
    # each rank sees its own node's folder at run/ck (a private bind mount)
    bind = ["unshare", "-m", "sh", "-c",
            f'mount --bind {tmp_path}/node$PMI_RANK {run}/ck && exec "$@"', "rank"]
    rc, said = _finish(_train("--num_epochs", 2, "--resume", "ck/ck.npz",
                              "--every_rank_writes", cwd=run, prefix=bind))
    assert rc == 0, said
    assert "node-local checkpoints differ (rank 0: global step 12); every rank resumes from " \
           "global step 16, rank 1's copy, sent over MPI to rank 0" in said, said
    mine, ref = _model(nodes[0] / "ck.npz"), _model(whole / "ck.npz")
    for key in ref:
        np.testing.assert_array_equal(mine[key], ref[key], err_msg=key)


def _fake_mpiexec(tmp_path, first_fails_with):
    """An mpiexec that records its argv; its first run fails as a lost host would."""
    fake = tmp_path / "mpiexec"
    fake.write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path}/argv\n"
                    f"if [ ! -e {tmp_path}/ran ]; then touch {tmp_path}/ran; "
                    f"echo '{first_fails_with}' >&2; exit 1; fi\nexit 0\n")
    fake.chmod(0o755)
    return fake


@needs_mpi  # the checkpoints come from two_runs
def test_the_supervisor_resumes_the_previous_checkpoint_when_the_newest_will_not_load(
        tmp_path, two_runs):
    import io

    from distnn.launch.supervisor import Supervisor
    for name in ("ck.npz", "ck.prev.npz"):
        shutil.copy(two_runs[1] / name, tmp_path / name)
    os.truncate(tmp_path / "ck.npz", 1000)
    out = io.StringIO()
    sup = Supervisor(["a", "b", "c"], ["--checkpoint", str(tmp_path / "ck.npz")],
                     mpiexec=str(_fake_mpiexec(tmp_path, "[b] lost: killed")),
                     probe=lambda host: True, min_hosts=2, out=out)
    assert sup.run() == 0
    text = out.getvalue()
    assert f"restart 1/3: lost host b; {tmp_path}/ck.npz is truncated or corrupt" in text, text
    assert f"resuming from epoch 1 step 12 (global step 12) of {tmp_path}/ck.prev.npz, the " \
           "previous one on 2 hosts (a,c)" in text, text
    assert f"--resume {tmp_path}/ck.npz" in (tmp_path / "argv").read_text().splitlines()[1]


@needs_mpi  # the checkpoints come from two_runs
def test_the_supervisor_takes_a_host_back_with_node_local_checkpoints(tmp_path, two_runs):
    """The ranks agree on the newest node-local copy (above), so a host that answers again
    is taken back, as with shared storage."""
    import io

    from distnn.launch.supervisor import Supervisor
    shutil.copy(two_runs[1] / "ck.npz", tmp_path / "ck.npz")
    fake = tmp_path / "mpiexec"  # 1st run: host b lost; 2nd: fails, b answers; 3rd: ends
    fake.write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path}/argv\nn=$(wc -l < {tmp_path}/argv)\n"
                    "[ $n -eq 1 ] && { echo '[b] lost: killed' >&2; exit 1; }\n"
                    "[ $n -eq 2 ] && exit 1\nexit 0\n")
    fake.chmod(0o755)
    out = io.StringIO()
    sup = Supervisor(["a", "b", "c"], ["--checkpoint", str(tmp_path / "ck.npz"),
                                       "--every_rank_writes"], mpiexec=str(fake),
                     probe=lambda host: True, min_hosts=2, out=out)
    assert sup.run() == 0
    text = out.getvalue()
    assert "restart 1/3: lost host b;" in text and "on 2 hosts (a,c)" in text, text
    assert "restart 2/3: the job failed (exit 1), every host still answers; host b back" \
        in text and "on 3 hosts (a,b,c)" in text, text
