"""What broke when distnn was tried as a new user would (issue 11), one test per class,
through the real ``distnn`` command (and ``mpiexec`` where ranks matter)."""
from __future__ import annotations

import io
import json
import math
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import COMMAND, child_env, launcher
from helpers import needs_mpiexec as needs_mpi

from distnn.training import Reporter, load_checkpoint

# 96 synthetic 8x8 samples: 76 train, 20 val, 5 steps of 16 per epoch.
DATA = ["--dataset", "synthetic", "--input_shape", "1,8,8", "--num_samples", "96",
        "--evaluate", "false", "--random_seed", "3"]
QUIET = [*DATA, "--quiet"]


def distnn(*args, cwd, ranks=1, umask=None, timeout=180):
    return subprocess.run([*launcher(ranks), *COMMAND, *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, cwd=cwd, env=child_env(),
                          preexec_fn=(lambda: os.umask(umask)) if umask is not None else None)


def ok(proc):
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def weights(path):
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def history(path):
    return json.loads(Path(path).read_text())


# -- 1. --lr_schedulers model_checkpoint -----------------------------------------------------
@pytest.mark.parametrize("ranks", [1, pytest.param(2, marks=[pytest.mark.mpi, needs_mpi])])
def test_model_checkpoint_saves_weights_every_epoch(tmp_path, ranks):
    ok(distnn("train", *QUIET, "--batch_size", "8", "--num_epochs", "2", "--lr_schedulers",
              "model_checkpoint", "--model_checkpoint_save_freq", "1", "--model_checkpoint_file",
              "m-{epoch:02d}-{val_loss:.3f}.npz", "--save_weights", "final.npz", cwd=tmp_path,
              ranks=ranks))
    saved = sorted(p.name for p in tmp_path.glob("m-*.npz"))
    assert [name[:4] for name in saved] == ["m-01", "m-02"], saved
    last, final = weights(tmp_path / saved[1]), weights(tmp_path / "final.npz")
    assert last.keys() == final.keys()
    for key in final:
        np.testing.assert_array_equal(last[key], final[key])


# -- 2./3. --resume alone, no silent overwrite -----------------------------------------------
def test_resume_alone_continues_exactly_and_keeps_checkpointing(tmp_path):
    common = [*DATA, "--batch_size", "16", "--learning_rate", "0.01",
              "--lr_schedulers", "reduce_lr_on_plateau"]
    ok(distnn("train", *common, "--quiet", "--num_epochs", "2", "--save_weights", "a.npz",
              cwd=tmp_path))
    ok(distnn("train", *common, "--quiet", "--num_epochs", "1", "--checkpoint", "ck.npz",
              cwd=tmp_path))
    first = (tmp_path / "ck.npz").read_bytes()
    refused = distnn("train", *common, "--quiet", "--num_epochs", "1", "--checkpoint", "ck.npz",
                     cwd=tmp_path)
    assert refused.returncode == 2 and "--overwrite" in refused.stderr
    assert (tmp_path / "ck.npz").read_bytes() == first
    ok(distnn("train", *common, "--quiet", "--num_epochs", "1", "--checkpoint", "ck.npz",
              "--overwrite", cwd=tmp_path))
    proc = ok(distnn("train", *common, "--num_epochs", "2", "--resume", "ck.npz",
                     "--save_weights", "b.npz", cwd=tmp_path))
    assert "resuming from epoch 1 of ck.npz" in proc.stdout
    header = proc.stdout.splitlines()[0]
    assert "--verbose lists every option" in header and "Total parameters" not in proc.stdout
    assert load_checkpoint(tmp_path / "ck.npz").epochs_done == 2  # kept checkpointing
    a, b = weights(tmp_path / "a.npz"), weights(tmp_path / "b.npz")
    for key in a:
        np.testing.assert_array_equal(a[key], b[key])


# -- 5. resume on another rank count and with changed settings -------------------------------
@pytest.mark.mpi
@needs_mpi
def test_resume_on_another_rank_count_keeps_the_global_batch(tmp_path):
    common = [*QUIET, "--batch_size", "8", "--learning_rate", "0.01"]
    ok(distnn("train", *common, "--num_epochs", "2", "--save_weights", "a.npz", cwd=tmp_path,
              ranks=2))
    ok(distnn("train", *common, "--num_epochs", "1", "--checkpoint", "ck.npz", cwd=tmp_path,
              ranks=2))
    meta = load_checkpoint(tmp_path / "ck.npz").meta
    assert meta["ranks"] == 2 and meta["global_batch_size"] == 16
    refused = distnn("train", *common, "--num_epochs", "2", "--resume", "ck.npz",
                     "--global_batch_size", "32", cwd=tmp_path)
    assert refused.returncode == 2 and "--global_batch_size" in refused.stderr
    proc = ok(distnn("train", *DATA, "--batch_size", "8", "--learning_rate", "0.01",
                     "--num_epochs", "2", "--resume", "ck.npz", "--save_weights", "c.npz",
                     cwd=tmp_path))
    assert "global batch 16 kept from ck.npz (written on 2 rank(s)); on 1 rank(s) that is 16 " \
           "per rank" in proc.stdout, proc.stdout
    assert "global batch size 16" in proc.stdout.splitlines()[0]
    a, c = weights(tmp_path / "a.npz"), weights(tmp_path / "c.npz")
    for key in a:
        np.testing.assert_allclose(c[key], a[key], rtol=1e-4, atol=1e-6)
    meta = load_checkpoint(tmp_path / "ck.npz").meta
    assert meta["ranks"] == 1 and meta["global_batch_size"] == 16 and meta["epochs_done"] == 2


def test_resume_applies_or_refuses_each_changed_setting(tmp_path):
    common = [*QUIET, "--batch_size", "16", "--momentum", "0.9"]
    ok(distnn("train", *common, "--learning_rate", "0.001", "--num_epochs", "1",
              "--checkpoint", "ck.npz", cwd=tmp_path))
    base = (tmp_path / "ck.npz").read_bytes()
    for args, option in ((["--optimizer", "adam"], "--optimizer"),
                         (["--momentum", "0.5"], "--momentum"),
                         (["--random_seed", "9"], "--random_seed"),
                         (["--model", "simplemlp"], "--model")):
        proc = distnn("train", *common, *args, "--num_epochs", "2", "--resume", "ck.npz",
                      cwd=tmp_path)
        assert proc.returncode == 2, (args, proc.stderr)
        line = proc.stderr.strip()
        assert "\n" not in line and line.startswith(f"distnn train: error: {option}"), line
        assert "Traceback" not in proc.stderr
    assert (tmp_path / "ck.npz").read_bytes() == base
    # Not given: the checkpoint's rate continues (not the default 0.01), and the run says so.
    shutil.copy(tmp_path / "ck.npz", tmp_path / "ck2.npz")
    proc = ok(distnn("train", *DATA, "--batch_size", "16", "--num_epochs", "2", "--resume",
                     "ck2.npz", "--history_file", "h2.json", cwd=tmp_path))
    assert "learning rate 0.001 continues from ck2.npz" in proc.stdout
    assert history(tmp_path / "h2.json")["lr"] == [0.001, 0.001]
    # Given: applied, and said.
    proc = ok(distnn("train", *DATA, "--batch_size", "16", "--num_epochs", "2", "--resume",
                     "ck.npz", "--learning_rate", "0.005", "--history_file", "h.json",
                     cwd=tmp_path))
    assert "learning rate 0.005 applied from --learning_rate" in proc.stdout
    assert "learning rate 0.005" in proc.stdout.splitlines()[0]
    assert history(tmp_path / "h.json")["lr"] == [0.001, 0.005]


# -- 7. divergence ---------------------------------------------------------------------------
@pytest.mark.parametrize("ranks", [1, pytest.param(2, marks=[pytest.mark.mpi, needs_mpi])])
def test_non_finite_loss_stops_every_rank_with_exit_3(tmp_path, ranks):
    args = [*QUIET, "--batch_size", "8", "--learning_rate", "1e6", "--num_epochs", "3",
            "--checkpoint", "ck.npz", "--history_file", "h.json"]
    proc = distnn("train", *args, cwd=tmp_path, ranks=ranks)
    assert proc.returncode == 3, proc.stderr
    assert "Traceback" not in proc.stderr
    line = [x for x in proc.stderr.splitlines() if x.startswith("distnn train: error:")]
    assert len(line) == 1, proc.stderr
    assert "epoch 1, step " in line[0] and "learning rate 1e+06" in line[0]
    assert "--ignore_nan" in line[0]
    assert not (tmp_path / "ck.npz").exists()  # diverged in epoch 1: nothing checkpointed
    ok(distnn("train", *args[:-4], "--ignore_nan", "--history_file", "h.json", cwd=tmp_path,
              ranks=ranks))
    loss = history(tmp_path / "h.json")["loss"]
    assert len(loss) == 3 and not math.isfinite(loss[-1])


# -- the kill-during-checkpoint test ----------------------------------------------------------
def test_killed_during_a_checkpoint_write_the_previous_one_survives(tmp_path):
    # A 3.7 MB model (+ momentum): each checkpoint write takes a while.
    args = ["--dataset", "synthetic", "--input_shape", "1,28,28", "--num_samples", "64",
            "--model", "simplemlp", "--batch_size", "16", "--steps_per_epoch", "1",
            "--evaluate", "false", "--validation_split", "0", "--quiet",
            "--checkpoint", "ck.npz"]
    proc = subprocess.Popen([*COMMAND, "train", *args, "--num_epochs", "200"], cwd=tmp_path,
                            env=child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    caught = None
    deadline = time.time() + 120
    try:
        while caught is None and proc.poll() is None and time.time() < deadline:
            parts = [p for p in tmp_path.iterdir() if p.name.endswith(".part")]
            if parts and (tmp_path / "ck.npz").exists():
                proc.send_signal(signal.SIGSTOP)  # freeze it, then see if still mid-write
                if parts[0].exists():
                    caught = parts[0]
                    proc.kill()
                else:
                    proc.send_signal(signal.SIGCONT)
            time.sleep(0.0005)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    assert caught is not None, (f"never saw a checkpoint being written (exit {proc.returncode}"
                                f"): {proc.stderr.read().decode()}")
    proc.stderr.close()
    assert caught.exists()  # the killed write's temporary file is left behind...
    state = load_checkpoint(tmp_path / "ck.npz")  # ...and the previous checkpoint is whole
    done = state.epochs_done
    assert done >= 1
    resumed = ok(distnn("train", *args[:-1], "ck.npz", "--resume", "ck.npz", "--num_epochs",
                        done + 1, "--quiet", "false", cwd=tmp_path))
    assert f"resuming from epoch {done} of ck.npz" in resumed.stdout
    assert load_checkpoint(tmp_path / "ck.npz").epochs_done == done + 1
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".part")]  # cleaned up


