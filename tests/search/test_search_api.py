"""distnn.search's library parts with real inputs: spaces parsed from TOML text, optuna
studies saved to SQLite and resumed, k-fold splits, the best-configuration TOML read back by
the command's own config loader."""
from __future__ import annotations

import math
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest

optuna = pytest.importorskip("optuna")

from distnn.data import ArrayDataset  # noqa: E402
from distnn.search import (STUDY_FILE, SearchSpace, SearchStudy, block_count,  # noqa: E402
                           kfold_split, make_pruner, make_sampler, parse_objective, save_study,
                           write_toml)
from distnn.search.blocks import LayoutError  # noqa: E402

SPACE_TOML = """
[space]
learning_rate = {log_uniform = [1e-4, 1e-1]}
momentum = {uniform = [0.5, 0.99]}
batch_size = {int = [16, 128]}
warm_up_epochs = {log_int = [1, 16]}
optimizer = {choice = ["sgd", "adam"]}
model = ["simplecnn", "lenet"]
"""


def _space(text: str = SPACE_TOML) -> SearchSpace:
    return SearchSpace.from_dict(tomllib.loads(text)["space"])


def test_space_draws_each_kind_within_its_range():
    space = _space()
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    drawn = [space.suggest(study.ask()) for _ in range(40)]
    lr = np.array([d["learning_rate"] for d in drawn])
    assert lr.min() >= 1e-4 and lr.max() <= 1e-1
    # log-uniform: about as many draws below 10^-2.5 as above (uniform would put ~3%)
    assert 8 <= np.sum(lr < 10 ** -2.5) <= 32
    assert all(0.5 <= d["momentum"] <= 0.99 for d in drawn)
    assert all(isinstance(d["batch_size"], int) and 16 <= d["batch_size"] <= 128 for d in drawn)
    assert all(1 <= d["warm_up_epochs"] <= 16 for d in drawn)
    assert {d["optimizer"] for d in drawn} == {"sgd", "adam"}
    assert {d["model"] for d in drawn} == {"simplecnn", "lenet"}
    assert space.spec()["model"] == {"choice": ["simplecnn", "lenet"]}


@pytest.mark.parametrize("entry, message", [
    ("{normal = [0, 1]}", "unknown kind 'normal'"),
    ("{uniform = [1, 1]}", "finite low < high"),
    ("{log_uniform = [0, 1]}", "needs low > 0"),
    ("{int = [1.5, 4]}", "two integers"),
    ("{choice = []}", "non-empty array"),
    ("{choice = [1, 1]}", "twice"),
    ("3", "give one of"),
])
def test_space_errors_name_the_parameter_and_the_rule(entry, message):
    with pytest.raises(ValueError, match=message) as info:
        _space(f"[space]\nlearning_rate = {entry}\n")
    assert "learning_rate" in str(info.value)


def test_grid_needs_finite_values():
    assert _space("[space]\nx = {choice = [1, 2]}\ny = {int = [1, 3]}\n").grid_size() == 6
    with pytest.raises(ValueError, match="--sampler grid: parameter 'x'"):
        _space("[space]\nx = {uniform = [0, 1]}\n").grid()


def test_objective_directions():
    assert parse_objective("val_loss") == ("val_loss", "minimize")
    assert parse_objective("val_accuracy,max") == ("val_accuracy", "maximize")
    assert parse_objective("val_acc") == ("val_accuracy", "maximize")
    assert parse_objective("val_loss,max") == ("val_loss", "maximize")
    with pytest.raises(ValueError, match="min or max"):
        parse_objective("val_loss,down")


def test_block_count_says_which_rank_counts_work():
    assert block_count(7, 2) == 3
    assert block_count(7, 3) == 2
    assert block_count(1, 1) == 1
    with pytest.raises(LayoutError, match=r"6 ranks do not split .*mpiexec -n 3, 5, 7"):
        block_count(6, 2)
    with pytest.raises(LayoutError):
        block_count(2, 2)


