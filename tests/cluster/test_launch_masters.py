"""distnn launch with several masters (NNLO's --n-masters) on the emulated cluster: a
killed sub-master ends the job on every rank, the supervisor names it with its role and
restarts the run from its last checkpoint like any lost rank, on the same hosts (which
still answer)."""
from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest
from cluster_util import DISTNN, MPIEXEC, NET, PREFIX, needs_cluster
from helpers import pids_of_rank, reaped

from distnn.cluster import EmulatedCluster

pytestmark = [needs_cluster, pytest.mark.slow]

MODEL = ("from distnn.nn import Dense, Flatten, ReLU, Sequential\n\n\n"
         "def get_model():\n"
         "    return Sequential([Flatten(), Dense(16), ReLU(), Dense(3)])\n")


@pytest.mark.long  # naming the role: test_launch_roles.py; restarts: test_launch.py
def test_a_killed_sub_master_is_restarted_from_the_last_checkpoint(tmp_path):
    (tmp_path / "mlp.py").write_text(MODEL)
    ck = tmp_path / "ck.npz"
    train = ["train", "--model", "mlp.py", "--dataset", "synthetic", "--input_shape",
             "1,8,8", "--num_classes", "3", "--num_samples", "3000", "--batch_size", "8",
             "--num_epochs", "12", "--mode", "downpour", "--n-masters", "2",
             "--validation_split", "0", "--evaluate", "false", "--checkpoint", "ck.npz",
             "--quiet"]
    with EmulatedCluster(2, rate="1gbit", prefix=PREFIX, net=NET) as c:
        # 6 ranks: the top master 0, sub-masters 1 and 2, workers 3, 4, 5
        proc = subprocess.Popen([DISTNN, "launch", "--cluster", PREFIX, "--mpiexec", MPIEXEC,
                                 "--ranks_per_host", "3", "--max_restarts", "2", "--", *train],
                                cwd=tmp_path, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        with reaped(proc):
            deadline = time.monotonic() + 240
            while not ck.exists() and time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.1)
            assert ck.exists(), "no checkpoint was written"
            pids = pids_of_rank(1, pids=[p for h in c.hosts for p in c.pids(h.name)])
            assert pids, "sub-master rank 1 not found"
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
            out, err = proc.communicate(timeout=300)
    text = out + err
    assert proc.returncode == 0, text[-3000:]
    assert "distnn launch: lost rank 1 (host " in text and ("), sub-master of workers 3,4 "
                                                           "(master group 0 of 2): ended by "
                                                           "signal 9 (Killed)") in text, \
        text[-3000:]
    assert "restart 1/2: the job failed" in text and "every host still answers" in text, \
        text[-3000:]
    assert "finished on 2 hosts after 1 restart" in text, text[-3000:]
