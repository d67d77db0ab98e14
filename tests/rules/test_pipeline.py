"""The ``pipeline`` rule under real mpiexec (float64): S = 2 and 3 stages with M
micro-batches, under GPipe and 1F1B, give the weights (and batch-norm running statistics)
of the unsplit model trained with gradient accumulation over the same micro-batches; so does
the 2-D grid of 2 replicas x 2 stages on 4 ranks; a pipeline that does not fit is refused
on every rank before any step. One MPI job per rank count runs all its cases."""
from __future__ import annotations

import json

import numpy as np
import pytest

from rulejobs import PROG, run_cli
from helpers import MPIEXEC, child_env, needs_mpi, pids_of_rank, reaped
from distnn.rules.pipeline_stages import SCHEDULES, live_micro_batches, partition

PIPE_PROG = PROG.parent / "pipeline_prog.py"
BASE = {"seed": 1, "optimizer": "sgd", "lr": 0.1, "hyper": {"momentum": 0.9}, "n": 48,
        "batch": 8, "epochs": 2, "model": "mlp", "balance": "params"}


def job(name: str, **over) -> dict:
    return {**BASE, "name": name, **over}


CASES = {
    2: [job("mlp_gpipe_m4", stages=2, micro=4, schedule="gpipe"),
        job("mlp_1f1b_m4", stages=2, micro=4, schedule="1f1b"),
        job("mlp_1f1b_m1_adam", stages=2, micro=1, schedule="1f1b", optimizer="adam",
            lr=0.01, hyper={}, resume=True),
        job("cnn_gpipe_m2_time", stages=2, micro=2, schedule="gpipe", model="cnn",
            balance="time"),
        # cut between a batch norm and its ReLU, a pair that runs fused in one model
        job("cnn_1f1b_m4_cut", stages=2, micro=4, schedule="1f1b", model="cnn",
            balance="2"),
        # one stage: micro-batches alone, gradient accumulation under 2 replicas
        job("cnn_one_stage_m2", stages=1, micro=2, schedule="gpipe", model="cnn")],
    3: [job("mlp_gpipe_m2", stages=3, micro=2, schedule="gpipe"),
        job("mlp_1f1b_m4", stages=3, micro=4, schedule="1f1b", balance="1,3"),
        job("cnn_1f1b_m8", stages=3, micro=8, schedule="1f1b", model="cnn", balance="time")],
    # 2 replicas x 2 stages; dropout draws per replica, so the grid's model has none
    4: [job("grid_gpipe_m4", stages=2, micro=4, schedule="gpipe", model="cnn", resume=True),
        job("grid_1f1b_m4", stages=2, micro=4, schedule="1f1b", model="cnn")],
}
REFUSALS = [
    job("too_many_stages", refuse=True, stages=8, micro=1),
    job("micro_larger_than_batch", refuse=True, stages=2, micro=16),
    job("micro_not_dividing", refuse=True, stages=2, micro=3),
    job("bad_cut", refuse=True, stages=2, micro=1, balance="9"),
    job("ranks_not_a_multiple", refuse=True, stages=3, micro=1),
]


