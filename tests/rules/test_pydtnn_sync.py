"""PyDTNN 3.x's model synchronization: the weighting, participation and quantization of
localsgd's averages and the one-step-stale ``pipeline`` rule pinned to float64 arithmetic
by hand under real mpiexec (2 and 3 ranks), and the options as PyDTNN spells them through
``distnn train --like pydtnn``."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from rulejobs import Jobs, run_cli
from helpers import distnn_in_process, needs_mpi

from distnn.rules.localsgd import sync_weights

sys.path.insert(0, str(Path(__file__).parent / "progs"))
from rule_prog import data  # noqa: E402
from test_rules_arithmetic import SGDRef, grad, shards  # noqa: E402

TOL = 1e-10
# per-rank batch 4: the last global batch of N[n] samples is split unevenly (2 ranks: 3 and
# 2 of 45; 3 ranks: 4, 4 and 3 of 47); of M[n] it leaves one sample (rank 0's alone)
N, M = {2: 45, 3: 47}, {2: 41, 3: 37}


def jobs(n: int) -> list[dict]:
    common = {"batch": 4, "epochs": 2, "lr": 0.2}
    return [
        {"name": "pipeline", "rule": "pipeline", "n": N[n], **common, "momentum": 0.9},
        {"name": "invwavg", "rule": "localsgd", "n": N[n], **common,
         "options": {"sync_every": 1, "weighting": "invwavg"}},
        {"name": "wavg", "rule": "localsgd", "n": N[n], **common,
         "options": {"sync_every": 1, "weighting": "wavg"}},
        {"name": "avail", "rule": "localsgd", "n": M[n], **common,
         "options": {"sync_every": 1, "weighting": "avg", "participation": "avail2all"}},
        {"name": "minavail", "rule": "localsgd", "n": M[n], **common,
         "options": {"sync_every": 1, "weighting": "avg", "participation": "avail2all",
                     "min_avail": n + 1}},
        {"name": "epochend", "rule": "localsgd", "n": M[n], **common,
         "options": {"sync_every": 1000, "weighting": "avg"}},
        {"name": "fp16", "rule": "localsgd", "n": N[n], **common,
         "options": {"sync_every": 2, "sync_dtype": "float16"}},
        {"name": "ready_all", "rule": "localsgd", "n": N[n], **common,
         "options": {"sync_every": 1, "participation": "ready", "min_avail": n}},
        {"name": "ready_late", "rule": "localsgd", "n": N[n], **common,
         "options": {"sync_every": 1, "participation": "ready", "min_avail": n - 1},
         "slow_rank": n - 1, "slow_factor": 8.0},
    ]


BATCHED = {n: Jobs(n, jobs(n), f"test_pydtnn_sync.np{n}") for n in (2, 3)}


@pytest.fixture(scope="module", params=[2, 3])
def ranks(request, rule_batch):
    """Every job of ``jobs(n)``, in the folder's launch on n ranks."""
    n = request.param
    return n, BATCHED[n].results(rule_batch)


def _job(ranks, name):
    n, res = ranks
    return n, next(j for j in jobs(n) if j["name"] == name), res[name]


def local_sgd_reference(w: np.ndarray, job: dict, n: int, weighting: str,
                        participation: str) -> np.ndarray:
    """From ``w``, every step: each rank's SGD step on its own share (mean over its
    samples; none on an empty share), then the average with ``sync_weights``' weights."""
    for step in shards(job["n"], job["batch"] * n, n, job["epochs"]):
        counts = np.array([len(yb) for _, yb in step], float)
        reps = [w - job["lr"] * grad(w, xb, yb) if len(yb) else w for xb, yb in step]
        part = counts > 0 if participation == "avail2all" else np.ones(n, bool)
        c = sync_weights(counts, weighting, part)
        w = sum(ci * r for ci, r in zip(c, reps))
    return w


