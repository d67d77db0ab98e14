"""``build_run(cfg).fit()`` from Python is the run ``distnn train`` makes: the same weights
(bit for bit), history, checkpoint and messages, on 1 and 2 ranks, and so is a resume from
that checkpoint with a new learning rate (which the resume must apply, and say so)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from helpers import COMMAND, MPIEXEC

# Options of the first run, then of its resume (by option name and as flags).
FIRST = {"dataset": "synthetic", "input_shape": (1, 8, 8), "num_samples": 256,
         "batch_size": 16, "num_epochs": 2, "learning_rate": 0.01, "random_seed": 3,
         "optimizer": "adam", "evaluate": False, "checkpoint": "ck.npz",
         "history_file": "h.json", "save_weights": "w.npz"}
RESUME = {**{k: v for k, v in FIRST.items() if k != "checkpoint"}, "resume": "ck.npz",
          "num_epochs": 3, "learning_rate": 0.02, "history_file": "h2.json",
          "save_weights": "w2.npz"}
PREDICT = {k: FIRST[k] for k in ("dataset", "input_shape", "num_samples", "random_seed")}
PREDICT.update(weights_and_bias_filename="w2.npz", output="p.npz", split="test")
SCRIPT = """\
import sys
from distnn.run import build_config, build_run
command, values = sys.argv[1], eval(sys.argv[2])
run = build_run(build_config(command, values))
run.fit() if command == "train" else run.predict()
"""
TIMING = re.compile(r"\d[\d,]*(\.\d+)?k? (s|samples/s|ms)\b")


def _flags(values: dict) -> list[str]:
    out = []
    for name, value in values.items():
        text = ",".join(map(str, value)) if isinstance(value, tuple) else str(value)
        out += [f"--{name}", text.lower() if isinstance(value, bool) else text]
    return out


def _env() -> dict:
    env = dict(os.environ)
    # the NumPy kernels: the same arithmetic, without compiling in every process
    env.update(DISTNN_KERNELS="numpy", PYTHONUNBUFFERED="1")
    return env


def _run(folder: Path, argv: list[str], launcher: list[str]) -> list[str]:
    folder.mkdir(exist_ok=True)
    proc = subprocess.run([*launcher, *argv], capture_output=True, text=True, timeout=600,
                          cwd=folder, env=_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return [TIMING.sub("<t>", line) for line in proc.stdout.splitlines()]


def _python(folder: Path, values: dict, launcher: list[str], command="train") -> list[str]:
    folder.mkdir(exist_ok=True)
    (folder / "run.py").write_text(SCRIPT)
    return _run(folder, [sys.executable, "run.py", command, repr(values)], launcher)


def _command(folder: Path, values: dict, launcher: list[str]) -> list[str]:
    lines = _run(folder, [*COMMAND, "train", *_flags(values)], launcher)
    # the command's own lines (its header and where it wrote the weights) are formatting
    assert lines[0].startswith("distnn ") and " train: " in lines[0], lines
    return [ln for ln in lines[1:] if not ln.startswith("Weights written to ")]


def _arrays(path: Path) -> dict:
    with np.load(path) as data:
        return {k: data[k] for k in data.files}


def _history(path: Path) -> dict:
    logged = json.loads(path.read_text())
    return {k: v for k, v in logged.items() if k not in ("time", "samples_per_s")}


def _same_files(a: Path, b: Path, weights: str, history: str) -> dict:
    """The run's files in ``a`` and ``b`` are the same; the checkpoint's meta."""
    wa, wb = _arrays(a / weights), _arrays(b / weights)
    assert sorted(wa) == sorted(wb)
    assert all(np.array_equal(wa[k], wb[k]) for k in wa), weights
    assert _history(a / history) == _history(b / history)
    ca, cb = _arrays(a / "ck.npz"), _arrays(b / "ck.npz")
    assert sorted(ca) == sorted(cb)
    assert all(np.array_equal(ca[k], cb[k]) for k in ca if k != "__meta__")
    ma, mb = (json.loads(str(c["__meta__"])) for c in (ca, cb))
    for meta in (ma, mb):
        for epoch in meta["history"]:
            epoch.pop("time"), epoch.pop("samples_per_s")
    assert ma == mb
    return ma


def _check(tmp_path: Path, launcher: list[str], ranks: int) -> None:
    py, cmd = tmp_path / "python", tmp_path / "command"
    said_py = _python(py, FIRST, launcher)
    said_cmd = _command(cmd, FIRST, launcher)
    assert said_py == said_cmd
    assert any(line.startswith("Training: 2 epochs in <t>") for line in said_py), said_py
    meta = _same_files(py, cmd, "w.npz", "h.json")
    assert meta["run"]["ranks"] == ranks and meta["run"]["learning_rate"] == 0.01
    first = _arrays(py / "w.npz")

    said_py = _python(py, RESUME, launcher)
    said_cmd = _command(cmd, RESUME, launcher)
    assert said_py == said_cmd
    # the resume applied the new learning rate and said so, in both
    assert any(line.startswith("resume: learning rate 0.02 applied from --learning_rate")
               for line in said_py), said_py
    meta = _same_files(py, cmd, "w2.npz", "h2.json")
    assert meta["epochs_done"] == 3 and meta["run"]["learning_rate"] == 0.02
    assert [e["lr"] for e in meta["history"]] == [0.01, 0.01, 0.02]
    # the third epoch trained: the comparison above compared weights that moved
    resumed = _arrays(py / "w2.npz")
    assert any(not np.array_equal(first[k], resumed[k]) for k in first)

    # distnn predict with the resumed run's weights: the same predictions file
    _python(py, PREDICT, launcher, "predict")
    said = _run(cmd, [*COMMAND, "predict", *_flags(PREDICT)], launcher)
    assert said[-1].startswith("Predictions of 64 test samples written to p.npz"), said
    mine, theirs = _arrays(py / "p.npz"), _arrays(cmd / "p.npz")
    assert sorted(mine) == ["labels", "logits", "predicted"] == sorted(theirs)
    assert all(np.array_equal(mine[k], theirs[k]) for k in mine)


def test_the_python_run_is_the_command_run_with_resume(tmp_path):
    _check(tmp_path, [], 1)


@pytest.mark.mpi
@pytest.mark.skipif(MPIEXEC is None, reason="needs mpiexec")
def test_on_two_ranks_the_python_run_is_the_command_run_with_resume(tmp_path):
    _check(tmp_path, [MPIEXEC, "-n", "2"], 2)
