"""The point-to-point rules under real mpiexec with 2, 3 and 4 ranks, one worker made 5x
slower and shards of uneven size: every run ends, and no message is lost or applied twice."""
from __future__ import annotations

import numpy as np
import pytest

from rulejobs import PROG, Jobs
from helpers import MPIEXEC, child_env, needs_mpi

pytestmark = needs_mpi

# 43 samples, 3 per worker: the last global batch leaves some workers short or empty.
COMMON = {"n": 43, "batch": 3, "epochs": 2, "lr": 0.1, "momentum": 0.9, "slow_rank": 1,
          "slow_factor": 5.0}
JOBS = [
    {"name": "downpour", "rule": "downpour", "options": {"sync_every": 2}},
    {"name": "downpour_sync", "rule": "downpour", "options": {"synchronous": True}},
    {"name": "gem", "rule": "gem", "options": {}},
    {"name": "easgd", "rule": "easgd", "options": {"sync_every": 2}},
    {"name": "gossip", "rule": "gossip", "options": {"probability": 0.5}},
    {"name": "localsgd", "rule": "localsgd", "options": {"sync_every": 3}},
]


# every job on 2, 3 and 4 ranks, in the folder's launch for that number of ranks
BATCHED = {n: Jobs(n, [{**COMMON, **job} for job in JOBS], f"test_rules_mpi.np{n}",
                   timeout=120) for n in (2, 3, 4)}


@pytest.fixture(scope="module", params=[2, 3, 4], ids=lambda n: f"np{n}")
def runs(request, rule_batch):
    n = request.param
    return n, BATCHED[n].results(rule_batch)


def test_every_rank_ends_with_the_reported_model(runs):
    n, res = runs
    for name, ranks in res.items():
        final = ranks[0]["final"]
        assert np.isfinite(final).all(), name
        assert np.abs(final - ranks[0]["initial"]).max() > 1e-3, name  # it trained
        for r in range(1, n):
            np.testing.assert_array_equal(ranks[r]["final"], final, err_msg=name)
        assert all(len(rk["history"]) == COMMON["epochs"] for rk in ranks), name


@pytest.mark.parametrize("name", ["downpour", "gem", "easgd"])
def test_master_applies_every_message_once(runs, name):
    n, res = runs
    ranks = res[name]
    pushes = [rk["stats"]["pushes"] for rk in ranks[1:]]
    master = ranks[0]["stats"]
    assert master["updates"] == master["messages_applied"] == sum(pushes) > 0
    assert master["received"] == sum(pushes)
    # the master waited without spinning: it slept through most of its serving time
    assert master["idle_s"] > 0 and master["serve_cpu_s"] < master["serve_s"]


def test_synchronous_master_waits_for_every_worker(runs):
    n, res = runs
    ranks = res["downpour_sync"]
    master = ranks[0]["stats"]
    pushes = [rk["stats"]["pushes"] for rk in ranks[1:]]
    assert master["messages_applied"] == sum(pushes)
    # one update per round; a round holds one message of every worker still training
    steps_per_epoch = -(-COMMON["n"] // (COMMON["batch"] * (n - 1)))
    assert master["updates"] == COMMON["epochs"] * steps_per_epoch


def test_gossip_merges_every_push(runs):
    n, res = runs
    ranks = res["gossip"]
    pushes = sum(rk["stats"]["pushes"] for rk in ranks)
    merges = sum(rk["stats"]["merges"] for rk in ranks)
    assert pushes == merges > 0


def test_a_failing_worker_ends_the_job_within_seconds(tmp_path):
    import json
    import subprocess
    import sys
    import time

    job = {**COMMON, "name": "fail", "rule": "downpour", "options": {}, "fail_rank": 2,
           "epochs": 50, "slow_rank": None}
    t0 = time.perf_counter()
    proc = subprocess.run([MPIEXEC, "-n", "3", sys.executable, str(PROG), str(tmp_path),
                           json.dumps([job])], capture_output=True, text=True, timeout=60,
                          env=child_env())
    elapsed = time.perf_counter() - t0
    assert proc.returncode != 0
    assert "[rank 2]" in proc.stderr and "worker failed on purpose" in proc.stderr
    assert elapsed < 30  # the master, asleep between polls, is killed with the job
