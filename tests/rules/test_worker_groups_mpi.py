"""Workers that are groups of ranks (``group_size``, NNLO's --n-processes) and several
masters (``masters``, NNLO's --n-masters) under real mpiexec, on the tiny float64 model of
rule_prog.py: group_size=1 and masters=1 are today's rules bit for bit, a group of K ranks
with batch B makes the updates of one worker with batch K*B, the top master receives fewer
messages, and a killed sub-master ends the job on every rank."""
from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pytest

from rulejobs import OUT, PROG, Jobs
from helpers import MPIEXEC, child_env, needs_mpi

pytestmark = needs_mpi

COMMON = {"n": 48, "epochs": 2, "lr": 0.1, "momentum": 0.9}
RULES = [("downpour", {"sync_every": 2}), ("easgd", {"sync_every": 2}), ("gem", {})]
# The jobs of the tests below run in the folder's launches, one per number of ranks
# (tests/rules/conftest.py); the refusal and the killed sub-master keep launches of their
# own.
OWNER = "test_worker_groups_mpi"


def _k1_jobs():
    jobs = []
    for rule, opts in RULES:
        jobs.append({**COMMON, "batch": 4, "name": f"{rule}_plain", "rule": rule,
                     "options": opts})
        extra = {"group_size": 1} if rule == "gem" else {"group_size": 1, "masters": 1}
        jobs.append({**COMMON, "batch": 4, "name": f"{rule}_k1", "rule": rule,
                     "options": {**opts, **extra}})
    return jobs


K1 = Jobs(2, _k1_jobs(), f"{OWNER}.k1")


def test_group_size_1_and_one_master_are_todays_rules_bit_for_bit(rule_batch):
    # 2 ranks: one worker, so the asynchronous master's order is fixed
    res = K1.results(rule_batch)
    for rule, _ in RULES:
        for r in range(2):
            plain, k1 = res[f"{rule}_plain"][r], res[f"{rule}_k1"][r]
            assert np.abs(plain["final"] - plain["initial"]).max() > 1e-3, rule
            np.testing.assert_array_equal(k1["final"], plain["final"], err_msg=rule)
            np.testing.assert_array_equal(k1["local"], plain["local"], err_msg=rule)
        assert res[f"{rule}_k1"][0]["stats"]["updates"] \
            == res[f"{rule}_plain"][0]["stats"]["updates"]


GROUP = {rule: (Jobs(3, [{**COMMON, "batch": 4, "name": "group", "rule": rule,
                          "options": {**opts, "group_size": 2}}], f"{OWNER}.group_{rule}"),
                 Jobs(2, [{**COMMON, "batch": 8, "name": "one", "rule": rule,
                           "options": opts}], f"{OWNER}.group_{rule}"))
         for rule, opts in RULES}


@pytest.mark.parametrize("rule,opts", RULES, ids=[r for r, _ in RULES])
def test_a_group_of_two_ranks_makes_the_updates_of_one_worker_with_twice_the_batch(
        rule_batch, rule, opts):
    g = GROUP[rule][0].results(rule_batch)["group"]
    o = GROUP[rule][1].results(rule_batch)["one"]
    assert np.abs(o[0]["final"] - o[0]["initial"]).max() > 1e-2
    np.testing.assert_allclose(g[0]["final"], o[0]["final"], rtol=0, atol=1e-12)
    for r in (1, 2):  # both ranks of the group hold the one worker's weights
        np.testing.assert_allclose(g[r]["local"], o[1]["local"], rtol=0, atol=1e-12)
    # only the leader talks to the master
    assert g[1]["stats"]["pushes"] == o[1]["stats"]["pushes"] > 0
    assert g[2]["stats"]["pushes"] == 0 and g[2]["stats"]["group_reductions"] > 0