def test_sync_weights_formulas():
    both = np.array([True, True, True])
    np.testing.assert_allclose(sync_weights(np.array([4., 4., 3.]), "wavg", both),
                               [4 / 11, 4 / 11, 3 / 11])
    np.testing.assert_allclose(sync_weights(np.array([4., 4., 3.]), "avg", both), [1 / 3] * 3)
    # PyDTNN's inverse weights min + max - n: 3, 3, 4, normalized
    np.testing.assert_allclose(sync_weights(np.array([4., 4., 3.]), "invwavg", both),
                               [0.3, 0.3, 0.4])
    np.testing.assert_allclose(sync_weights(np.array([1., 0., 0.]), "avg",
                                            np.array([True, False, False])), [1, 0, 0])


@needs_mpi
@pytest.mark.parametrize("name,weighting,participation", [
    ("invwavg", "invwavg", "all"), ("wavg", "wavg", "all"), ("avail", "avg", "avail2all")])
def test_localsgd_averages_with_the_weighting_by_hand(ranks, name, weighting, participation):
    n, job, res = _job(ranks, name)
    w = local_sgd_reference(res[0]["initial"], job, n, weighting, participation)
    for r in range(n):
        np.testing.assert_allclose(res[r]["final"], w, rtol=0, atol=TOL)
    # the weightings make other models on uneven shares
    if name == "invwavg":
        _, _, wavg = _job(ranks, "wavg")
        assert np.abs(wavg[0]["final"] - res[0]["final"]).max() > 1e-6


@needs_mpi
def test_ready_rounds_of_every_rank_are_the_weighted_average_by_hand(ranks):
    n, job, res = _job(ranks, "ready_all")
    w = local_sgd_reference(res[0]["initial"], job, n, "wavg", "all")
    for r in range(n):
        np.testing.assert_allclose(res[r]["final"], w, rtol=0, atol=TOL)
    assert res[0]["stats"]["left_out"] == 0


@needs_mpi
def test_a_late_rank_is_left_out_not_waited_for(ranks):
    n, job, res = _job(ranks, "ready_late")
    # rank n-1 sleeps after every step: rank 0 averages the first n-1 replicas to reach it
    # and goes on, so the late rank misses rounds (it then takes their average)
    assert res[0]["stats"]["left_out"] >= 1, res[0]["stats"]
    for r in range(1, n):  # the epoch-end average waits for everyone: one model
        np.testing.assert_allclose(res[r]["final"], res[0]["final"], rtol=0, atol=TOL)
    _, _, every = _job(ranks, "ready_all")
    assert np.abs(res[0]["final"] - every[0]["final"]).max() > 1e-6