def test_kfold_split_partitions_the_training_set():
    x = np.arange(103 * 4, dtype=np.float32).reshape(103, 1, 2, 2)
    y = np.arange(103) % 10
    ds = ArrayDataset(x, y, 10)
    held = []
    for fold in range(3):
        train, val = kfold_split(ds, 3, fold, seed=5)
        ids_train = {int(v) for v in train.x[:, 0, 0, 0]}
        ids_val = {int(v) for v in val.x[:, 0, 0, 0]}
        assert ids_train.isdisjoint(ids_val) and len(ids_train | ids_val) == 103
        assert len(val) in (34, 35)
        held.append(ids_val)
    assert set().union(*held) == {int(v) for v in x[:, 0, 0, 0]}
    np.testing.assert_array_equal(kfold_split(ds, 3, 1, seed=5)[1].y,
                                  kfold_split(ds, 3, 1, seed=5)[1].y)
    with pytest.raises(ValueError, match="--n_fold"):
        kfold_split(ds, 1, 0)


def _study_with_an_interrupted_trial(saved: bool):
    space = _space("[space]\nlearning_rate = {log_uniform = [1e-4, 1e-1]}\n"
                   "optimizer = {choice = [\"sgd\", \"adam\"]}\n")
    searched = SearchStudy.create("s", "minimize", make_sampler("random", space, 0),
                                  make_pruner("none"), {"space": space.spec()}, saved=saved)
    study = searched.study
    trials = [study.ask() for _ in range(3)]
    params = [space.suggest(t) for t in trials]
    study.tell(trials[0], 0.5)
    study.tell(trials[1], state=optuna.trial.TrialState.FAIL)
    return space, searched, params  # trial 2 is still running


