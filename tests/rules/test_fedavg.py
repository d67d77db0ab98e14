"""Federated averaging (rules/fedavg.py) and the clients' partitions (data/partition.py):
the rounds pinned to a float64 reference by hand under real mpiexec (2 and 3 ranks, virtual
clients, FedProx, a client that fails mid-round, secure aggregation), and the rule through
``distnn train --parallel fedavg``."""
from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rulejobs import run_cli, run_jobs
from helpers import COMMAND, child_env, needs_mpi

from distnn.data.partition import client_partition
from distnn.rules.fedavg import FedAvg

sys.path.insert(0, str(Path(__file__).parent / "progs"))
from rule_prog import data  # noqa: E402
from test_rules_arithmetic import SGDRef, grad  # noqa: E402

PROG = Path(__file__).parent / "progs" / "fedavg_prog.py"
OPTIONS = {"clients": 5, "client_fraction": 0.6, "local_epochs": 2, "fedprox_mu": 0.3,
           "partition": "dirichlet", "dirichlet_alpha": 1.0}
SEED = 4  # the trainer's
JOBS = [
    {"name": "plain", "seed": SEED, "n": 60, "batch": 4, "epochs": 3, "lr": 0.2, "momentum": 0.5,
     "options": OPTIONS},
    {"name": "secure", "seed": SEED, "n": 60, "batch": 4, "epochs": 3, "lr": 0.2, "momentum": 0.5,
     "options": {**OPTIONS, "secure_aggregation": True}},
    {"name": "failing", "seed": SEED, "n": 60, "batch": 4, "epochs": 3, "lr": 0.2, "momentum": 0.5,
     "options": OPTIONS, "fail": None},
]


def rule_of(options: dict) -> FedAvg:
    """A FedAvg of ``options`` with the trainer's seed and client count, to draw from."""
    rule = FedAvg(**options)
    rule.n_clients, rule.seed = options["clients"], SEED
    return rule


def drawn_client(round: int) -> int:
    return rule_of(OPTIONS).drawn(round)[0]


HAVE_TENSEAL = importlib.util.find_spec("tenseal") is not None


def jobs() -> list[dict]:
    out = [dict(j) for j in JOBS]
    out[2]["fail"] = [1, drawn_client(1)]  # the first client drawn in round 2 fails
    if HAVE_TENSEAL:
        out.append({**JOBS[0], "name": "ckks", "options": {**OPTIONS, "encryption": "ckks"}})
    return out


@pytest.fixture(scope="module", params=[2, 3])
def ranks(request, tmp_path_factory):
    n = request.param
    return n, run_jobs(n, jobs(), tmp_path_factory.mktemp(f"fedavg{n}"), prog=PROG)


def reference(w: np.ndarray, job: dict, n_ranks: int, fail=None) -> tuple[np.ndarray, list]:
    """FedAvg by hand: per round the drawn clients, each from w with fresh SGD state for
    E epochs of its own shuffled part (FedProx's mu (w - w_global) added to each gradient),
    then the sample-weighted average of the clients that finished."""
    opts = job["options"]
    x, y = data(job["n"])
    parts = client_partition(y, opts["clients"], opts["partition"],
                             alpha=opts["dirichlet_alpha"], seed=SEED)
    rule = rule_of(opts)
    rounds = []
    for r in range(job["epochs"]):
        acc, total, done = np.zeros_like(w), 0, []
        for c in rule.drawn(r):
            if fail is not None and (r, c) == tuple(fail):
                continue
            wc, opt = w.copy(), SGDRef(job["lr"], job["momentum"])
            xc, yc = x[parts[c]], y[parts[c]]
            rng = np.random.default_rng([SEED, r, c])
            for _ in range(opts["local_epochs"]):
                order = rng.permutation(len(xc))
                for lo in range(0, len(xc), job["batch"]):
                    ids = order[lo:lo + job["batch"]]
                    g = grad(wc, xc[ids], yc[ids]) + opts["fedprox_mu"] * (wc - w)
                    wc = opt.step(wc, g)
            acc += len(xc) * wc
            total += len(xc)
            done.append(c)
        w = acc / total
        rounds.append(done)
    return w, rounds