SYNC = (Jobs(5, [{**COMMON, "batch": 3, "name": "g", "rule": "downpour",
                  "options": {"synchronous": True, "group_size": 2}}], f"{OWNER}.sync"),
        Jobs(3, [{**COMMON, "batch": 6, "name": "p", "rule": "downpour",
                  "options": {"synchronous": True}}], f"{OWNER}.sync"))


def test_two_groups_under_a_synchronous_master_are_two_workers_with_twice_the_batch(
        rule_batch):
    grouped = SYNC[0].results(rule_batch)["g"]
    plain = SYNC[1].results(rule_batch)["p"]
    np.testing.assert_allclose(grouped[0]["final"], plain[0]["final"], rtol=0, atol=1e-12)
    assert grouped[0]["stats"]["received"] == plain[0]["stats"]["received"]


AVERAGING = [("localsgd", {"sync_every": 3}),
             ("gossip", {"synchronous": True, "probability": 1.0})]
AVERAGED = {rule: (Jobs(4, [{**COMMON, "batch": 3, "name": "g", "rule": rule,
                             "options": {**opts, "group_size": 2}},
                            {**COMMON, "batch": 3, "name": "k1", "rule": rule,
                             "options": {**opts, "group_size": 1}},
                            {**COMMON, "batch": 3, "name": "plain", "rule": rule,
                             "options": opts}], f"{OWNER}.averaging_{rule}"),
                   Jobs(2, [{**COMMON, "batch": 6, "name": "two", "rule": rule,
                             "options": opts}], f"{OWNER}.averaging_{rule}"))
            for rule, opts in AVERAGING}


