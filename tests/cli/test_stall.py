"""The stall inspector through the real command: a rank stopped with SIGSTOP is named (with
where it was) within --stall_warning + 2 s, and --stall_timeout ends the job with exit
status 4 naming it, the checkpoint still resumable."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from helpers import COMMAND, MPIEXEC, child_env
from helpers import needs_mpiexec as needs_mpi

from distnn.training import load_checkpoint

WARNING, TIMEOUT = 2.0, 7.0
RUN = ["--dataset", "fashion_mnist", "--model", "simplemlp", "--global_batch_size", "32",
       "--steps_per_epoch", "50", "--num_epochs", "1000", "--evaluate", "false",
       "--validation_split", "0", "--quiet", "--checkpoint", "ck.npz", "--checkpoint_steps",
       "10", "--stall_warning", str(WARNING), "--stall_timeout", str(TIMEOUT)]


def rank_pid(cwd: Path, rank: int) -> int | None:
    """The pid of the process of rank ``rank`` (PMI_RANK) running in ``cwd``."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.readlink(entry / "cwd") != str(cwd):
                continue
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"PMI_RANK={rank}".encode() in environ and b"distnn" in (entry / "cmdline").read_bytes():
            return int(entry.name)
    return None


@pytest.mark.mpi
@pytest.mark.slow  # the warning and the timeout are waited for, by design
@needs_mpi
@pytest.mark.parametrize("ranks,rule,victim", [(2, "data", 1), (3, "data", 2),
                                               (3, "downpour", 0)])
def test_a_stopped_rank_is_named_and_the_timeout_ends_the_job(tmp_path, ranks, rule, victim):
    # under downpour the workers wait for the master (rank 0), point to point
    args = [*RUN, "--parallel", rule]
    if rule != "data":
        args = [a for a in args if a not in ("--checkpoint_steps", "10")]
    proc = subprocess.Popen([MPIEXEC, "-n", str(ranks), *COMMAND, "train", *args], cwd=tmp_path,
                            env=child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    lines: list[tuple[float, str]] = []
    reader = threading.Thread(target=lambda: [lines.append((time.monotonic(), line))
                                              for line in proc.stderr], daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 90
        while not (tmp_path / "ck.npz").exists() and time.monotonic() < deadline:  # training
            assert proc.poll() is None, "".join(line for _, line in lines)
            time.sleep(0.05)
        pid = rank_pid(tmp_path, victim)
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        stopped = time.monotonic()
        rc = proc.wait(timeout=TIMEOUT + 30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    reader.join(5)
    text = "".join(line for _, line in lines)
    assert rc == 4, text
    named = [(t, line) for t, line in lines if "stall:" in line and f"rank {victim} (host" in line]
    assert named, text
    assert named[0][0] - stopped <= WARNING + 2, text
    assert re.search(rf"rank {victim} \(host [^)]+\): step \d+, [a-z ]+( \d+)?, [\d.]+ s ago",
                     named[0][1]), named[0][1]
    assert f"stall timeout: rank {victim} did not arrive" in text, text
    assert "--resume ck.npz" in text
    state = load_checkpoint(tmp_path / "ck.npz")  # whole, resumable
    assert state.epoch_step or state.epochs_done
