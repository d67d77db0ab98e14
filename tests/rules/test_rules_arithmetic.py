"""Degenerate cases that pin each rule's protocol to arithmetic, under real mpiexec,
against a NumPy reference in float64 (1e-10)."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from rulejobs import Jobs
from helpers import needs_mpi

sys.path.insert(0, str(Path(__file__).parent / "progs"))
from rule_prog import CLASSES, FEATURES, data  # noqa: E402

pytestmark = needs_mpi
TOL = 1e-10


def grad(flat: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Gradient of the mean softmax cross-entropy of a Dense layer (w, then b, flat)."""
    w = flat[:FEATURES * CLASSES].reshape(FEATURES, CLASSES)
    b = flat[FEATURES * CLASSES:]
    z = x @ w + b
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    p[np.arange(len(y)), y] -= 1
    p /= len(y)
    return np.concatenate([(x.T @ p).ravel(), p.sum(axis=0)])


class SGDRef:
    """torch.optim.SGD arithmetic (buf = g on the first step)."""

    def __init__(self, lr, momentum):
        self.lr, self.m, self.buf = lr, momentum, None

    def step(self, w, g):
        if self.m:
            self.buf = g.copy() if self.buf is None else self.m * self.buf + g
            g = self.buf
        return w - self.lr * g


def shards(n, gbs, size, epochs):
    """Per step, per rank: (x, y) of np.array_split(global batch, size) (no shuffle)."""
    x, y = data(n)
    steps = []
    for _ in range(epochs):
        for lo in range(0, n, gbs):
            xb, yb = x[lo:lo + gbs], y[lo:lo + gbs]
            steps.append(list(zip(np.array_split(xb, size), np.array_split(yb, size))))
    return steps


JOBS = {
    2: [
        {"name": "downpour1", "rule": "downpour", "options": {"sync_every": 1}, "n": 40,
         "batch": 5, "epochs": 2, "lr": 0.2, "momentum": 0.9},
        {"name": "gossip2", "rule": "gossip", "n": 40, "batch": 4, "epochs": 2, "lr": 0.2,
         "momentum": 0.9, "options": {"probability": 1.0, "alpha": 0.5, "synchronous": True}},
        {"name": "easgd_sync0", "rule": "easgd", "n": 40, "batch": 4, "epochs": 2, "lr": 0.2,
         "momentum": 0.9, "options": {"elastic_force": 0.0, "synchronous": True,
                                      "sync_every": 2}},
    ],
    3: [
        {"name": "localsgd1", "rule": "localsgd", "options": {"sync_every": 1}, "n": 48,
         "batch": 4, "epochs": 2, "lr": 0.2, "momentum": 0.9},
        {"name": "data", "rule": "data", "n": 48, "batch": 4, "epochs": 2, "lr": 0.2,
         "momentum": 0.9},
        {"name": "easgd_async0", "rule": "easgd", "n": 40, "batch": 4, "epochs": 2, "lr": 0.2,
         "momentum": 0.9, "options": {"elastic_force": 0.0, "sync_every": 3}},
        {"name": "downpour_sync", "rule": "downpour", "n": 48, "batch": 4, "epochs": 2,
         "lr": 0.2, "momentum": 0.9, "options": {"synchronous": True}},
    ],
}


# the jobs of JOBS[n] in the folder's launch on n ranks
BATCHED = {n: Jobs(n, JOBS[n], f"test_rules_arithmetic.np{n}") for n in (2, 3)}


@pytest.fixture(scope="module")
def np2(rule_batch):
    """Every 2-rank job of JOBS, in the folder's 2-rank launch."""
    return 2, BATCHED[2].results(rule_batch)


@pytest.fixture(scope="module")
def np3(rule_batch):
    return 3, BATCHED[3].results(rule_batch)


def _job(results, name):
    n, res = results
    job = next(j for j in JOBS[n] if j["name"] == name)
    return n, job, res[name]


def test_downpour_one_worker_is_sgd_on_the_master(np2):
    n, job, ranks = _job(np2, "downpour1")
    w = ranks[0]["initial"]
    opt = SGDRef(job["lr"], job["momentum"])
    for step in shards(job["n"], job["batch"], 1, job["epochs"]):
        (xb, yb), = step
        w = opt.step(w, grad(w, xb, yb))
    for r in range(n):  # the worker ends with the master's weights too
        np.testing.assert_allclose(ranks[r]["final"], w, rtol=0, atol=TOL)
    assert ranks[0]["stats"]["updates"] == job["epochs"] * job["n"] // job["batch"]


