"""A rank killed under ``distnn launch`` is named with its role: the rank's watcher
(launch/rankwatch.py) says which rank ended by which signal, and what it did, before hydra
kills the others. Runs on this machine (a launcher program that runs the command in place
of ssh), no emulated cluster; and the watcher alone under plain mpiexec."""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest
from helpers import MPIEXEC, child_env, needs_mpi, pids_of_rank, reaped


pytestmark = needs_mpi

MODEL = ("from distnn.nn import Dense, Flatten, Sequential\n\n\n"
         "def get_model():\n"
         "    return Sequential([Flatten(), Dense(3)])\n")
# hydra runs this as it would run ssh ([options] host command...); a probe too
LAUNCHER = ('#!/bin/sh\nwhile [ $# -gt 0 ]; do case "$1" in -*) shift ;; *) break ;; esac; '
            'done\nshift\nexec sh -c "$*"\n')


@pytest.mark.mpi
@pytest.mark.slow
def test_a_killed_sub_master_is_named_with_its_role(tmp_path):
    (tmp_path / "mlp.py").write_text(MODEL)
    (tmp_path / "ssh").write_text(LAUNCHER)
    os.chmod(tmp_path / "ssh", 0o755)
    ck = tmp_path / "ck.npz"
    mark = f"DISTNN_TEST_MARK={os.getpid()}-{time.monotonic_ns()}"
    # 5 ranks, NNLO's spellings: top master 0, sub-masters 1 and 2, workers 3 and 4
    train = ["--model", "mlp.py", "--dataset", "synthetic", "--input_shape", "1,4,4",
             "--num_classes", "3", "--num_samples", "200", "--batch_size", "4",
             "--num_epochs", "1000", "--mode", "downpour", "--n-masters", "2",
             "--validation_split", "0", "--evaluate", "false", "--checkpoint", str(ck),
             "--quiet"]
    env = child_env(**dict([mark.split("=", 1)]))
    env["PATH"] = os.path.dirname(MPIEXEC) + os.pathsep + env.get("PATH", "")
    proc = subprocess.Popen(
        [os.path.join(os.path.dirname(MPIEXEC), "distnn"), "launch", "--hosts", "localhost",
         "--ranks_per_host", "5", "--max_restarts", "0", "--mpiexec", MPIEXEC,
         "--launcher_args", f"-launcher ssh -launcher-exec {tmp_path / 'ssh'}", "--", "train",
         *train], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    with reaped(proc):
        deadline = time.monotonic() + 180
        while not ck.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        if not ck.exists():
            proc.kill()
            raise AssertionError("no checkpoint was written: " + "".join(proc.communicate()))
        pids = pids_of_rank(2, mark)
        assert pids, "sub-master rank 2 not found"
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=60)
    text = out + err
    assert proc.returncode == 9, text[-3000:]
    assert f"distnn: rank 2 (pid {pids[0]}, host {socket.gethostname()}), sub-master" in err
    lines = [ln for ln in err.splitlines() if "lost rank" in ln]
    assert lines == [f"distnn launch: lost rank 2 (host {socket.gethostname()}), sub-master "
                     "of worker 4 (master group 1 of 2): ended by signal 9 (Killed)"], \
        text[-3000:]
    assert "the restart budget (--max_restarts 0) is spent" in err, text[-3000:]


# a rank that writes its role where its watcher says, then is killed
KILLED = ("import os, signal, sys\n"
          "from mpi4py import MPI\n"
          "MPI.COMM_WORLD.Barrier()\n"
          "if MPI.COMM_WORLD.rank == 1:\n"
          "    fd = int(os.environ['DISTNN_ROLE_FD'].split(':')[0])\n"
          "    os.write(fd, b'worker\\nsub-master of workers 3,4\\n')\n"
          "    os.kill(os.getpid(), signal.SIGKILL)\n"
          "MPI.COMM_WORLD.Barrier()\n")


@pytest.mark.mpi
def test_under_plain_mpiexec_the_watcher_names_the_rank_a_signal_ended(tmp_path):
    (tmp_path / "prog.py").write_text(KILLED)
    proc = subprocess.run([MPIEXEC, "-n", "3", sys.executable, "-m", "distnn.launch.rankwatch",
                           sys.executable, "prog.py"], cwd=tmp_path, env=child_env(),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 9, proc.stdout + proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if "ended by" in ln]
    assert len(lines) == 1 and re.fullmatch(
        rf"distnn: rank 1 \(pid \d+, host {re.escape(socket.gethostname())}\), sub-master of "
        r"workers 3,4: ended by signal 9 \(Killed\)", lines[0]), proc.stderr
