"""Callbacks and LR schedulers on scripted metric sequences (no training)."""
from __future__ import annotations

import numpy as np
import pytest

from distnn.optim import SGD
from distnn.training.callbacks import (CALLBACKS, EarlyStopping, ModelCheckpoint,
                                       ReduceLREveryNEpochs,
                              ReduceLROnPlateau, TargetMetric, WarmUp, metric_mode,
                              parse_early_stopping, parse_target_metric, resolve_key)

KEYS = ["loss", "accuracy", "val_loss", "val_accuracy", "lr", "time", "samples_per_s"]


class FakeModel:
    """Just enough of a Sequential for EarlyStopping(restore_best_weights) and checkpoints."""

    def __init__(self):
        self.flat = np.zeros(3)
        self.saved = []

    def parameters_flat(self):
        return self.flat

    def walk(self):
        return iter(())

    def named_arrays(self):
        return {}

    def save_weights(self, path):
        self.saved.append(path)


class FakeComm:
    rank, size = 0, 1


class FakeTrainer:
    def __init__(self, lr=0.1, steps_per_epoch=10):
        # the optimizer owns the learning rate, as in Trainer
        self.optimizer = SGD([(np.zeros(2), np.zeros(2))], lr=lr)
        self.model = FakeModel()
        self.comm = FakeComm()
        self.stop_training = False
        self.stop_reason = None
        self.log_keys = KEYS
        self.steps_per_epoch = steps_per_epoch
        self.epoch = 0
        self.num_epochs = 100
        self.messages = []

    @property
    def lr(self):
        return self.optimizer.scheduled_lr

    def print(self, msg):
        self.messages.append(msg)


def run(callback, values, key="val_loss", trainer=None):
    """Feed one value per epoch; return the 1-based epoch after which training stopped
    (None if it did not) and the trainer."""
    trainer = trainer or FakeTrainer()
    callback.on_train_begin(trainer)
    for epoch, value in enumerate(values):
        trainer.epoch = epoch
        trainer.model.flat[:] = epoch  # "weights" of this epoch
        callback.on_epoch_end(trainer, epoch, {key: value})
        if trainer.stop_training:
            callback.on_train_end(trainer)
            return epoch + 1, trainer
    callback.on_train_end(trainer)
    return None, trainer


# -- early stopping ------------------------------------------------------------------------
def test_early_stopping_best_so_far_rule():
    # best 0.8 at epoch 2; epochs 3, 4, 5 do not beat it -> stop after epoch 5 (patience 3)
    stop, t = run(EarlyStopping("val_loss", patience=3), [1.0, 0.8, 0.85, 0.81, 0.9, 0.1])
    assert stop == 5
    assert "has not improved" in t.stop_reason


def test_early_stopping_keeps_going_while_improving():
    stop, _ = run(EarlyStopping("val_loss", patience=2), [1.0, 0.9, 0.8, 0.7, 0.6])
    assert stop is None


def test_early_stopping_min_delta():
    # improvements of 0.005 do not count with min_delta 0.01
    stop, _ = run(EarlyStopping("val_loss", patience=2, min_delta=0.01),
                  [1.0, 0.995, 0.99, 0.5])
    assert stop == 3


def test_early_stopping_maximizes_accuracy_by_default():
    stop, _ = run(EarlyStopping("val_acc", patience=2), [0.5, 0.6, 0.55, 0.58, 0.9],
                  key="val_accuracy")
    assert stop == 4


def test_early_stopping_smoothed_rule():
    # p=2: from epoch 4 on compare mean(last 2) with mean(2 before)
    es = parse_early_stopping("val_loss,~<,2")
    values = [1.0, 0.8, 0.7, 0.6, 0.65, 0.7, 0.5]
    # e4: mean(.7,.6)=.65 < mean(1,.8)=.9 go; e5: mean(.6,.65)=.625 < .75 go;
    # e6: mean(.65,.7)=.675 vs mean(.7,.6)=.65 -> not better: stop after epoch 6
    stop, t = run(es, values)
    assert stop == 6
    assert "mean" in t.stop_reason


