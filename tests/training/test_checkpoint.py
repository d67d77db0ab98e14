"""Full-state checkpoints: exact resume, atomic writes, clear errors."""
from __future__ import annotations

import os

import numpy as np
import pytest

from distnn.training import checkpoint as ckpt
from distnn.training.callbacks import EarlyStopping, ReduceLROnPlateau, TrainingCheckpoint, WarmUp
from distnn.data import RandomFlip, load_dataset
from distnn.nn import Dense, Dropout, Flatten, ReLU, Sequential
from distnn.optim import get_optimizer
from distnn.training import Trainer


def make_model(seed=0, width=16):
    return Sequential([Flatten(), Dense(width), ReLU(), Dropout(0.3), Dense(3)],
                      input_shape=(1, 4, 4), rng=seed)


@pytest.fixture(scope="module")
def splits():
    return load_dataset("synthetic", input_shape=(1, 4, 4), num_classes=3, num_samples=200,
                        test_samples=50, validation_split=0.2, seed=5)


def make_trainer(path=None, optimizer="adam", seed=0):
    model = make_model(seed)
    callbacks = [WarmUp(batches=5),
                 ReduceLROnPlateau("val_loss", factor=0.5, patience=1, min_delta=0.0),
                 EarlyStopping("val_loss", patience=5, restore_best_weights=True)]
    if path:
        callbacks.append(TrainingCheckpoint(path, every=1))
    opt = get_optimizer(optimizer, model, lr=0.01)
    return Trainer(model, opt, callbacks=callbacks, progress=False, verbose=False, seed=7)


def run(trainer, splits, epochs, resume=None):
    return trainer.fit(splits.train, epochs=epochs, batch_size=16, validation=splits.val,
                       augment=[RandomFlip(0.5)], resume=resume)


def _strip(records):
    return [{k: v for k, v in r.items() if k not in ("time", "samples_per_s")} for r in records]


@pytest.mark.parametrize("optimizer", ["adam", "sgd", "nadam"])
def test_two_epochs_equal_one_plus_resume(splits, tmp_path, optimizer):
    straight = make_trainer(optimizer=optimizer)
    run(straight, splits, 3)

    path = str(tmp_path / "state.npz")
    first = make_trainer(path, optimizer=optimizer)
    run(first, splits, 1)
    assert os.path.exists(path)
    second = make_trainer(path, optimizer=optimizer, seed=99)  # other init: all restored
    run(second, splits, 3, resume=path)

    np.testing.assert_array_equal(second.model.parameters_flat(),
                                  straight.model.parameters_flat())
    a = straight.optimizer.state_dict()
    b = second.optimizer.state_dict()
    assert a["iterations"] == b["iterations"] and a["lr"] == b["lr"]
    for sa, sb in zip(a["state"], b["state"]):
        for key in sa:
            np.testing.assert_array_equal(sa[key], sb[key])
    assert _strip(second.history.records) == _strip(straight.history.records)
    assert second.global_step == straight.global_step
    assert second.lr == straight.lr


def test_checkpoint_contents(splits, tmp_path):
    path = str(tmp_path / "c.npz")
    trainer = make_trainer(path)
    run(trainer, splits, 2)
    state = ckpt.load_checkpoint(path)
    assert state.epochs_done == 2
    assert state.meta["global_step"] == trainer.global_step
    assert [c["type"] for c in state.meta["callbacks"]] == [
        "WarmUp", "ReduceLROnPlateau", "EarlyStopping", "TrainingCheckpoint"]
    assert len(state.meta["rng"]) == 1 and "dropout_0.rng" in state.meta["rng"][0]
    assert set(state.model_arrays()) == set(trainer.model.named_arrays())


def test_resume_past_the_end_trains_nothing(splits, tmp_path):
    path = str(tmp_path / "c.npz")
    run(make_trainer(path), splits, 2)
    again = make_trainer(path)
    history = run(again, splits, 2, resume=path)
    assert len(history) == 2 and again.global_step == 2 * 10