@pytest.mark.parametrize("rule,opts", AVERAGING, ids=[r for r, _ in AVERAGING])
def test_averaging_rules_with_groups_are_their_groups_leaders_with_twice_the_batch(
        rule_batch, rule, opts):
    # 4 ranks in 2 groups (average inside, exchange outside) = 2 ranks with batch 2B;
    # group_size=1 is the rule as it was, bit for bit
    four = AVERAGED[rule][0].results(rule_batch)
    two = AVERAGED[rule][1].results(rule_batch)["two"]
    assert np.abs(two[0]["final"] - two[0]["initial"]).max() > 1e-2
    for r in range(4):
        np.testing.assert_allclose(four["g"][r]["final"], two[0]["final"], rtol=0, atol=1e-12)
        np.testing.assert_allclose(four["g"][r]["local"], two[r // 2]["local"], rtol=0,
                                   atol=1e-12)
        np.testing.assert_array_equal(four["k1"][r]["final"], four["plain"][r]["final"])
        np.testing.assert_array_equal(four["k1"][r]["local"], four["plain"][r]["local"])


ASYNC_GOSSIP = Jobs(4, [{**COMMON, "batch": 3, "name": "a", "rule": "gossip",
                         "options": {"probability": 0.5, "group_size": 2}}],
                    f"{OWNER}.async_gossip")


def test_asynchronous_gossip_between_groups_ends_with_one_model(rule_batch):
    res = ASYNC_GOSSIP.results(rule_batch)["a"]
    for r in range(4):
        np.testing.assert_array_equal(res[r]["final"], res[0]["final"])
    assert res[1]["stats"]["pushes"] == res[3]["stats"]["pushes"] == 0  # not leaders
    assert res[0]["stats"]["pushes"] + res[2]["stats"]["pushes"] > 0


def test_a_layout_that_leaves_a_rank_out_of_every_group_is_refused(tmp_path):
    job = {**COMMON, "batch": 4, "name": "bad", "rule": "downpour",
           "options": {"group_size": 2}}
    proc = subprocess.run([MPIEXEC, "-n", "4", sys.executable, str(PROG), str(tmp_path),
                           __import__("json").dumps([job])], capture_output=True, text=True,
                          timeout=60, env=child_env())
    assert proc.returncode != 0
    assert "3 worker rank(s) (1, 2, 3), which do not make whole groups of 2" in proc.stderr


SUB_MASTERS = {rule: Jobs(6, [{**COMMON, "n": 64, "batch": 4, "name": "m", "rule": rule,
                                "options": {"masters": 2, "sync_every": 2}}],
                          f"{OWNER}.sub_masters_{rule}") for rule in ("downpour", "easgd")}


@pytest.mark.parametrize("rule", ["downpour", "easgd"])
def test_two_sub_masters_send_the_top_master_fewer_messages(rule_batch, rule):
    # 6 ranks: top master 0, sub-masters 1 and 2, workers 3, 4 (sub-master 1) and 5 (2)
    job = SUB_MASTERS[rule].job("m")
    res = SUB_MASTERS[rule].results(rule_batch)["m"]
    final = res[0]["final"]
    assert np.abs(final - res[0]["initial"]).max() > 1e-2
    for r in range(6):
        np.testing.assert_array_equal(res[r]["final"], final)
    top, subs, workers = res[0]["stats"], res[1:3], res[3:]
    pushes = sum(w["stats"]["pushes"] for w in workers)
    ups = sum(s["stats"]["ups"] for s in subs)
    # each sub-master applied its workers' messages and went up once per 2 updates (and
    # once more at the end of an epoch with an odd count)
    assert sum(s["stats"]["messages_applied"] for s in subs) == pushes
    for s in subs:
        updates = s["stats"]["updates"]
        assert updates / 2 <= s["stats"]["ups"] <= updates / 2 + job["epochs"]
    assert top["top_received"] == top["messages_applied"] == ups
    assert ups < pushes  # one master would have received every push


def test_a_killed_sub_master_ends_the_job(tmp_path):
    job = {**COMMON, "n": 4000, "batch": 2, "epochs": 50, "name": "k", "rule": "downpour",
           "options": {"masters": 2}, "kill_rank": 2, "kill_after": 2.0}
    t0 = time.perf_counter()
    proc = subprocess.run([MPIEXEC, "-n", "6", sys.executable, str(PROG), str(tmp_path),
                           __import__("json").dumps([job])], capture_output=True, text=True,
                          timeout=90, env=child_env())
    elapsed = time.perf_counter() - t0
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    # every rank ended (no hang); mpiexec says a process was killed (it names a PID, not
    # always the killed rank's: the others die of its cleanup)
    assert (tmp_path / "pid.rank2").is_file()
    assert "BAD TERMINATION" in out and "Killed (signal 9)" in out, out
    assert elapsed < 60, out


RESUMES = [
    (4, "localsgd", {"sync_every": 3}),
    (4, "gossip", {"synchronous": True, "probability": 0.5}),
    (3, "easgd", {"sync_every": 2}),   # one group: the master's order is fixed
    (3, "downpour", {}),
]


def _resume_jobs(n, rule, opts):
    ckpt = f"{OUT}/{OWNER}.resume_{rule}.ck.npz"
    base = {**COMMON, "batch": 3, "rule": rule, "options": {**opts, "group_size": 2},
            "shuffle": True}
    return [{**base, "name": "straight", "epochs": 2},
            {**base, "name": "first", "epochs": 1, "checkpoint": ckpt},
            {**base, "name": "resumed", "epochs": 2, "resume": ckpt}]


RESUMED = {rule: Jobs(n, _resume_jobs(n, rule, opts), f"{OWNER}.resume_{rule}")
           for n, rule, opts in RESUMES}


@pytest.mark.parametrize("n,rule,opts", RESUMES, ids=["localsgd", "gossip", "easgd",
                                                      "downpour"])
def test_groups_resume_exactly(rule_batch, n, rule, opts):
    res = RESUMED[rule].results(rule_batch)
    for r in range(n):
        np.testing.assert_allclose(res["resumed"][r]["final"], res["straight"][r]["final"],
                                   rtol=0, atol=1e-12)
        np.testing.assert_allclose(res["resumed"][r]["local"], res["straight"][r]["local"],
                                   rtol=0, atol=1e-12)
    assert np.abs(res["first"][0]["final"] - res["straight"][0]["final"]).max() > 1e-4
