"""hvd.elastic under ``distnn launch`` on the emulated cluster: a host killed (every
process of it, kill -9) and dropped from the discovery script makes the next world start
on the other hosts from the last commit, bit for bit; listed again, the host joins a third
world. The job is tests/torch/progs/elastic_prog.py."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from cluster_util import DISTNN, MPIEXEC, NET, PREFIX, ROOT, needs_cluster
from helpers import reaped

from distnn.cluster import EmulatedCluster

pytest.importorskip("torch")
PROG = ROOT / "tests" / "torch" / "progs" / "elastic_prog.py"


def _records(path):
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line]
    except (OSError, ValueError):
        return []


def _wait(proc, cond, seconds=240):
    end = time.monotonic() + seconds
    while time.monotonic() < end and proc.poll() is None:
        if cond():
            return
        time.sleep(0.1)
    raise AssertionError("the job never got there")


@pytest.mark.long  # a killed rank restarts the world: tests/torch/test_elastic.py
@needs_cluster
def test_a_killed_host_restarts_from_the_last_commit_and_comes_back(tmp_path):
    h1, h2, h3 = (f"{PREFIX}{i}" for i in (1, 2, 3))
    listed = tmp_path / "hosts.txt"
    listed.write_text(f"{h1}\n{h2}\n{h3}\n")
    script = tmp_path / "discover.sh"
    script.write_text(f"#!/bin/sh\ncat {listed}\n")
    script.chmod(0o755)
    events = tmp_path / "events.jsonl"
    with EmulatedCluster(3, rate=None, prefix=PREFIX, net=NET) as cluster:
        proc = subprocess.Popen(
            [DISTNN, "launch", "--cluster", PREFIX, "--mpiexec", MPIEXEC,
             "--host_discovery_script", str(script), "--discovery_interval", "0.2", "--",
             sys.executable, str(PROG), "job", "--out", str(tmp_path), "--samples", "240",
             "--sleep", "0.3"], cwd=tmp_path, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True)
        with reaped(proc):
            _wait(proc, lambda: any(e.get("commit", 0) >= 4 for e in _records(events)))
            listed.write_text(f"{h1}\n{h3}\n")
            assert cluster.kill(h2)
            _wait(proc, lambda: (tmp_path / "r0.w1.jsonl").exists())
            listed.write_text(f"{h1}\n{h2}\n{h3}\n")
            out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    assert f"restart 1/3: lost host {h2}" in err, err[-3000:]
    assert f"hosts changed (added {h2})" in err, err[-3000:]
    committing = {e["committing"]: e["weights"] for e in _records(events)
                  if "committing" in e and e["world"] == 0}
    for r in range(2):  # world 1: h1 and h3, from a commit world 0 made, bit for bit
        start = _records(tmp_path / f"r{r}.w1.jsonl")[0]
        assert start["size"] == 2 and start["weights"] == committing[start["start"]]
    start = _records(tmp_path / "r2.w2.jsonl")[0]
    assert start["size"] == 3 and start["start"] > 0
    assert _records(events)[-1]["done"] > start["start"]
