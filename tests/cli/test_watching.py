"""Watching a run (issue 22), through the real ``distnn`` command under ``mpiexec -n 2`` on
Fashion-MNIST (tiny epochs: --steps_per_epoch 6): TensorBoard event files read back with
TensorBoard's own reader, also after --resume; --plot and ``distnn plot`` PNGs opened with
Pillow; the one-line error when the writer library is missing."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from helpers import COMMAND, child_env, launcher, needs_fashion_mnist, needs_mpiexec

pytest.importorskip("tensorboardX")
pytest.importorskip("matplotlib")
event_accumulator = pytest.importorskip(
    "tensorboard.backend.event_processing.event_accumulator")
Image = pytest.importorskip("PIL.Image")

STEPS, EVERY = 6, 3
RUN = ["--model", "simplemlp", "--dataset", "fashion_mnist", "--steps_per_epoch", STEPS,
       "--batch_size", 32, "--evaluate", "false", "--quiet", "--tensorboard", "tb",
       "--tensorboard_every", EVERY, "--history_file", "h.json"]


pytestmark = [pytest.mark.mpi, pytest.mark.slow, needs_mpiexec, needs_fashion_mnist]


def distnn(*args, cwd, ranks=2, env=None, timeout=240):
    return subprocess.run([*launcher(ranks), *COMMAND, *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, cwd=cwd, env=child_env(**(env or {})))


def ok(proc):
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def events(folder: Path):
    acc = event_accumulator.EventAccumulator(str(folder), size_guidance={"scalars": 0,
                                                                          "tensors": 0})
    acc.Reload()
    return acc


def scalars(acc, tag) -> list[tuple[int, float]]:
    return [(e.step, e.value) for e in acc.Scalars(tag)]


@pytest.fixture(scope="module")
def resumed(tmp_path_factory):
    """2 epochs with a checkpoint (ck.npz, kept as ck2.npz); a resume to 3 epochs that
    writes epoch 3; then, as if that run had been lost after its checkpoint, a resume of
    ck2.npz to 4 epochs into the same folder, which rewrites epoch 3 and adds epoch 4."""
    folder = tmp_path_factory.mktemp("watch")
    first = ok(distnn("train", *RUN, "--num_epochs", 2, "--checkpoint", "ck.npz", "--plot",
                      "curves.png", cwd=folder))
    shutil.copy(folder / "ck.npz", folder / "ck2.npz")
    two = json.loads((folder / "h.json").read_text())
    shutil.copytree(folder / "tb", folder / "tb_two_epochs")
    ok(distnn("train", *RUN, "--num_epochs", 3, "--resume", "ck.npz", cwd=folder))
    ok(distnn("train", *RUN, "--num_epochs", 4, "--resume", "ck2.npz", cwd=folder))
    return folder, first, two


def test_two_ranks_write_the_scalars_tensorboard_reads(resumed):
    folder, first, two = resumed
    train = events(folder / "tb_two_epochs" / "train")
    val = events(folder / "tb_two_epochs" / "validation")
    every = list(range(EVERY, 2 * STEPS + 1, EVERY))
    for tag in ("batch/loss", "batch/accuracy", "batch/lr", "batch/samples_per_s",
                "comm/wait_ms", "comm/bytes", "comm/messages"):
        assert [s for s, _ in scalars(train, tag)] == every, tag
    # Every step's gradient all-reduce: the whole flat buffer of simplemlp (float32).
    assert all(v > 1e5 for _, v in scalars(train, "comm/bytes"))
    assert all(v > 0 for _, v in scalars(train, "batch/samples_per_s"))
    assert [v for _, v in scalars(train, "batch/lr")] == pytest.approx([0.01] * len(every))
    # Per epoch, at the step that ended it: the values of the history file.
    ends = [STEPS, 2 * STEPS]
    for key in ("loss", "accuracy", "lr", "samples_per_s"):
        assert scalars(train, f"epoch/{key}") == [
            (s, pytest.approx(v, rel=1e-6)) for s, v in zip(ends, two[key])], key
    for key in ("loss", "accuracy"):
        assert scalars(val, f"epoch/{key}") == [
            (s, pytest.approx(v, rel=1e-6)) for s, v in zip(ends, two[f"val_{key}"])], key
    for rank in (0, 1):
        assert [s for s, _ in scalars(train, f"comm/epoch_mb/rank{rank}")] == ends
    text = train.Tensors("options/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "| model | simplemlp |" in text and "| ranks | 2 |" in text


def test_resumed_runs_continue_the_curves_without_duplicates(resumed):
    folder, _, _ = resumed
    history = json.loads((folder / "h.json").read_text())
    assert history["epoch"] == [1, 2, 3, 4]
    train = events(folder / "tb" / "train")
    val = events(folder / "tb" / "validation")
    steps = [s for s, _ in scalars(train, "batch/loss")]
    assert steps == list(range(EVERY, 4 * STEPS + 1, EVERY))  # none missing, none twice
    ends = [STEPS * e for e in (1, 2, 3, 4)]
    # The epoch-3 values are those of the second resume (the first one's were purged).
    assert scalars(train, "epoch/loss") == [
        (s, pytest.approx(v, rel=1e-6)) for s, v in zip(ends, history["loss"])]
    assert scalars(val, "epoch/loss") == [
        (s, pytest.approx(v, rel=1e-6)) for s, v in zip(ends, history["val_loss"])]
    assert history["run"]["num_epochs"] == 4 and history["run"]["ranks"] == 2


def _not_blank(path: Path, min_size=(500, 250)) -> np.ndarray:
    with Image.open(path) as img:
        assert img.format == "PNG"
        assert img.size[0] >= min_size[0] and img.size[1] >= min_size[1], img.size
        pixels = np.asarray(img.convert("RGB"), dtype=np.int16)
    ink = (np.abs(pixels - 255).sum(axis=2) > 60).mean()  # not white
    colored = (np.ptp(pixels, axis=2) > 60).mean()  # curves, not grey axes
    assert ink > 0.01 and colored > 0.001, (ink, colored)
    return pixels


def test_plot_and_distnn_plot_draw_the_curves(resumed, tmp_path):
    folder, first, two = resumed
    assert "Curves drawn in curves.png" not in first.stdout  # --quiet
    _not_blank(folder / "curves.png")
    assert os.path.getsize(folder / "curves.png") < 200_000
    # Compare the run after 2 epochs with the same run resumed to 4 (its history file then).
    (tmp_path / "h2.json").write_text(json.dumps(two))
    # An old history file (no "run" entry) stays readable: labelled by its name.
    old = dict(two)
    del old["run"]
    (tmp_path / "old.json").write_text(json.dumps(old))
    proc = ok(distnn("plot", tmp_path / "h2.json", folder / "h.json", "-o",
                     tmp_path / "cmp.png", cwd=tmp_path, ranks=1))
    line = proc.stdout.strip().splitlines()[-1]
    assert line.endswith("drawn in " + str(tmp_path / "cmp.png") + ": num_epochs=2; "
                         "num_epochs=4"), line
    _not_blank(tmp_path / "cmp.png")
    proc = ok(distnn("plot", tmp_path / "old.json", folder / "h.json", "-o",
                     tmp_path / "cmp2.png", cwd=tmp_path, ranks=1))
    assert "old.json; model=simplemlp parallel=auto ranks=2" in proc.stdout, proc.stdout
    _not_blank(tmp_path / "cmp2.png")
    bad = distnn("plot", tmp_path / "missing.json", "-o", tmp_path / "x.png", cwd=tmp_path,
                 ranks=1)
    assert bad.returncode == 2 and "missing.json" in bad.stderr and "does not exist" in bad.stderr


def test_without_tensorboardx_every_rank_stops_before_training(tmp_path):
    # A tensorboardX that cannot be imported, on every rank.
    shadow = tmp_path / "shadow" / "tensorboardX"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('no tensorboardX here')\n")
    path = os.pathsep.join([str(tmp_path / "shadow"), os.environ.get("PYTHONPATH", "")])
    proc = distnn("train", *RUN, "--num_epochs", 1, cwd=tmp_path, env={"PYTHONPATH": path})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines == ["distnn train: error: --tensorboard: writing TensorBoard event files "
                     "needs tensorboardX: pip install 'distnn[tensorboard]' (or: pip install "
                     "tensorboardX)"], proc.stderr
    assert not (tmp_path / "tb").exists() and not (tmp_path / "h.json").exists()


def test_without_matplotlib_plot_stops_before_training(tmp_path):
    shadow = tmp_path / "shadow" / "matplotlib"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('no matplotlib here')\n")
    proc = distnn("train", *RUN[:-6], "--plot", "c.png", cwd=tmp_path, ranks=1,
                  env={"PYTHONPATH": str(tmp_path / "shadow")})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip() == ("distnn train: error: --plot: drawing curves needs "
                                   "matplotlib: pip install 'distnn[tensorboard]' (or "
                                   "matplotlib)"), proc.stderr
    assert not (tmp_path / "c.png").exists()
