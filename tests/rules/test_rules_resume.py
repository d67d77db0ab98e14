"""Checkpoint and exact --resume under the deterministic rules: 2 epochs in one run equal
1 epoch, a checkpoint, and a resumed run to 2 epochs (3 ranks, real mpiexec)."""
from __future__ import annotations

import numpy as np
import pytest

from rulejobs import OUT, Jobs
from helpers import needs_mpi

pytestmark = needs_mpi

RULES = {
    "localsgd": {"sync_every": 3},
    "easgd": {"synchronous": True, "sync_every": 2},
    "gossip": {"synchronous": True, "probability": 0.5},
    "downpour": {"synchronous": True},
    "diloco": {"sync_every": 4},  # each rank's inner AdamW and the outer momentum carry over
}
COMMON = {"n": 45, "batch": 4, "lr": 0.1, "momentum": 0.9, "shuffle": True}


def _jobs():
    jobs = []
    for rule, options in RULES.items():
        ckpt = f"{OUT}/test_rules_resume.{rule}.ckpt.npz"
        base = {**COMMON, "rule": rule, "options": options}
        jobs += [{**base, "name": f"{rule}_straight", "epochs": 2},
                 {**base, "name": f"{rule}_first", "epochs": 1, "checkpoint": ckpt},
                 {**base, "name": f"{rule}_resumed", "epochs": 2, "resume": ckpt}]
    return jobs


BATCHED = Jobs(3, _jobs(), "test_rules_resume")  # in the folder's 3-rank launch


@pytest.fixture(scope="module")
def runs(rule_batch):
    return BATCHED.results(rule_batch)


@pytest.mark.parametrize("rule", sorted(RULES))
def test_resume_is_exact(runs, rule):
    straight, resumed = runs[f"{rule}_straight"], runs[f"{rule}_resumed"]
    first = runs[f"{rule}_first"]
    for r in range(3):
        np.testing.assert_allclose(resumed[r]["final"], straight[r]["final"], rtol=0,
                                   atol=1e-12)
        if len(straight[r]["local"]):  # each replica continued from its own state
            np.testing.assert_allclose(resumed[r]["local"], straight[r]["local"], rtol=0,
                                       atol=1e-12)
    assert np.abs(first[0]["final"] - straight[0]["final"]).max() > 1e-4
    assert [h["epoch"] for h in resumed[0]["history"]] == [1, 2]