def _data_parallel(job, w, gbs):
    """The weights of SGD-momentum from ``w`` in one process over the job's epochs, in
    global batches of ``gbs`` samples: what a data-parallel rule ends with."""
    opt = SGDRef(job["lr"], job["momentum"])
    x, y = data(job["n"])
    for _ in range(job["epochs"]):
        for lo in range(0, job["n"], gbs):
            w = opt.step(w, grad(w, x[lo:lo + gbs], y[lo:lo + gbs]))
    return w


def test_localsgd_every_step_is_data_parallel(np3):
    n, job, ranks = _job(np3, "localsgd1")
    _, _, data_ranks = _job(np3, "data")
    w = _data_parallel(job, ranks[0]["initial"], job["batch"] * n)
    for r in range(n):
        np.testing.assert_allclose(ranks[r]["final"], w, rtol=0, atol=TOL)
        np.testing.assert_allclose(data_ranks[r]["final"], w, rtol=0, atol=TOL)


def test_gossip_two_ranks_p1_is_the_pairwise_average(np2):
    n, job, ranks = _job(np2, "gossip2")
    w0 = ranks[0]["initial"]
    reps = [w0.copy(), w0.copy()]
    opts = [SGDRef(job["lr"], job["momentum"]) for _ in range(2)]
    for step in shards(job["n"], job["batch"] * 2, 2, job["epochs"]):
        reps = [opts[i].step(reps[i], grad(reps[i], *step[i])) for i in range(2)]
        avg = (reps[0] + reps[1]) / 2
        reps = [avg.copy(), avg.copy()]
    for r in range(2):
        np.testing.assert_allclose(ranks[r]["final"], reps[0], rtol=0, atol=TOL)
        np.testing.assert_allclose(ranks[r]["local"], reps[0], rtol=0, atol=TOL)
    steps = job["epochs"] * job["n"] // (job["batch"] * 2)
    assert [rk["stats"]["pushes"] for rk in ranks] == [steps, steps]
    assert [rk["stats"]["merges"] for rk in ranks] == [steps, steps]


def _independent(job, n_workers, first_worker_rank, ranks):
    w0 = ranks[0]["initial"]
    reps = [w0.copy() for _ in range(n_workers)]
    opts = [SGDRef(job["lr"], job["momentum"]) for _ in range(n_workers)]
    for step in shards(job["n"], job["batch"] * n_workers, n_workers, job["epochs"]):
        reps = [opts[i].step(reps[i], grad(reps[i], *step[i])) if len(step[i][1]) else reps[i]
                for i in range(n_workers)]
    for i in range(n_workers):
        np.testing.assert_allclose(ranks[first_worker_rank + i]["local"], reps[i], rtol=0,
                                   atol=TOL)
    assert np.abs(reps[0] - w0).max() > 1e-2  # the workers did move, apart
    assert np.abs(reps[0] - reps[-1]).max() > 1e-3


def test_easgd_force_zero_synchronous_is_independent_workers(np2):
    n, job, ranks = _job(np2, "easgd_sync0")
    _independent(job, n, 0, ranks)
    for r in range(n):  # the centre never moved: the final model is the initial one
        np.testing.assert_allclose(ranks[r]["final"], ranks[0]["initial"], rtol=0, atol=TOL)


def test_easgd_force_zero_asynchronous_is_independent_workers(np3):
    n, job, ranks = _job(np3, "easgd_async0")
    _independent(job, n - 1, 1, ranks)
    np.testing.assert_allclose(ranks[0]["final"], ranks[0]["initial"], rtol=0, atol=TOL)
    pushes = sum(rk["stats"]["pushes"] for rk in ranks[1:])
    assert ranks[0]["stats"]["updates"] == ranks[0]["stats"]["messages_applied"] == pushes > 0


def test_synchronous_downpour_is_data_parallel_on_the_workers(np3):
    n, job, ranks = _job(np3, "downpour_sync")
    gbs = job["batch"] * (n - 1)
    w = _data_parallel(job, ranks[0]["initial"], gbs)
    for r in range(n):
        np.testing.assert_allclose(ranks[r]["final"], w, rtol=0, atol=TOL)
    steps = job["epochs"] * job["n"] // gbs
    assert ranks[0]["stats"]["updates"] == steps
    assert ranks[0]["stats"]["messages_applied"] == steps * (n - 1)
