"""``--parallel diloco`` through the distnn command on real data (sklearn digits): the loss
falls and every rank ends with the same weights on 2 ranks; ``--resume`` continues the same
run bit for bit on 2 ranks (and is refused in one line on another number of ranks or under
another rule); with one rank, H=1, outer lr 1 and momentum 0 it is the inner optimizer's own
training; its traffic in ``distnn plan``."""
from __future__ import annotations

import json

import numpy as np
import pytest

from helpers import needs_mpi
from rulejobs import run_cli

# digits: 1150 training samples; global batch 64 on 2 ranks: 18 batches an epoch
COMMON = ["--model", "simplecnn", "--dataset", "digits", "--dtype", "float64",
          "--batch_size", "32", "--learning_rate", "0.002", "--quiet", "--evaluate", "false"]


def _train(tmp_path, n, name, *args):
    weights, history = tmp_path / f"{name}.{{rank}}.npz", tmp_path / f"{name}.{{rank}}.json"
    proc = run_cli(n, "train", *COMMON, *args, "--save_weights", str(weights),
                   "--history_file", str(history), "--every_rank_writes", "true",
                   timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ranks = []
    for r in range(max(n, 1)):
        with np.load(str(weights).format(rank=r)) as z:
            arrays = {k: z[k] for k in z.files}
        ranks.append((arrays, json.loads(open(str(history).format(rank=r)).read())))
    return ranks


@needs_mpi
def test_two_ranks_learn_and_end_each_round_equal(tmp_path):
    ranks = _train(tmp_path, 2, "diloco", "--parallel", "diloco", "--sync_every", "4",
                   "--num_epochs", "3")
    (w0, hist), (w1, _) = ranks
    assert sorted(w0) == sorted(w1)
    for k in w0:  # the epoch ends with an outer step: every rank holds the same weights
        np.testing.assert_array_equal(w0[k], w1[k], err_msg=k)
    loss = hist["loss"]
    assert len(loss) == 3 and loss[-1] < 0.6 * loss[0], loss
    assert hist["run"]["parallel"] == "diloco"


@needs_mpi
def test_resume_continues_the_same_run_bit_for_bit(tmp_path):
    # 2 epochs straight against 1 epoch, its checkpoint, and a resumed run to 2 epochs. 18
    # batches an epoch, H = 4: the epoch ends two inner steps into a round (its outer step
    # then covers them). The ranks' inner AdamW states differ and the outer momentum is
    # non-zero, so the second epoch matches only when each rank takes back its own state.
    args = ["--parallel", "diloco", "--sync_every", "4", "--optimizer", "adamw"]
    ckpt = str(tmp_path / "diloco.ckpt.npz")
    straight = _train(tmp_path, 2, "straight", *args, "--num_epochs", "2")
    first = _train(tmp_path, 2, "first", *args, "--num_epochs", "1", "--checkpoint", ckpt)
    resumed = _train(tmp_path, 2, "resumed", *args, "--num_epochs", "2", "--resume", ckpt)
    for (want, want_hist), (got, got_hist) in zip(straight, resumed):
        assert sorted(got) == sorted(want)
        for k in want:
            np.testing.assert_array_equal(got[k], want[k], err_msg=k)
        assert got_hist["epoch"] == [1, 2] and got_hist["loss"] == want_hist["loss"]
    assert any(np.abs(first[0][0][k] - straight[0][0][k]).max() > 0 for k in straight[0][0])


@needs_mpi
def test_a_checkpoint_resumes_only_as_it_was_written(tmp_path):
    ckpt = str(tmp_path / "c.npz")
    _train(tmp_path, 2, "first", "--parallel", "diloco", "--num_epochs", "1",
           "--steps_per_epoch", "2", "--checkpoint", ckpt)
    resume = [*COMMON, "--num_epochs", "2", "--steps_per_epoch", "2", "--resume", ckpt]
    # the ranks' inner optimizer states are the run's: not for another number of ranks
    proc = run_cli(3, "train", *resume, "--parallel", "diloco")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stdout + proc.stderr
    assert lines[0].endswith("--resume: the checkpoint holds the diloco state of 2 ranks, "
                             "this run has 3; resume under mpiexec -n 2"), lines[0]
    # under another rule its optimizer (the inner AdamW, not --optimizer sgd) is not the
    # question: the rule is
    proc = run_cli(2, "train", *resume, "--parallel", "localsgd")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip().endswith(f"--parallel localsgd: {ckpt} was trained under "
                                        "training rule diloco; resume with --parallel diloco")


def test_one_rank_one_inner_step_outer_lr_1_momentum_0_is_local_training(tmp_path):
    args = ["--num_epochs", "1", "--steps_per_epoch", "10"]
    args += ["--optimizer", "adamw"]  # the inner optimizer is then the run's, as built
    ((diloco, _),) = _train(tmp_path, 0, "diloco", "--parallel", "diloco", "--sync_every",
                            "1", "--rule_args", "outer_lr=1,outer_momentum=0", *args)
    ((plain, _),) = _train(tmp_path, 0, "plain", *args)
    ((outer, _),) = _train(tmp_path, 0, "outer", "--parallel", "diloco", "--sync_every", "1",
                           *args)  # the default outer step (0.7, Nesterov 0.9) is not it
    top = max(np.max(np.abs(v)) for v in plain.values())
    assert max(float(np.max(np.abs(diloco[k] - plain[k]))) for k in plain) <= 1e-12 * top
    assert max(float(np.max(np.abs(outer[k] - plain[k]))) for k in plain) > 1e-4 * top


def test_bad_arguments_are_one_line(tmp_path):
    proc = run_cli(0, "train", *COMMON, "--parallel", "diloco", "--rule_args",
                   "outer_momentum=1", "--num_epochs", "1")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stdout + proc.stderr
    assert lines[0].endswith("--rule_args outer_momentum=1: diloco: outer_momentum must be "
                             "in [0, 1), got 1"), lines[0]
    proc = run_cli(0, "train", *COMMON, "--parallel", "diloco", "--rule_args",
                   "inner_optimizer=lbfgs", "--num_epochs", "1")
    assert proc.returncode == 2 and "inner_optimizer must be one of none, " in proc.stderr, \
        proc.stderr


def test_plan_prices_its_messages(tmp_path):
    from distnn.rules import RULES
    out = tmp_path / "plan.json"
    proc = run_cli(0, "plan", "--model", "simplecnn", "--compute_s", "0.01", "--hosts", "2,4",
                   "--link_gbits", "1", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    res = json.loads(out.read_text())
    rows = {(r["config"], r["hosts"]): r for r in res["rows"]}
    diloco, local = rows[("diloco (every 50)", 4)], rows[("localsgd (every 8)", 4)]
    # the weights once every H = 50 steps (float32), all-reduced
    assert diloco["bytes_per_step"] == pytest.approx(res["params"] * 4 / 50, rel=0.05)
    assert diloco["step_s"] < local["step_s"] and diloco["efficiency"] > local["efficiency"]
    assert "| diloco (every 50) |" in proc.stdout
    messages = RULES["diloco"].step_messages(size=1000, itemsize=4, period=10, probability=0)
    assert [(m.nbytes, m.per_step, m.shape) for m in messages] == [(4000, 0.1, "allreduce")]
