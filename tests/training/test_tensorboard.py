"""The TensorBoard callback and plot_history through the library (size-1 communicator,
synthetic data); the command's 2-rank runs are in tests/cli/test_watching.py."""
from __future__ import annotations

import numpy as np
import pytest

from distnn.data import load_dataset
from distnn.nn import Dense, Flatten, ReLU, Sequential
from distnn.optim import get_optimizer
from distnn.training import History, TensorBoard, Trainer, TrainingCheckpoint, plot_history

pytest.importorskip("tensorboardX")
event_accumulator = pytest.importorskip(
    "tensorboard.backend.event_processing.event_accumulator")


@pytest.fixture(scope="module")
def splits():
    return load_dataset("synthetic", input_shape=(1, 4, 4), num_classes=3, num_samples=300,
                        test_samples=10, validation_split=0.2, seed=3)


def make_trainer(callbacks=()):
    model = Sequential([Flatten(), Dense(16), ReLU(), Dense(3)], input_shape=(1, 4, 4), rng=0)
    return Trainer(model, get_optimizer("sgd", model, lr=0.05, momentum=0.9),
                   callbacks=list(callbacks), progress=False, verbose=False)


def read(folder):
    acc = event_accumulator.EventAccumulator(str(folder), size_guidance={"scalars": 0})
    acc.Reload()
    return acc


def steps(acc, tag):
    return [e.step for e in acc.Scalars(tag)]


def test_every_n_steps_and_every_epoch(splits, tmp_path):
    tb = TensorBoard(tmp_path / "run", every=2, options={"model": "mlp"},
                     hparams={"lr": 0.05, "optimizer": "sgd", "nesterov": False})
    trainer = make_trainer([tb])
    history = trainer.fit(splits.train, epochs=2, batch_size=40, validation=splits.val)
    # 240 samples / 40 = 6 steps per epoch.
    train = read(tmp_path / "run" / "train")
    assert steps(train, "batch/loss") == [2, 4, 6, 8, 10, 12]
    assert steps(train, "epoch/loss") == [6, 12]
    assert [e.value for e in train.Scalars("epoch/loss")] == pytest.approx(
        history.history["loss"], rel=1e-6)
    # The loss of each point is the mean over the samples since the previous one: over an
    # epoch, their mean is the epoch's mean (equal batches).
    batch = [e.value for e in train.Scalars("batch/loss")]
    assert np.mean(batch[:3]) == pytest.approx(history.history["loss"][0], rel=1e-5)
    # One process: no communication counters.
    assert not [t for t in train.Tags()["scalars"] if t.startswith("comm/")]
    val = read(tmp_path / "run" / "validation")
    assert [e.value for e in val.Scalars("epoch/accuracy")] == pytest.approx(
        history.history["val_accuracy"], rel=1e-6)
    # The HParams session of the run: its hyper-parameters and metrics.
    from tensorboard.plugins.hparams import plugin_data_pb2
    root = read(tmp_path / "run")
    content = root.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(
        content["_hparams_/session_start_info"]).session_start_info
    assert start.hparams["lr"].number_value == pytest.approx(0.05)
    assert start.hparams["optimizer"].string_value == "sgd"
    assert steps(root, "hparams/val_loss") == [6, 12]


def test_a_resume_may_add_the_callback_and_continues_the_steps(splits, tmp_path):
    ck = str(tmp_path / "ck.npz")
    make_trainer([TrainingCheckpoint(ck)]).fit(splits.train, epochs=1, batch_size=40)
    tb = TensorBoard(tmp_path / "run", every=0)
    make_trainer([tb, TrainingCheckpoint(ck)]).fit(splits.train, epochs=3, batch_size=40,
                                                   resume=ck)
    train = read(tmp_path / "run" / "train")
    assert steps(train, "epoch/loss") == [12, 18]
    assert "batch/loss" not in train.Tags()["scalars"]  # every=0: per epoch only
    with pytest.raises(ValueError, match="every"):
        TensorBoard(tmp_path, every=-1)


def test_plot_history_draws_a_png(splits, tmp_path):
    image = pytest.importorskip("PIL.Image")
    pytest.importorskip("matplotlib")
    history = make_trainer().fit(splits.train, epochs=2, batch_size=40, validation=splits.val)
    history.run = {"model": "mlp", "ranks": 1}
    history.save(tmp_path / "h.json")
    back = History.load(tmp_path / "h.json")
    assert back.run == {"model": "mlp", "ranks": 1} and len(back) == 2
    plot_history(tmp_path / "c.png", [back, history], labels=["a", "b"], title="t")
    with image.open(tmp_path / "c.png") as img:
        assert img.size[0] > 400 and img.size[1] > 200
        pixels = np.asarray(img.convert("L"))
    assert (pixels < 200).mean() > 0.01
    with pytest.raises(ValueError, match="no finished epoch"):
        plot_history(tmp_path / "e.png", History())
