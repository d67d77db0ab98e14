"""``distnn search`` end to end: the real command under real mpiexec on Fashion-MNIST (tiny
epochs: --steps_per_epoch 3), and its one-line errors."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from helpers import COMMAND, MPIEXEC, child_env, have_fashion_mnist
from helpers import needs_fashion_mnist as needs_data
from helpers import needs_mpiexec as needs_mpi

optuna = pytest.importorskip("optuna")
pytest.importorskip("matplotlib")

BASE = ["--model", "simplemlp", "--num_epochs", "2", "--steps_per_epoch", "3"]
LIVE = re.compile(r"^trial\s+(\d+)\s+block (\d+)\s+(.*)$", re.M)


def distnn(*args, n: int = 0, cwd, timeout: float = 400) -> subprocess.CompletedProcess:
    """The command (under ``mpiexec -n n`` when n), one BLAS thread per rank."""
    launcher = [MPIEXEC, "-n", str(n)] if n else []
    return subprocess.run([*launcher, *COMMAND, *map(str, args)], capture_output=True,
                          text=True, cwd=cwd, timeout=timeout, env=child_env())


def _trials(folder: Path) -> dict:
    return json.loads((folder / "trials.json").read_text())


@pytest.fixture(scope="module")
def seven(tmp_path_factory):
    """7 ranks = 1 coordinator + 3 blocks of 2: 6 trials, study saved every 2 trials."""
    if MPIEXEC is None or not have_fashion_mnist():
        pytest.skip("needs mpiexec and Fashion-MNIST")
    folder = tmp_path_factory.mktemp("search7")
    proc = distnn("search", *BASE, "--block_size", 2, "--num_iterations", 6,
                  "--checkpoint", "ck", "--checkpoint_interval", 2, n=7, cwd=folder)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return folder, proc, _trials(folder / "ck")


@pytest.mark.mpi
@pytest.mark.slow
def test_seven_ranks_run_three_blocks_at_once(seven):
    folder, proc, data = seven
    assert "7 ranks = 1 coordinator + 3 blocks of 2" in proc.stdout
    trials = data["trials"]
    assert [t["number"] for t in trials] == list(range(6))
    assert all(t["state"] == "complete" and t["value"] > 0 for t in trials)
    assert {t["block"] for t in trials} == {0, 1, 2}
    # The blocks trained side by side: at some moment three trials were running.
    busy = max(sum(u["start"] <= t["start"] < u["end"] for u in trials) for t in trials)
    assert busy == 3, [(t["block"], t["start"], t["end"]) for t in trials]
    # One live line per finished trial (trial, block, parameters, objective, time).
    lines = LIVE.findall(proc.stdout)
    assert sorted(int(n) for n, _, _ in lines) == list(range(6))
    assert all(re.search(r"learning_rate=\S+ optimizer=\w+ batch_size=\d+\s+val_loss=\S+\s+"
                         r"[\d.]+ s$", rest) for _, _, rest in lines), lines
    table = proc.stdout.split("Search finished:")[1]
    assert re.search(r"^rank\s+trial\s+block\s+learning_rate\s+optimizer\s+batch_size\s+"
                     r"val_loss\s+time_s\s+state$", table, re.M)
    best = min(trials, key=lambda t: t["value"])
    assert re.search(rf"^1\s+{best['number']}\s+{best['block']}\s", table, re.M)
    assert data["summary"]["best_trial"] == best["number"]
    assert (folder / "ck" / "objective.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The coordinator waited for the blocks without spinning on a core.
    summary = data["summary"]
    assert summary["coordinator_cpu_s"] < 0.15 * summary["coordinator_wall_s"], summary


@pytest.mark.mpi
@pytest.mark.slow
def test_the_saved_study_is_an_optuna_storage(seven):
    folder, _, data = seven
    study = optuna.load_study(study_name=None, storage=f"sqlite:///{folder / 'ck' / 'study.db'}")
    assert study.study_name == "distnn-search"
    assert [(t.number, t.state.name, t.value) for t in study.trials] == [
        (t["number"], "COMPLETE", t["value"]) for t in data["trials"]]
    assert study.best_trial.params == data["summary"]["best_params"]


@pytest.mark.mpi
@pytest.mark.slow
def test_best_toml_retrains_to_the_same_objective(seven, tmp_path):
    folder, _, data = seven
    best = folder / "ck" / "best.toml"
    text = best.read_text()
    for key in data["summary"]["best_params"]:
        assert re.search(rf"^{key} = ", text, re.M), text
    proc = distnn("train", "--config", best, "--history_file", tmp_path / "h.json",
                  "--evaluate", "false", "--quiet", n=2, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    history = json.loads((tmp_path / "h.json").read_text())
    # Same options, seed and rank count: the same numbers, to the last bit.
    assert history["val_loss"][-1] == data["summary"]["best_value"]


@pytest.mark.mpi
@pytest.mark.slow
def test_resume_continues_with_the_same_trial_numbers(seven, tmp_path):
    folder, _, before = seven
    shutil.copytree(folder / "ck", tmp_path / "ck")
    # NNLO's spellings; 3 ranks = 1 coordinator + 1 block of 2.
    proc = distnn("search", *BASE, "--block-size", 2, "--num-iterations", 7, "--checkpoint",
                  "ck", "--checkpoint-interval", 1, "--opt-restore", n=3, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "6 finished trial(s) kept" in proc.stdout
    assert [int(n) for n, _, _ in LIVE.findall(proc.stdout)] == [6]
    after = _trials(tmp_path / "ck")["trials"]
    assert [t["number"] for t in after] == list(range(7))
    assert after[:6] == before["trials"]  # not run again: same values and timestamps
    assert all(t["state"] == "complete" and t["block"] == 0 for t in after[6:])
    study = optuna.load_study(study_name=None, storage=f"sqlite:///{tmp_path / 'ck' / 'study.db'}")
    assert len(study.trials) == 7


@pytest.mark.mpi
@pytest.mark.slow
@needs_mpi
@needs_data
def test_a_killed_search_resumes_its_interrupted_trials_under_their_numbers(tmp_path):
    args = ["search", "--model", "simplemlp", "--num_epochs", "3", "--steps_per_epoch", "5",
            "--block_size", "1", "--num_iterations", "3", "--checkpoint", "ck"]
    job = subprocess.Popen([MPIEXEC, "-n", "3", *COMMAND, *args], cwd=tmp_path, env=child_env(),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           start_new_session=True)
    try:
        for line in job.stdout:
            if line.startswith("trial"):
                break
        deadline = time.time() + 60
        while not (tmp_path / "ck" / "study.db").exists() and time.time() < deadline:
            time.sleep(0.02)
    finally:
        os.killpg(job.pid, signal.SIGKILL)  # the whole job dies at once, as in a crash
        job.wait(timeout=60)
    saved = optuna.load_study(study_name=None, storage=f"sqlite:///{tmp_path / 'ck' / 'study.db'}")
    done = {t.number: t.user_attrs["start"] for t in saved.trials if t.state.name == "COMPLETE"}
    running = sorted(t.number for t in saved.trials if t.state.name == "RUNNING")
    assert done and running, [(t.number, t.state.name) for t in saved.trials]

    proc = distnn(*args, "--resume", n=3, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"trial(s) {', '.join(map(str, running))} to run again" in proc.stdout
    rerun = sorted(int(n) for n, _, _ in LIVE.findall(proc.stdout))
    assert set(running) <= set(rerun) and not set(done) & set(rerun)
    trials = _trials(tmp_path / "ck")["trials"]
    assert [t["number"] for t in trials] == [0, 1, 2]
    assert all(t["state"] == "complete" for t in trials)
    assert {t["number"]: t["start"] for t in trials if t["number"] in done} == done


@pytest.mark.mpi
@pytest.mark.slow
@needs_mpi
@needs_data
def test_k_fold_and_a_failing_trial(tmp_path):
    (tmp_path / "space.toml").write_text("[space]\nlearning_rate = {choice = [0.05, 1e6]}\n")
    proc = distnn("search", *BASE, "--block_size", 1, "--n_fold", 2, "--sampler", "grid",
                  "--space", "space.toml", "--num_iterations", 5, "--output_dir", "out",
                  n=3, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    trials = {t["params"]["learning_rate"]: t for t in _trials(tmp_path / "out")["trials"]}
    assert sorted(trials) == [0.05, 1e6]  # the grid has 2 candidates
    good, bad = trials[0.05], trials[1e6]
    assert good["state"] == "complete" and len(good["folds"]) == 2
    assert good["value"] == pytest.approx(sum(good["folds"]) / 2, rel=1e-12)
    assert good["folds"][0] != good["folds"][1]
    assert bad["state"] == "fail" and bad["message"].startswith("diverged:"), bad
    table = proc.stdout.split("Search finished:")[1]
    assert re.search(r"val_loss\s+fold1\s+fold2\s+time_s\s+state", table)
    assert re.search(rf"^-\s+{bad['number']}\s.*fail: diverged", table, re.M)
    assert (tmp_path / "out" / "best.toml").exists()


@pytest.mark.mpi
@needs_mpi
def test_a_rank_count_that_does_not_split_is_refused_on_every_rank(tmp_path):
    proc = distnn("search", "--block_size", 2, "--output_dir", "out", n=4, cwd=tmp_path,
                  timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.count("error:") == 1, proc.stderr
    assert "4 ranks do not split into 1 coordinator + blocks of 2" in proc.stderr
    assert "mpiexec -n 3, 5, 7" in proc.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("args, message", [
    (["--space", "space.toml"], "'no_such_option' is not an option of distnn train"),
    (["--resume"], "--resume continues the study saved by --checkpoint DIR"),
    (["--objective", "val_top5"], "--objective 'val_top5': the candidates log loss, "
     "accuracy, val_loss, val_accuracy"),
    (["--save_weights", "w.npz"], "--save_weights is an option of distnn train"),
    (["--sampler", "grid"], "--sampler grid: parameter 'learning_rate'"),
    (["--config", "run.toml"], "[space] of --config 'run.toml': learning_rate: uniform needs "
     "finite low < high, got [1, 0.1]"),
])
def test_bad_options_are_one_line_errors(tmp_path, args, message):
    (tmp_path / "space.toml").write_text("[space]\nno_such_option = {choice = [1, 2]}\n")
    (tmp_path / "run.toml").write_text('model = "simplemlp"\n[search]\nblock_size = 1\n'
                                       "[space]\nlearning_rate = {uniform = [1, 0.1]}\n")
    proc = distnn("search", *args, cwd=tmp_path, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.mpi
@pytest.mark.slow
def test_a_saved_study_is_not_overwritten_without_resume(seven):
    folder, _, _ = seven
    before = (folder / "ck" / "study.db").read_bytes()
    proc = distnn("search", *BASE, "--checkpoint", "ck", cwd=folder, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "already holds a study (study.db); add --resume" in proc.stderr
    assert (folder / "ck" / "study.db").read_bytes() == before


@needs_data
def test_tensorboard_writes_one_run_per_trial_with_its_parameters(tmp_path):
    event_accumulator = pytest.importorskip(
        "tensorboard.backend.event_processing.event_accumulator")
    pytest.importorskip("tensorboardX")
    from tensorboard.plugins.hparams import plugin_data_pb2
    proc = distnn("search", "--model", "simplemlp", "--num_epochs", 1, "--steps_per_epoch", 3,
                  "--num_iterations", 2, "--tensorboard", "tb", "--output_dir", "out",
                  cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    trials = {t["number"]: t for t in _trials(tmp_path / "out")["trials"]}
    assert sorted(p.name for p in (tmp_path / "tb").iterdir()) == ["trial_0000", "trial_0001"]
    for number, trial in trials.items():
        root = event_accumulator.EventAccumulator(str(tmp_path / "tb" / f"trial_{number:04d}"))
        root.Reload()
        start = plugin_data_pb2.HParamsPluginData.FromString(root.PluginTagToContent(
            "hparams")["_hparams_/session_start_info"]).session_start_info
        assert start.hparams["optimizer"].string_value == trial["params"]["optimizer"]
        assert start.hparams["learning_rate"].number_value == pytest.approx(
            trial["params"]["learning_rate"])
        assert [e.value for e in root.Scalars("hparams/val_loss")] == pytest.approx(
            [trial["value"]], rel=1e-6)