def test_partitions_cover_every_sample_once():
    y = np.repeat(np.arange(10), 50)
    for how in ("iid", "dirichlet", "shards"):
        parts = client_partition(y, 7, how, alpha=0.3, seed=1)
        assert len(parts) == 7 and min(len(p) for p in parts) >= 1, how
        np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(500))
        again = client_partition(y, 7, how, alpha=0.3, seed=1)
        assert all(np.array_equal(a, b) for a, b in zip(parts, again)), how
    # shards: two label-sorted shards per client, so at most 2 + 2 classes (a shard may
    # straddle two labels); dirichlet 0.1: most clients dominated by one class
    for p in client_partition(y, 10, "shards", shards_per_client=2, seed=1):
        assert len(np.unique(y[p])) <= 4
    top = [np.bincount(y[p]).max() / len(p) for p in client_partition(y, 10, "dirichlet",
                                                                     alpha=0.1, seed=1)]
    assert np.median(top) > 0.5
    iid = client_partition(y, 10, "iid", seed=1)
    assert {len(p) for p in iid} == {50}


@needs_mpi
def test_rounds_equal_fedavg_with_fedprox_by_hand(ranks):
    n, res = ranks
    job = jobs()[0]
    w, rounds = reference(res["plain"][0]["initial"], job, n)
    for r in range(n):
        np.testing.assert_allclose(res["plain"][r]["final"], w, rtol=0, atol=1e-10)
        assert res["plain"][r]["participants"] == rounds
    assert all(len(c) == 3 for c in rounds)  # 0.6 of 5 clients


@needs_mpi
def test_secure_aggregation_gives_the_same_rounds(ranks):
    n, res = ranks
    for r in range(n):
        # fixed point of 2**-32 units: within 2**-33 per client and element of n_k w_k
        np.testing.assert_allclose(res["secure"][r]["final"], res["plain"][r]["final"],
                                   rtol=0, atol=1e-9)


@needs_mpi
@pytest.mark.skipif(not HAVE_TENSEAL, reason="TenSEAL (the optional extra) is not installed")
def test_ckks_encrypted_sums_give_the_same_rounds(ranks):
    n, res = ranks
    for r in range(n):  # CKKS is approximate: about 1e-7 relative on the sums
        np.testing.assert_allclose(res["ckks"][r]["final"], res["plain"][r]["final"],
                                   rtol=0, atol=1e-5)
        assert res["ckks"][r]["participants"] == res["plain"][r]["participants"]


def test_encryption_without_tenseal_is_refused_by_name(tmp_path):
    hidden = tmp_path / "tenseal"
    hidden.mkdir()
    (hidden / "__init__.py").write_text("raise ImportError('No module named tenseal')\n")
    path = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    proc = subprocess.run([*COMMAND, "train", "--parallel", "fedavg", "--dataset", "digits",
                           "--encryption", "ckks", "--quiet"], capture_output=True, text=True,
                          env=child_env(PYTHONPATH=path), timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if "error" in ln]
    assert len(lines) == 1 and "--encryption ckks: CKKS needs TenSEAL" in lines[0], proc.stderr


@needs_mpi
def test_a_client_failing_mid_round_is_dropped_from_it(ranks):
    n, res = ranks
    job = jobs()[2]
    w, rounds = reference(res["failing"][0]["initial"], job, n, fail=job["fail"])
    for r in range(n):
        np.testing.assert_allclose(res["failing"][r]["final"], w, rtol=0, atol=1e-10)
        assert res["failing"][r]["participants"] == rounds
        (rnd, client, error), = res["failing"][r]["dropped"]
        assert [rnd, client] == job["fail"] and "lost its connection" in error
    assert len(rounds[1]) == 2 and job["fail"][1] not in rounds[1]


@needs_mpi
@pytest.mark.parametrize("n", [2, 3])
def test_fedavg_through_the_command(tmp_path, n):
    hist = tmp_path / "h.json"
    proc = run_cli(n, "train", "--parallel", "fedavg", "--dataset", "digits", "--model",
                   "simplemlp", "--clients", "6", "--client_fraction", "0.5",
                   "--local_epochs", "2", "--partition", "shards", "--secure_aggregation",
                   "--num_epochs", "3", "--learning_rate", "0.05", "--batch_size", "16",
                   "--history_file", str(hist), "--quiet")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    run = json.loads(hist.read_text())["run"]
    assert (run["parallel"], run["clients"], run["partition"]) == ("fedavg", 6, "shards")
    assert float(re.search(r"Test: .*accuracy=([0-9.]+)", out).group(1)) > 0.5, out


def test_partitions_belong_to_fedavg():
    proc = run_cli(0, "train", "--dataset", "digits", "--partition", "dirichlet", "--quiet")
    assert proc.returncode == 2
    assert "--partition dirichlet cuts the data among --parallel fedavg's" in proc.stderr


def test_more_clients_than_samples_is_refused_by_name():
    proc = run_cli(0, "train", "--parallel", "fedavg", "--dataset", "digits", "--clients",
                   "2000", "--partition", "dirichlet", "--quiet")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if "error" in ln]
    assert len(lines) == 1 and lines[0].startswith("distnn train: error: --clients 2000:"), \
        proc.stderr