# -- 8. the smaller ones ---------------------------------------------------------------------
def test_files_follow_the_umask(tmp_path):
    ok(distnn("train", *QUIET, "--num_epochs", "1", "--steps_per_epoch", "1", "--save_weights",
              "w.npz", "--checkpoint", "ck.npz", "--history_file", "h.csv", cwd=tmp_path,
              umask=0o027))
    for name in ("w.npz", "ck.npz", "h.csv"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o640, name


def test_progress_bar_redraws_when_stderr_is_a_pipe(monkeypatch):
    # Under mpiexec a rank's stderr is a pipe: the bar must still redraw about every second.
    pipe = io.StringIO()
    monkeypatch.setattr(sys, "stderr", pipe)
    reporter = Reporter(True, progress=True, verbose=True)
    bar = reporter.open_bar(30, "Epoch 1/1")
    for _ in range(30):
        time.sleep(0.1)
        bar.update(1)
    reporter.epoch_line({"epoch": 1, "loss": 1.0, "time": 3.0, "samples_per_s": 10.0}, 1)
    frames = [f for f in pipe.getvalue().split("\r") if "Epoch 1/1" in f]
    assert len(frames) >= 3, frames


def test_verbose_lists_the_options(tmp_path):
    proc = ok(distnn("train", *DATA, "--num_epochs", "0", "--verbose", cwd=tmp_path))
    assert "Total parameters" in proc.stdout and "learning_rate" in proc.stdout
    assert len(proc.stdout.splitlines()) > 40


def test_dataset_not_found_names_the_option(tmp_path):
    proc = distnn("train", "--dataset", "mnist", "--dataset_path", tmp_path / "missing",
                  "--download", "false", cwd=tmp_path)
    assert proc.returncode == 2
    assert "--dataset_path" in proc.stderr and "path=<" not in proc.stderr


def test_predict_the_validation_split(tmp_path):
    ok(distnn("train", *QUIET, "--num_epochs", "1", "--save_weights", "w.npz",
              "--history_file", "h.json", cwd=tmp_path))
    data = [a for a in QUIET if a not in ("--evaluate", "false")]
    proc = ok(distnn("predict", *data, "--weights", "w.npz", "--split", "val", "--output",
                     "p.csv", cwd=tmp_path))
    rows = (tmp_path / "p.csv").read_text().splitlines()
    assert len(rows) == 1 + 20  # the 20 samples train held out
    acc = history(tmp_path / "h.json")["val_accuracy"][-1]
    assert f"accuracy={acc:.4f}" in proc.stdout


def test_hdf5_val_list_needs_no_validation_split(tmp_path):
    h5py = pytest.importorskip("h5py")
    rng = np.random.default_rng(0)
    for name, n in (("train", 64), ("val", 16)):
        with h5py.File(tmp_path / f"{name}.h5", "w") as f:
            f["features"] = rng.random((n, 1, 8, 8), dtype=np.float32)
            f["labels"] = rng.integers(0, 3, n)
        (tmp_path / f"{name}.list").write_text(f"{tmp_path / name}.h5\n")
    ok(distnn("train", "--dataset", "hdf5", "--train_list", "train.list", "--val_list",
              "val.list", "--num_classes", "3", "--num_epochs", "1", "--batch_size", "16",
              "--evaluate", "false", "--quiet", "--history_file", "h.json", cwd=tmp_path))
    assert "val_loss" in history(tmp_path / "h.json")


@pytest.mark.mpi
@needs_mpi
def test_info_reports_the_threads_train_uses(tmp_path):
    proc = ok(distnn("info", cwd=tmp_path, ranks=2))
    assert "BLAS threads per rank in train: 1" in proc.stdout
    rank_lines = [x for x in proc.stdout.splitlines() if x.strip().startswith("rank ")]
    assert len(rank_lines) == 2
    for line in rank_lines:
        counts = [int(part.split("=")[1]) for part in line.split("threads now ")[1].split(", ")
                  if "=" in part]
        assert counts and all(c == 1 for c in counts), line