def run_prog(n: int, jobs: list[dict], out) -> dict:
    import subprocess
    import sys
    proc = subprocess.run([MPIEXEC, "-n", str(n), sys.executable, str(PIPE_PROG), str(out),
                           json.dumps(jobs)], capture_output=True, text=True, timeout=240,
                          env=child_env(DISTNN_KERNELS="numpy"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {j["name"]: [json.loads((out / f"{j['name']}.rank{r}.json").read_text())
                        for r in range(n)] for j in jobs}


_RESULTS: dict[int, dict] = {}


def results(n: int, factory) -> dict:
    """The module's one MPI job on n ranks (its cases, and the refusals on 2 ranks)."""
    if n not in _RESULTS:
        jobs = CASES[n] + (REFUSALS if n == 2 else [])
        _RESULTS[n] = run_prog(n, jobs, factory.mktemp(f"pipe{n}"))
    return _RESULTS[n]


@pytest.fixture(scope="module", params=sorted(CASES), ids=lambda n: f"np{n}")
def runs(request, tmp_path_factory):
    return request.param, results(request.param, tmp_path_factory)


@needs_mpi
def test_pipeline_gives_the_unsplit_model_with_gradient_accumulation(runs):
    n, res = runs
    for case in CASES[n]:
        ranks = res[case["name"]]
        ref = ranks[0]["ref"]
        initial = np.array(ranks[0]["initial"])
        assert np.abs(np.array(ref["weights"]) - initial).max() > 1e-3, case  # it trained
        for r, rank in enumerate(ranks):
            np.testing.assert_allclose(rank["weights"], ref["weights"], rtol=0, atol=1e-12,
                                       err_msg=f"{case['name']} rank {r}")
            if n == case["stages"]:  # replicas keep their own running statistics
                np.testing.assert_allclose(rank["buffers"], ref["buffers"], rtol=0,
                                           atol=1e-12, err_msg=f"{case['name']} rank {r}")
            else:  # each stage's statistics are shared with the rest of its replica
                replica0 = ranks[r - r % case["stages"]]
                np.testing.assert_array_equal(rank["buffers"], replica0["buffers"])
            # every rank of a replica reports its last stage's loss (its share of the
            # batch's, as under data), every rank the same epoch metrics: the reference's
            replica = ranks[r - r % case["stages"]:r - r % case["stages"] + case["stages"]]
            assert all(other["losses"] == rank["losses"] for other in replica)
            assert [h["loss"] for h in rank["history"]] == \
                [h["loss"] for h in ranks[0]["history"]]
            assert rank["starts"] == ranks[0]["starts"]
            stage = r % case["stages"]
            assert rank["role"].startswith(f"pipeline stage {stage} of {case['stages']}")
        shares = np.sum([ranks[d]["losses"] for d in range(0, n, case["stages"])], axis=0)
        np.testing.assert_allclose(shares, ref["losses"], rtol=1e-12, atol=0)
        per_epoch = np.reshape(ref["losses"], (case["epochs"], -1))
        gbs = case["batch"] * n // case["stages"]
        np.testing.assert_allclose([h["loss"] for h in ranks[0]["history"]],
                                   per_epoch.sum(axis=1) * gbs / case["n"], rtol=1e-12)
        assert len(ranks[0]["starts"]) == case["stages"]


@needs_mpi
def test_a_pipeline_checkpoint_resumes_exactly(runs):
    n, res = runs
    cases = [c for c in CASES[n] if c.get("resume")]
    for case in cases:
        ranks = res[case["name"]]
        for r, rank in enumerate(ranks):
            # one epoch, a checkpoint, a fresh run resuming it = the uninterrupted run
            np.testing.assert_array_equal(rank["resumed"]["weights"], rank["weights"],
                                          err_msg=f"{case['name']} rank {r}")
            if r < case["stages"]:  # replica 0's statistics are the checkpoint's (as under
                # data, the other replicas resume from rank 0's and then drift their own way)
                np.testing.assert_array_equal(rank["resumed"]["buffers"], rank["buffers"],
                                              err_msg=f"{case['name']} rank {r}")
        # the main file and one shard file per rank (its stage's slice), none gathered
        files = ranks[0]["resumed"]["files"]
        base = f"{case['name']}.ck"
        assert f"{base}.npz" in files
        assert sorted(f.split(".step")[0] for f in files if ".shard" in f) == \
            sorted(f"{base}.shard{r}of{n}" for r in range(n)), files


@needs_mpi
def test_a_rank_holds_only_its_stage_in_the_steps(runs):
    n, res = runs
    for case in CASES[n]:
        S, ranks = case["stages"], res[case["name"]]
        total = ranks[0]["total"]
        for rank in ranks:
            assert rank["total"] == total  # the final model is whole on every rank
            if S == 1:
                assert rank["held"] == [[total, total, total, total, 0]], case["name"]
                continue
            # in every step: no whole buffer, the stage's own, the other layers' views
            # read-only placeholders of no memory (a 0-d NaN under each)
            [(whole, whole_grads, params, grads, others)] = rank["held"]
            assert (whole, whole_grads) == (0, 0), case["name"]
            assert params == grads and params < total, case["name"]
            assert others <= 8 * len(rank["weights"]), case["name"]
        for d in range(0, n, S):  # the stages of a replica hold the model once between them
            assert sum(ranks[d + s]["held"][0][2] for s in range(S)) == total, case["name"]


@needs_mpi
@pytest.mark.parametrize("n, a, b", [(2, "mlp_gpipe_m4", "mlp_1f1b_m4"),
                                     (4, "grid_gpipe_m4", "grid_1f1b_m4")])
def test_both_schedules_give_the_same_weights(tmp_path_factory, n, a, b):
    res = results(n, tmp_path_factory)
    # the same micro-batches in another order: the same arithmetic, bit for bit
    for ra, rb in zip(res[a], res[b]):
        np.testing.assert_array_equal(ra["weights"], rb["weights"])
    # messages both ways between the stages, each stage waited on the other a little
    for rank in res[b]:
        assert rank["stats"]["messages"] > 0 and 0 <= rank["stats"]["bubble"] < 1


@needs_mpi
def test_explicit_cuts_and_params_balance(tmp_path_factory):
    res = results(3, tmp_path_factory)
    assert res["mlp_1f1b_m4"][0]["starts"] == [0, 1, 3]
    # parameters of the 7 layers: 56, 16, 0, 72, 0, 0, 36; the largest stage holds 72
    # at least, and the earliest cuts that keep it there are after layers 1 and 3
    assert res["mlp_gpipe_m2"][0]["starts"] == [0, 2, 4]


@needs_mpi
@pytest.mark.parametrize("name, argument, words", [
    ("too_many_stages", "stages", "8 pipeline stages need at least 8 top-level layers"),
    ("micro_larger_than_batch", "micro_batches", "16 micro-batches do not divide"),
    ("micro_not_dividing", "micro_batches", "3 micro-batches do not divide"),
    ("bad_cut", "balance", "got '9'"),
    ("ranks_not_a_multiple", "stages", "2 ranks are not a multiple of 3 pipeline stages"),
])
@needs_mpi
def test_refusals_on_every_rank_before_any_step(tmp_path_factory, name, argument, words):
    res = results(2, tmp_path_factory)
    errors = [rank["error"] for rank in res[name]]
    assert errors[0] and all(e == errors[0] for e in errors), errors
    assert errors[0].startswith(f"RuleArgumentError({argument}):") and words in errors[0]


@needs_mpi
def test_command_refuses_ranks_not_a_multiple_of_the_stages(tmp_path):
    proc = run_cli(3, "train", "--dataset", "synthetic", "--num_samples", "64",
                   "--pipeline_stages", "2", "--steps_per_epoch", "1", "--quiet",
                   cwd=tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    lines = proc.stderr.strip().splitlines()  # every rank ends with 2; rank 0 says why
    assert len(lines) == 1 and lines[0].startswith("distnn train: error: --pipeline_stages 2:")
    assert "3 ranks are not a multiple of 2 stages" in lines[0], out


@needs_mpi
def test_command_trains_a_pipeline_and_refuses_bad_micro_batches(tmp_path):
    common = ["train", "--dataset", "synthetic", "--num_samples", "128", "--batch_size",
              "16", "--steps_per_epoch", "4", "--quiet", "--model", "simplemlp"]
    proc = run_cli(2, *common, "--pipeline_stages", "2", "--micro_batches", "4",
                   "--schedule", "1f1b", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    bad = run_cli(2, *common, "--pipeline_stages", "2", "--micro_batches", "5", cwd=tmp_path)
    assert bad.returncode == 2, bad.stdout + bad.stderr
    lines = bad.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("distnn train: error: --micro_batches 5:")
    assert "divide a replica's batch of 16" in lines[0], bad.stderr


@needs_mpi
def test_a_killed_stage_ends_the_job_within_seconds_naming_its_stage(tmp_path):
    import os
    import re
    import signal
    import socket
    import subprocess
    import sys
    import time
    from helpers import COMMAND
    mark = f"DISTNN_TEST_MARK={os.getpid()}-{time.monotonic_ns()}"
    history = tmp_path / "h.json"
    proc = subprocess.Popen(
        [MPIEXEC, "-n", "2", sys.executable, "-m", "distnn.launch.rankwatch", *COMMAND,
         "train", "--dataset", "synthetic", "--num_samples", "64", "--batch_size", "8",
         "--model", "simplemlp", "--num_epochs", "1000", "--pipeline_stages", "2",
         "--micro_batches", "2", "--validation_split", "0", "--evaluate", "false",
         "--history_file", str(history), "--quiet"], cwd=tmp_path,
        env=child_env(DISTNN_KERNELS="numpy", **dict([mark.split("=", 1)])),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with reaped(proc):
        deadline = time.monotonic() + 120
        while not history.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        assert history.exists(), "no epoch ended: " + "".join(proc.communicate(timeout=30))
        pids = pids_of_rank(1, mark)
        assert pids, "rank 1 not found"
        killed = time.monotonic()
        os.kill(pids[0], signal.SIGKILL)
        out, err = proc.communicate(timeout=60)
        ended = time.monotonic() - killed
    assert proc.returncode == 9, (out + err)[-3000:]
    assert ended < 10, ended  # stage 0 waited on rank 1's messages: it did not hang
    lines = [ln for ln in err.splitlines() if "ended by" in ln]
    assert len(lines) == 1 and re.fullmatch(
        rf"distnn: rank 1 \(pid {pids[0]}, host {re.escape(socket.gethostname())}\), pipeline "
        r"stage 1 of 2 \(layers \d+\.\.\d+\), replica 0 of 1: ended by signal 9 \(Killed\)",
        lines[0]), err[-3000:]


# hydra runs this as it would run ssh ([options] host command...), as in
# tests/cluster/test_launch_roles.py: distnn launch on this machine, no emulated cluster
LAUNCHER = ('#!/bin/sh\nwhile [ $# -gt 0 ]; do case "$1" in -*) shift ;; *) break ;; esac; '
            'done\nshift\nexec sh -c "$*"\n')


@pytest.mark.slow
@needs_mpi
def test_distnn_launch_restarts_a_killed_stage_from_the_pipeline_checkpoint(tmp_path):
    import os
    import signal
    import subprocess
    import time

    from distnn.training.checkpoint import load_checkpoint
    (tmp_path / "ssh").write_text(LAUNCHER)
    os.chmod(tmp_path / "ssh", 0o755)
    ck = tmp_path / "ck.npz"
    mark = f"DISTNN_TEST_MARK={os.getpid()}-{time.monotonic_ns()}"
    env = child_env(DISTNN_KERNELS="numpy", **dict([mark.split("=", 1)]))
    env["PATH"] = os.path.dirname(MPIEXEC) + os.pathsep + env.get("PATH", "")
    proc = subprocess.Popen(
        [os.path.join(os.path.dirname(MPIEXEC), "distnn"), "launch", "--hosts", "localhost",
         "--ranks_per_host", "2", "--max_restarts", "1", "--mpiexec", MPIEXEC,
         "--launcher_args", f"-launcher ssh -launcher-exec {tmp_path / 'ssh'}", "--", "train",
         "--dataset", "synthetic", "--num_samples", "64", "--batch_size", "8", "--model",
         "simplemlp", "--num_epochs", "30", "--pipeline_stages", "2", "--micro_batches", "2",
         "--schedule", "1f1b", "--validation_split", "0", "--evaluate", "false",
         "--checkpoint", str(ck), "--quiet"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    with reaped(proc):
        deadline = time.monotonic() + 180
        while not ck.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert ck.exists(), "no checkpoint was written: " + "".join(proc.communicate())
        at_kill = load_checkpoint(ck).meta["epochs_done"]
        pids = pids_of_rank(1, mark)
        assert pids, "stage 1's rank not found"
        os.kill(pids[0], signal.SIGKILL)
        out, err = proc.communicate(timeout=300)
    text = out + err
    assert proc.returncode == 0, text[-3000:]
    assert "pipeline stage 1 of 2" in text and "ended by signal 9 (Killed)" in text, \
        text[-3000:]
    assert "restart 1/1" in text, text[-3000:]
    final = load_checkpoint(ck)
    assert final.meta["epochs_done"] == 30 and at_kill < 30, (at_kill, text[-2000:])
    assert len(final.meta["sharded"]["files"]) == 2  # each stage's rank wrote its slice


def test_partition_is_the_best_contiguous_cut():
    import itertools
    rng = np.random.default_rng(0)
    for _ in range(30):
        costs = rng.integers(0, 9, size=int(rng.integers(3, 8))).tolist()
        stages = int(rng.integers(1, len(costs) + 1))
        starts = partition(costs, stages)
        ends = (*starts[1:], len(costs))
        assert starts[0] == 0 and all(a < b for a, b in zip(starts, ends))
        got = max(sum(costs[a:b]) for a, b in zip(starts, ends))
        best = min(max(sum(costs[a:b]) for a, b in zip((0, *cuts), (*cuts, len(costs))))
                   for cuts in itertools.combinations(range(1, len(costs)), stages - 1))
        assert got == best, (costs, stages, starts)
    assert partition([1, 1, 1, 3], 2) == (0, 3)


@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
@pytest.mark.parametrize("stages, micro", [(2, 1), (2, 4), (3, 2), (3, 8), (4, 3)])
def test_schedules_run_every_micro_batch_once_forward_before_backward(schedule, stages,
                                                                      micro):
    for stage in range(stages):
        order = SCHEDULES[schedule](stage, stages, micro)
        assert sorted(order) == sorted([("F", i) for i in range(micro)]
                                       + [("B", i) for i in range(micro)])
        assert [i for op, i in order if op == "B"] == list(range(micro))
        assert all(order.index(("F", i)) < order.index(("B", i)) for i in range(micro))
        live = live_micro_batches(order)
        assert live == (micro if schedule == "gpipe" else min(stages - stage, micro))


def test_1f1b_fills_then_alternates():
    assert SCHEDULES["1f1b"](0, 3, 4) == [("F", 0), ("F", 1), ("F", 2), ("B", 0), ("F", 3),
                                          ("B", 1), ("B", 2), ("B", 3)]
    assert SCHEDULES["1f1b"](2, 3, 2) == [("F", 0), ("B", 0), ("F", 1), ("B", 1)]