def test_early_stopping_smoothed_needs_2p_epochs():
    stop, _ = run(parse_early_stopping("val_loss,~<,3"), [1.0, 1.0, 1.0, 1.0, 1.0])
    assert stop is None  # 5 < 2*3 epochs: no decision yet
    stop, _ = run(parse_early_stopping("val_loss,~<,3"), [1.0] * 6)
    assert stop == 6


def test_early_stopping_plain_spec_compares_with_best():
    stop, _ = run(parse_early_stopping("val_loss,<,2"), [1.0, 0.5, 0.6, 0.55, 0.4])
    assert stop == 4
    stop, _ = run(parse_early_stopping("val_acc,>,1"), [0.5, 0.6, 0.6], key="val_accuracy")
    assert stop == 3


def test_early_stopping_restores_best_weights():
    es = EarlyStopping("val_loss", patience=2, restore_best_weights=True)
    stop, t = run(es, [1.0, 0.5, 0.7, 0.9])
    assert stop == 4
    np.testing.assert_array_equal(t.model.flat, 1.0)  # weights of epoch 2 (index 1)
    assert any("restored" in m for m in t.messages)


def test_early_stopping_state_round_trip():
    a = EarlyStopping("val_loss", patience=3)
    run(a, [1.0, 0.9, 0.95])
    b = EarlyStopping("val_loss", patience=3)
    b.load_state_dict(a.state_dict())
    t = FakeTrainer()
    b.on_train_begin(t)
    b.on_epoch_end(t, 3, {"val_loss": 0.96})
    assert not t.stop_training
    b.on_epoch_end(t, 4, {"val_loss": 0.97})
    assert t.stop_training  # 3 epochs without beating 0.9, counting the resumed ones


def test_unknown_metric_is_reported_with_the_logged_keys():
    with pytest.raises(ValueError, match="val_f1.*not logged.*val_loss"):
        EarlyStopping("val_f1").on_train_begin(FakeTrainer())


def test_resolve_key_aliases():
    assert resolve_key("val_acc", KEYS) == "val_accuracy"
    assert resolve_key("val_categorical_accuracy", KEYS) == "val_accuracy"
    assert resolve_key("val_categorical_cross_entropy", KEYS) == "val_loss"
    assert resolve_key("acc", KEYS) == "accuracy"
    assert metric_mode("val_acc") == "max" and metric_mode("val_loss") == "min"


@pytest.mark.parametrize("spec, match", [
    ("val_loss,<", "metric,op,value"),
    ("val_loss,=,3", "operator"),
    ("val_loss,<,x", "patience must be an integer"),
    ("val_loss,<,0", "patience must be an integer >= 1"),
])
def test_bad_early_stopping_specs(spec, match):
    with pytest.raises(ValueError, match=match):
        parse_early_stopping(spec)


# -- target metric -------------------------------------------------------------------------
def test_target_metric_stops_at_first_epoch_reaching_it():
    tm = parse_target_metric("val_acc,>,0.97")
    stop, t = run(tm, [0.9, 0.96, 0.97, 0.975, 0.99], key="val_accuracy")
    assert stop == 4 and tm.reached_epoch == 3
    assert "target reached" in t.stop_reason


def test_target_metric_less_than():
    stop, _ = run(parse_target_metric("val_loss,<=,0.5"), [0.9, 0.5, 0.4])
    assert stop == 2


@pytest.mark.parametrize("spec, match", [("val_acc,>", "metric,op,value"),
                                         ("val_acc,!=,1", "operator"),
                                         ("val_acc,>,high", "must be a number")])
def test_bad_target_metric_specs(spec, match):
    with pytest.raises(ValueError, match=match):
        parse_target_metric(spec)


# -- learning-rate schedules ---------------------------------------------------------------
def test_reduce_lr_on_plateau():
    cb = ReduceLROnPlateau("val_loss", factor=0.5, patience=2, min_lr=0.03, min_delta=0.0)
    t = FakeTrainer(lr=0.1)
    cb.on_train_begin(t)
    lrs = []
    for epoch, v in enumerate([1.0, 0.9, 0.95, 0.96, 0.97, 0.98, 0.99, 1.0]):
        cb.on_epoch_end(t, epoch, {"val_loss": v})
        lrs.append(t.lr)
    # plateau from epoch 3: reduced after epochs 4 and 6, then clamped at min_lr
    assert lrs == pytest.approx([0.1, 0.1, 0.1, 0.05, 0.05, 0.03, 0.03, 0.03])