@needs_mpi
def test_too_few_available_ranks_skip_the_round(ranks):
    n, job, res = _job(ranks, "minavail")
    _, _, end = _job(ranks, "epochend")
    steps = -(-job["n"] // (job["batch"] * n))
    assert res[0]["stats"]["skipped"] == job["epochs"] * steps
    # only the epoch-end averages happen: the model of averaging once an epoch
    for r in range(n):
        np.testing.assert_allclose(res[r]["final"], end[r]["final"], rtol=0, atol=TOL)


@needs_mpi
def test_quantized_sync_sends_float16(ranks):
    n, job, res = _job(ranks, "fp16")
    _, _, plain = _job(ranks, "wavg")
    final = res[0]["final"]
    np.testing.assert_array_equal(final, final.astype(np.float16).astype(np.float64))
    assert np.abs(final - plain[0]["final"]).max() < 0.05  # close to float64 averaging
    stats = res[0]["stats"]
    size = final.size
    # each average: one 8-byte sample count, the weights in 2 bytes each
    assert stats["bytes"] == stats["averages"] * (8 + 2 * size)


@needs_mpi
def test_pipeline_is_delayed_sgd_by_hand(ranks):
    n, job, res = _job(ranks, "pipeline")
    w = res[0]["initial"]
    opt = SGDRef(job["lr"], job["momentum"])
    x, y = data(job["n"])
    gbs = job["batch"] * n
    for _ in range(job["epochs"]):
        pending = None
        for lo in range(0, job["n"], gbs):
            g = grad(w, x[lo:lo + gbs], y[lo:lo + gbs])  # at w_t, applied at step t + 1
            if pending is not None:
                w = opt.step(w, pending)
            pending = g
        w = opt.step(w, pending)  # the epoch's last gradient, at its end
    for r in range(n):
        np.testing.assert_allclose(res[r]["final"], w, rtol=0, atol=TOL)
    steps = -(-job["n"] // gbs)
    assert res[0]["stats"]["updates"] == job["epochs"] * steps


# -- through distnn train --like pydtnn -------------------------------------------------------
COMMON = ["train", "--like", "pydtnn", "--dataset", "digits", "--model", "simplemlp",
          "--dtype", "float64", "--num_epochs", "1", "--learning_rate", "2.0", "--seed", "3",
          "--steps_per_epoch", "6", "--quiet"]


def cli(n, tmp_path, *args):
    hist, weights = tmp_path / f"h{n}.json", tmp_path / f"w{n}.npz"
    proc = run_cli(n, *COMMON, "--history_file", str(hist), "--save_weights", str(weights),
                   *args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with np.load(weights) as z:
        arrays = {k: z[k] for k in z.files}
    return json.loads(hist.read_text())["run"], arrays, proc.stdout + proc.stderr


@needs_mpi
@pytest.mark.parametrize("n", [2, 3])
def test_pydtnn_model_sync_options_through_the_command(tmp_path, n):
    run, weights, out = cli(n, tmp_path, "--model-sync-freq", "2", "--model-sync-algo",
                            "invwavg", "--model-sync-participation", "avail2all",
                            "--model-sync-min-avail", "2", "--model-sync-quantize",
                            "--model-sync-dtype", "float16")
    assert run["parallel"] == "localsgd" and run["sync_every"] == 2, run
    assert (run["sync_weighting"], run["sync_participation"], run["sync_min_avail"],
            run["sync_dtype"]) == ("invwavg", "avail2all", 2, "float16"), run
    for key, w in weights.items():  # the last average was all-reduced in float16
        np.testing.assert_array_equal(w, w.astype(np.float16).astype(w.dtype), err_msg=key)
    assert "Test:" in out


@needs_mpi
@pytest.mark.parametrize("n", [2, 3])
def test_ready_participation_through_the_command(tmp_path, n):
    run, weights, out = cli(n, tmp_path, "--model-sync-freq", "1", "--sync_participation",
                            "ready", "--sync_min_avail", "1")
    assert (run["parallel"], run["sync_participation"], run["sync_min_avail"]) == \
        ("localsgd", "ready", 1), run
    assert "Test:" in out


@needs_mpi
@pytest.mark.parametrize("n", [2, 3])
def test_pydtnn_parallel_pipeline_through_the_command(tmp_path, n):
    run, weights, out = cli(n, tmp_path, "--parallel-pipeline")
    assert run["parallel"] == "pipeline", run
    assert run["lr_per_sample"] is True, run  # still PyDTNN's door
    assert all(np.isfinite(w).all() for w in weights.values())


NOT_BUILT = [
    (["--encryption", "tenseal"], "--encryption tenseal encrypts --parallel fedavg's"),
    (["--encryption", "polyhe_x"], "must be one of ckks, none, tenseal; got 'polyhe_x'"),
    (["--model-sync-freq", "-1"], "--model-sync-freq -1: PyDTNN's independent replicas"),
    (["--model-sync-algo", "wavg"], "--model-sync-algo sets how the weights are averaged"),
    (["--final-model-sync", "false"], "--final-model-sync false"),
    (["--parallel-pipeline", "--model-sync-freq", "2"], "give one of them"),
    (["--sync_weighting", "avg"], "--sync_weighting avg sets localsgd's averages"),
]


@pytest.mark.parametrize("args,says", NOT_BUILT)
def test_what_is_not_built_is_refused_by_name(args, says):
    # through the command's entry in this process, but the first case and the last one
    # (refused once the run has its communicator, after MPI's start): real processes
    real = NOT_BUILT.index((args, says)) in (0, len(NOT_BUILT) - 1)
    run = (lambda *a: run_cli(0, *a)) if real else distnn_in_process
    proc = run(*COMMON, *args)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if "error" in ln]
    assert len(lines) == 1 and says in lines[0], proc.stderr