def test_saved_study_is_an_optuna_storage_and_resumes_the_same_trial_numbers(tmp_path):
    space, searched, params = _study_with_an_interrupted_trial(True)
    path = searched.save(str(tmp_path))
    assert path == str(tmp_path / STUDY_FILE)
    # optuna's own API and command open it
    saved = optuna.load_study(study_name=None, storage=f"sqlite:///{path}")
    assert [t.state.name for t in saved.trials] == ["COMPLETE", "FAIL", "RUNNING"]
    assert saved.trials[0].value == 0.5
    optuna_cli = Path(sys.executable).parent / "optuna"
    if optuna_cli.exists():
        out = subprocess.run([str(optuna_cli), "trials", "--study-name", "s", "--storage",
                              f"sqlite:///{path}", "-f", "json"], capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert '"COMPLETE"' in out.stdout and '"RUNNING"' in out.stdout

    resumed = SearchStudy.load(str(tmp_path), make_sampler("random", space, 3),
                               make_pruner("none"))
    study = resumed.study
    assert [(t.number, t.state.name) for t in study.trials] == [
        (0, "COMPLETE"), (1, "FAIL"), (2, "WAITING")]
    assert study.user_attrs["distnn_search"]["space"] == space.spec()
    again = study.ask()  # the interrupted trial, same number, same parameters
    assert again.number == 2 and space.suggest(again) == params[2]
    fresh = study.ask()
    assert fresh.number == 3
    study.tell(fresh, 0.25)

    # The generic copy (any optuna study) replaces the file atomically; a running trial
    # is saved as waiting with its parameters fixed.
    save_study(study, str(tmp_path))
    assert [p.name for p in tmp_path.iterdir()] == [STUDY_FILE]
    again = SearchStudy.load(str(tmp_path), make_sampler("tpe", space, 0),
                             make_pruner("none")).study
    assert [t.state.name for t in again.trials] == ["COMPLETE", "FAIL", "WAITING", "COMPLETE"]
    redo = again.ask()
    assert redo.number == 2 and space.suggest(redo) == params[2]
    assert again.ask().number == 4


def test_loading_refuses_files_that_are_not_a_search(tmp_path):
    space = _space("[space]\nx = {uniform = [0, 1]}\n")
    (tmp_path / STUDY_FILE).write_bytes(b"not a database")
    with pytest.raises(ValueError, match="study.db"):
        SearchStudy.load(str(tmp_path), make_sampler("tpe", space, 0), make_pruner("none"))
    with pytest.raises(FileNotFoundError):
        SearchStudy.load(str(tmp_path / "none"), make_sampler("tpe", space, 0),
                         make_pruner("none"))


def test_best_toml_is_read_back_by_the_train_config_loader(tmp_path):
    from distnn.run.config import load_toml
    tables = {"model": {"model": "simplecnn", "random_seed": 3},
              "optim": {"optimizer": "adam", "learning_rate": 0.0012345678901234567,
                        "metrics": ["categorical_accuracy"]},
              "train": {"batch_size": 64, "shuffle": False},
              "sched": {"stop_at_loss_threshold": -math.inf}}
    write_toml(str(tmp_path / "best.toml"), tables, "a comment\non two lines")
    values = load_toml(str(tmp_path / "best.toml"))
    assert values["learning_rate"] == 0.0012345678901234567  # exact round trip
    assert values["optimizer"] == "adam" and values["batch_size"] == 64
    assert values["shuffle"] is False and values["metrics"] == ("categorical_accuracy",)
    assert values["stop_at_loss_threshold"] == -math.inf


def test_the_median_pruner_stops_a_bad_candidate_after_an_epoch(tmp_path):
    """The library route (one process): real Trainer runs on a learnable synthetic set;
    the candidates are queued in a known order so the pruner's decision is certain."""
    from io import StringIO

    from distnn.distributed import LocalComm
    from distnn.models import get_model
    from distnn.optim import get_optimizer
    from distnn.search import SearchSettings, run_search
    from distnn.training import Trainer

    rng = np.random.default_rng(0)
    x = rng.random((512, 1, 8, 8), dtype=np.float32)
    y = (x.reshape(512, -1)[:, :4] @ np.array([1.0, 2.0, 4.0, 8.0]) > 7.5).astype(np.int64)
    train, val = ArrayDataset(x[:384], y[:384], 2), ArrayDataset(x[384:], y[384:], 2)

    def train_fn(params, comm, fold, callbacks):
        model = get_model("simplemlp", input_shape=(1, 8, 8), num_classes=2, rng=0)
        optimizer = get_optimizer("sgd", model, lr=params["learning_rate"], momentum=0.9)
        trainer = Trainer(model, optimizer, comm=comm, callbacks=callbacks, progress=False,
                          verbose=False)
        return trainer.fit(train, epochs=3, batch_size=32, validation=val)

    space = _space("[space]\nlearning_rate = {log_uniform = [1e-8, 1e-1]}\n")
    settings = SearchSettings(num_trials=4, pruner="median", checkpoint=str(tmp_path))
    searched = SearchStudy.create("p", "minimize", make_sampler("tpe", space, 0),
                                  make_pruner("median"), {}, saved=True)
    for lr in (0.05, 0.03, 1e-8, 0.04):
        searched.study.enqueue_trial({"learning_rate": lr})
    out = StringIO()
    coordinator = run_search(LocalComm(), settings, space, train_fn, study=searched, out=out)
    states = [(r.number, r.state) for r in coordinator.records]
    assert states == [(0, "complete"), (1, "complete"), (2, "pruned"), (3, "complete")], \
        out.getvalue()
    pruned = coordinator.records[2]
    assert "after epoch 1 is worse than the median" in pruned.message
    assert "PRUNED" in out.getvalue().splitlines()[2]
    saved = optuna.load_study(study_name=None, storage=f"sqlite:///{tmp_path / STUDY_FILE}")
    assert [t.state.name for t in saved.trials] == ["COMPLETE", "COMPLETE", "PRUNED",
                                                   "COMPLETE"]
    assert len(saved.trials[0].intermediate_values) == 3  # one report per epoch
