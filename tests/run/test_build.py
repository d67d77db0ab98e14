"""distnn.run: a Python user builds and fits the run ``distnn train`` makes, from the same
options, without the command; rules are built from their constructors' signatures."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from distnn.distributed import LocalComm
from distnn.run import ConfigError, RunError, build_config, build_rule, build_run

from helpers import COMMAND, MPIEXEC, child_env
OPTIONS = {"dataset": "synthetic", "input_shape": (1, 8, 8), "num_samples": 300,
           "batch_size": 16, "num_epochs": 2, "learning_rate": 0.01, "random_seed": 3,
           "optimizer": "adam", "evaluate": False, "quiet": True}
FLAGS = ["--dataset", "synthetic", "--input_shape", "1,8,8", "--num_samples", "300",
         "--batch_size", "16", "--num_epochs", "2", "--learning_rate", "0.01",
         "--random_seed", "3", "--optimizer", "adam", "--evaluate", "false", "--quiet"]


def _env():
    return child_env()


def _command(tmp_path, *launcher):
    proc = subprocess.run([*launcher, *COMMAND, "train", *FLAGS, "--save_weights", "w.npz",
                           "--history_file", "h.json"], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path, env=_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with np.load(tmp_path / "w.npz") as data:
        weights = {k: data[k] for k in data.files}
    return weights, json.loads((tmp_path / "h.json").read_text())


def test_a_python_run_equals_the_command(tmp_path):
    from threadpoolctl import threadpool_limits
    cfg = build_config("train", OPTIONS)
    with threadpool_limits(limits=1):
        run = build_run(cfg, LocalComm())
        history = run.fit()
    weights, logged = _command(tmp_path)
    assert sorted(run.model.named_arrays()) == sorted(weights)
    for key, value in run.model.named_arrays().items():
        np.testing.assert_allclose(value, weights[key], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(history.history["loss"], logged["loss"], rtol=1e-5)
    assert type(run.trainer.rule).__name__ == "DataParallel"
    assert run.train is run.splits.train and run.val is run.splits.val


@pytest.mark.mpi
@pytest.mark.skipif(MPIEXEC is None, reason="needs mpiexec")
def test_a_python_run_on_two_ranks_equals_the_command(tmp_path):
    script = tmp_path / "run.py"
    script.write_text(
        "import json, sys\n"
        "import numpy as np\n"
        "from distnn.run import build_config, build_run\n"
        f"run = build_run(build_config('train', {OPTIONS!r}))\n"
        "run.fit()\n"
        "if run.comm.rank == 0:\n"
        "    np.savez('py.npz', **run.model.named_arrays())\n")
    proc = subprocess.run([MPIEXEC, "-n", "2", sys.executable, str(script)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path, env=_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    weights, _ = _command(tmp_path, MPIEXEC, "-n", "2")
    with np.load(tmp_path / "py.npz") as data:
        assert sorted(data.files) == sorted(weights)
        for key in data.files:
            np.testing.assert_allclose(data[key], weights[key], rtol=1e-5, atol=1e-6)


def test_rules_are_built_from_their_signatures():
    comm = LocalComm()
    rule = build_rule(build_config("train", {"parallel": "gossip", "gossip_probability": 0.5,
                                             "synchronous": True}), comm)
    assert (type(rule).__name__, rule.probability, rule.synchronous) == ("Gossip", 0.5, True)
    rule = build_rule(build_config("train", {"gradient_compression": "fp16",
                                             "bucket_size_mb": 1.5,
                                             "non_blocking_mpi": False}), comm)
    assert (rule.compression, rule.bucket_size_mb, rule.non_blocking) == ("fp16", 1.5, False)
    assert build_rule(build_config("train", {}), comm).compression is None
    rule = build_rule(build_config("train", {"parallel": "easgd", "synchronous": True,
                                             "elastic_force": 0.5, "sync_every": 2}), comm)
    assert (rule.elastic_force, rule.sync_every, rule.min_ranks) == (0.5, 2, 1)
    with pytest.raises(ConfigError, match="--parallel downpour: .* at least 2 ranks, got 1"):
        build_rule(build_config("train", {"parallel": "downpour"}), comm)


def test_run_errors_name_the_option(tmp_path):
    cfg = build_config("train", {**OPTIONS, "validate_every": 2, "validation_split": 0.0})
    with pytest.raises(RunError, match="--validate_every needs validation data"):
        build_run(cfg, LocalComm())
    cfg = build_config("train", {**OPTIONS, "dataset": "mnist", "download": False,
                                 "dataset_path": str(tmp_path)})
    # The library names its Python argument (path=); the command says --dataset_path.
    with pytest.raises(RunError, match=r"^dataset 'mnist' not found(.|\n)*pass path=<folder>"):
        build_run(cfg, LocalComm())