def test_pack_round_trip():
    state = {"a": np.arange(3.0), "b": [1, 2.5, None, "x"], "c": (np.ones(2), 3),
             "d": {1: np.zeros(1), "k": {"nested": True}}}
    arrays = {}
    skeleton = ckpt.pack(state, "s", arrays)
    back = ckpt.unpack(skeleton, arrays)
    np.testing.assert_array_equal(back["a"], state["a"])
    assert back["b"] == state["b"] and isinstance(back["c"], tuple)
    np.testing.assert_array_equal(back["d"][1], np.zeros(1))
    assert back["d"]["k"] == {"nested": True}
    with pytest.raises(TypeError, match="cannot store a set"):
        ckpt.pack({"bad": {1, 2}}, "s", {})


def test_failed_write_leaves_no_file(splits, tmp_path, monkeypatch):
    path = tmp_path / "c.npz"
    trainer = make_trainer()
    run(trainer, splits, 1)
    ckpt.save_checkpoint(str(path), trainer)
    good = path.read_bytes()

    def broken(f, **arrays):
        f.write(b"half a file")
        raise OSError("disk full")

    monkeypatch.setattr(ckpt.np, "savez", broken)
    with pytest.raises(OSError, match="could not write checkpoint.*disk full"):
        ckpt.save_checkpoint(str(path), trainer)
    assert path.read_bytes() == good  # the previous checkpoint is intact
    assert sorted(os.listdir(tmp_path)) == ["c.npz"]  # no temporary file left


def test_load_errors(splits, tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        ckpt.load_checkpoint(str(tmp_path / "nope.npz"))
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(ckpt.CheckpointError, match="not an .npz file") as exc:
        ckpt.load_checkpoint(str(tmp_path / "junk.npz"))
    assert "allow_pickle" not in str(exc.value)
    weights = tmp_path / "w.npz"
    make_model().save_weights(weights)
    with pytest.raises(ValueError, match="not a distnn checkpoint.*weights_and_bias_filename"):
        ckpt.load_checkpoint(str(weights))

    path = str(tmp_path / "c.npz")
    run(make_trainer(path), splits, 1)
    narrow = make_model(width=8)
    other = Trainer(narrow, get_optimizer("adam", narrow), progress=False, verbose=False)
    with pytest.raises(ValueError, match="different architecture|has shape"):
        ckpt.load_checkpoint(path).restore(other)
    fewer = make_trainer()
    fewer.callbacks = fewer.callbacks[:1]
    with pytest.raises(ValueError, match="callbacks"):
        ckpt.load_checkpoint(path).restore(fewer)


def test_the_checkpoint_keeps_the_optimizers_rate_and_a_resume_may_replace_it(splits,
                                                                              tmp_path):
    path = str(tmp_path / "c.npz")
    first = make_trainer(path)
    run(first, splits, 2)
    state = ckpt.load_checkpoint(path)
    assert "lr" not in state.meta  # one copy, in the optimizer's state
    assert state.lr == state.meta["optimizer"]["lr"] == first.optimizer.scheduled_lr
    again = make_trainer(path)
    run(again, splits, 2, resume=state)  # nothing left to train: restored only
    assert again.lr == again.optimizer.lr == state.lr
    new = make_trainer(path)
    new.fit(splits.train, epochs=2, batch_size=16, validation=splits.val, resume=state,
            resume_lr=0.125)
    assert new.optimizer.scheduled_lr == 0.125 == new.lr
    assert state.lr == first.optimizer.scheduled_lr  # the checkpoint was not rewritten


def test_a_file_from_before_the_optimizer_owned_the_rate_resumes_at_its_scheduled_rate(
        splits, tmp_path):
    path = str(tmp_path / "c.npz")
    run(make_trainer(path), splits, 1)
    state = ckpt.load_checkpoint(path)
    # such files kept the scheduled rate in meta and a warm-up's scaled one in the optimizer
    state.meta["lr"], state.meta["optimizer"]["lr"] = 0.02, 0.005
    trainer = make_trainer()
    state.restore(trainer)
    assert state.lr == 0.02 == trainer.optimizer.scheduled_lr == trainer.lr