def test_reduce_lr_every_n_epochs():
    cb = ReduceLREveryNEpochs(nepochs=2, factor=0.1, min_lr=0.0005)
    t = FakeTrainer(lr=0.1)
    lrs = []
    for epoch in range(6):
        cb.on_epoch_end(t, epoch, {})
        lrs.append(t.lr)
    assert lrs == pytest.approx([0.1, 0.01, 0.01, 0.001, 0.001, 0.0005])


def test_warm_up_by_batches_and_epochs():
    t = FakeTrainer(lr=0.4, steps_per_epoch=10)
    w = WarmUp(batches=4)
    w.on_train_begin(t)
    seen = []
    for step in range(6):
        w.on_batch_begin(t, step)
        seen.append(t.optimizer.lr)
    assert seen == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.4, 0.4])
    w = WarmUp(epochs=0.5, start_factor=0.5)  # 5 steps, from half the rate
    w.on_train_begin(t)
    assert w.total == 5
    assert [w.factor(s) for s in range(6)] == pytest.approx([0.6, 0.7, 0.8, 0.9, 1.0, 1.0])


def test_model_checkpoint_every_n_and_best_only(tmp_path):
    cb = ModelCheckpoint(str(tmp_path / "w-{epoch:02d}-{val_loss:.2f}.npz"), save_freq=2)
    _, t = run(cb, [1.0, 0.5, 0.7, 0.4])
    assert [p.rsplit("/", 1)[1] for p in t.model.saved] == ["w-02-0.50.npz", "w-04-0.40.npz"]
    best = ModelCheckpoint(str(tmp_path / "best-{epoch}.npz"), save_best_only=True)
    _, t = run(best, [1.0, 0.5, 0.7, 0.4])
    assert [p.rsplit("/", 1)[1] for p in t.model.saved] == ["best-1.npz", "best-2.npz",
                                                           "best-4.npz"]


@pytest.mark.parametrize("make, match", [
    (lambda: EarlyStopping(patience=0), "patience"),
    (lambda: ReduceLROnPlateau(factor=1.5), "factor"),
    (lambda: ReduceLREveryNEpochs(nepochs=0), "nepochs"),
    (lambda: WarmUp(epochs=-1), "warm_up_epochs"),
    (lambda: TargetMetric("val_acc", "=", 1), "operator"),
    (lambda: ModelCheckpoint("", save_freq=1), "file path"),
])
def test_bad_arguments_name_the_rule(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_registry_names():
    assert set(CALLBACKS) >= {"warm_up", "early_stopping", "reduce_lr_on_plateau",
                              "reduce_lr_every_nepochs", "model_checkpoint", "stop_at_loss"}


def test_model_checkpoint_under_a_real_trainer(tmp_path):
    # The trainer's logs carry "epoch" too: the pattern must get one value for it.
    from distnn.data import load_dataset
    from distnn.nn import Dense, Flatten, ReLU, Sequential
    from distnn.optim import get_optimizer
    from distnn.training import Trainer
    splits = load_dataset("synthetic", input_shape=(1, 4, 4), num_classes=3, num_samples=60,
                          test_samples=10, validation_split=0.2, seed=1)
    model = Sequential([Flatten(), Dense(8), ReLU(), Dense(3)], input_shape=(1, 4, 4), rng=0)
    cb = ModelCheckpoint(str(tmp_path / "w-{epoch:02d}-{val_loss:.3f}.npz"))
    trainer = Trainer(model, get_optimizer("sgd", model, lr=0.01), callbacks=[cb],
                      progress=False, verbose=False)
    history = trainer.fit(splits.train, epochs=2, batch_size=16, validation=splits.val)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [f"w-{e:02d}-{v:.3f}.npz" for e, v in
                     zip(history.history["epoch"], history.history["val_loss"])]
    bad = ModelCheckpoint(str(tmp_path / "w-{val_los}.npz"))
    trainer = Trainer(model, get_optimizer("sgd", model, lr=0.01), callbacks=[bad],
                      progress=False, verbose=False)
    with pytest.raises(ValueError, match="val_los.*does not log"):
        trainer.fit(splits.train, epochs=1, batch_size=16, validation=splits.val)
