"""The training loop on small synthetic data (size-1 communicator)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from distnn.training.callbacks import ReduceLREveryNEpochs, TargetMetric, WarmUp
from distnn.data import ArrayDataset, Batch, load_dataset
from distnn.nn import Dense, Dropout, Flatten, ReLU, Sequential
from distnn.nn.losses import get_loss
from distnn.nn.metrics import get_metric
from distnn.optim import get_optimizer
from distnn.training.profiler import Profiler
from distnn.training import History, Trainer, fit, metric_key, resolve_batch_sizes


def make_model(seed=0, dropout=False):
    layers = [Flatten(), Dense(16), ReLU()] + ([Dropout(0.2)] if dropout else []) + [Dense(3)]
    return Sequential(layers, input_shape=(1, 4, 4), rng=seed)


@pytest.fixture(scope="module")
def splits():
    return load_dataset("synthetic", input_shape=(1, 4, 4), num_classes=3, num_samples=300,
                        test_samples=101, validation_split=0.2, seed=3)


def make_trainer(model=None, lr=0.05, **kw):
    model = model or make_model()
    kw.setdefault("progress", False)
    kw.setdefault("verbose", False)
    return Trainer(model, get_optimizer("sgd", model, lr=lr, momentum=0.9), **kw)


def test_fit_learns_and_records_history(splits):
    trainer = make_trainer()
    history = trainer.fit(splits.train, epochs=3, batch_size=16, validation=splits.val)
    assert [r["epoch"] for r in history.records] == [1, 2, 3]
    h = history.history
    for key in ("loss", "accuracy", "val_loss", "val_accuracy", "lr", "time", "samples_per_s"):
        assert len(h[key]) == 3, key
    assert h["loss"][-1] < h["loss"][0]
    assert h["val_accuracy"][-1] > 0.8
    assert trainer.global_step == 3 * 15  # 240 samples / 16


def test_steps_per_epoch_trims_and_global_batch_wins(splits):
    trainer = make_trainer()
    trainer.fit(splits.train, epochs=2, batch_size=7, global_batch_size=32, steps_per_epoch=3)
    assert trainer.global_step == 6 and trainer.steps_per_epoch == 3
    assert resolve_batch_sizes(64, None, 4) == (64, 256)
    assert resolve_batch_sizes(64, 100, 3) == (34, 100)
    with pytest.raises(ValueError, match="batch_size must be an integer >= 1"):
        resolve_batch_sizes(0, None, 1)


def test_evaluate_is_exact(splits):
    trainer = make_trainer()
    trainer.fit(splits.train, epochs=1, batch_size=32)
    logs = trainer.evaluate(splits.test, batch_size=13)  # 101 samples: uneven last batch
    x, y = splits.test.arrays()
    logits = trainer.model.forward(x)
    loss, _ = get_loss("categorical_cross_entropy")(logits, y)
    acc = get_metric("accuracy")(logits, y) / len(y)
    assert logs["loss"] == pytest.approx(loss, rel=1e-5)
    assert logs["accuracy"] == pytest.approx(acc)
    assert trainer.last_eval_count == 101


def test_predict_keeps_dataset_order(splits):
    trainer = make_trainer()
    out, labels = trainer.predict(splits.test, batch_size=10, return_labels=True)
    x, y = splits.test.arrays()
    np.testing.assert_allclose(out, trainer.model.forward(x), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(labels, y)
    np.testing.assert_allclose(trainer.predict(x), out, rtol=1e-5, atol=1e-6)


def test_empty_shard_zeroes_gradients_and_still_steps():
    model = make_model()
    trainer = make_trainer(model)
    model.gradients_flat()[...] = 1.0
    before = model.parameters_flat().copy()
    steps = trainer.optimizer.steps
    sums = np.zeros(3)
    trainer._train_step(Batch(np.zeros((0, 1, 4, 4), np.float32), np.zeros(0, np.int64), 8,
                              np.zeros(0, np.int64)), sums)
    assert trainer.optimizer.steps == steps + 1
    assert not model.gradients_flat().any()
    np.testing.assert_array_equal(model.parameters_flat(), before)  # zero grad, no momentum yet
    assert not sums.any()


def test_callbacks_change_lr_and_stop(splits):
    trainer = make_trainer(lr=0.1, callbacks=[ReduceLREveryNEpochs(1, factor=0.5)])
    history = trainer.fit(splits.train, epochs=3, batch_size=32)
    assert history.history["lr"] == pytest.approx([0.1, 0.05, 0.025])
    target = TargetMetric("acc", ">=", 0.0)
    trainer = make_trainer(callbacks=[target])
    history = trainer.fit(splits.train, epochs=5, batch_size=32)
    assert len(history) == 1 and "target reached" in history.stop_reason


def test_warm_up_sets_optimizer_lr_per_batch(splits):
    seen = []

    class Spy(WarmUp):
        def on_batch_end(self, trainer, step, logs):
            seen.append(trainer.optimizer.lr)

    trainer = make_trainer(lr=0.4, callbacks=[Spy(batches=4)])
    trainer.fit(splits.train, epochs=1, batch_size=32, steps_per_epoch=6)
    assert seen == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.4, 0.4])


def test_the_optimizer_owns_the_lr_and_the_step_uses_it(splits):
    """A callback that sets the optimizer's rate is obeyed by the next steps (no copy of
    the rate on the trainer overrides it), and trainer.lr only reads it."""
    class Freeze(WarmUp):  # a client of the optimizer's rate, as the schedules are
        def on_epoch_end(self, trainer, epoch, logs):
            if epoch == 0:
                trainer.optimizer.lr = 0.0
                self.frozen = trainer.model.parameters_flat().copy()

    freeze = Freeze()
    trainer = make_trainer(lr=0.1, callbacks=[freeze])
    history = trainer.fit(splits.train, epochs=2, batch_size=32)
    assert trainer.lr == 0.0 == trainer.optimizer.scheduled_lr
    assert history.history["lr"] == [0.1, 0.0]
    np.testing.assert_array_equal(trainer.model.parameters_flat(), freeze.frozen)
    with pytest.raises(AttributeError):
        trainer.lr = 0.5


def test_schedules_and_warm_up_compose_on_the_optimizer(splits):
    """ReduceLREveryNEpochs halves the optimizer's scheduled rate while a warm-up spans the
    epochs; every step runs at scheduled rate * warm-up factor."""
    seen = []

    class Spy(WarmUp):
        def on_batch_end(self, trainer, step, logs):
            opt = trainer.optimizer
            seen.append((opt.lr, opt.scheduled_lr, opt.lr_scale))

    trainer = make_trainer(lr=0.4, callbacks=[Spy(batches=6), ReduceLREveryNEpochs(1, 0.5)])
    history = trainer.fit(splits.train, epochs=2, batch_size=32, steps_per_epoch=4)
    scheduled = [0.4] * 4 + [0.2] * 4
    factors = [(i + 1) / 6 for i in range(6)] + [1.0, 1.0]
    assert [s for _, s, _ in seen] == scheduled
    assert [f for _, _, f in seen] == pytest.approx(factors)
    assert [lr for lr, _, _ in seen] == [s * f for s, f in zip(scheduled, [f for _, _, f in
                                                                         seen])]
    assert history.history["lr"] == [seen[3][0], seen[7][0]]
    assert trainer.lr == 0.1  # halved again after the second epoch


def test_the_stall_inspector_is_passed_explicitly(splits, tmp_path):
    """Trainer(stall=) reaches the trainer's phases, its checkpoints and the rule's reducer;
    nothing is read from the communicator."""
    from distnn.training.checkpoint import save_checkpoint

    class Spy:
        def __init__(self):
            self.phases = []

        def phase(self, name, arg=-1, step=None):
            self.phases.append(name)

    spy = Spy()
    trainer = make_trainer(stall=spy)
    assert getattr(trainer.comm, "stall", None) is None  # none on the communicator
    assert trainer.stall is spy and trainer.optimizer._reducer.stall is spy
    trainer.fit(splits.train, epochs=1, batch_size=32, steps_per_epoch=2,
                validation=splits.val)
    save_checkpoint(tmp_path / "c.npz", trainer)
    step = ["forward", "backward", "exchange", "loss check"]
    assert spy.phases[:8] == step + step
    assert spy.phases[8:] == ["epoch end", "evaluate", "checkpoint write"]
    assert make_trainer().stall is None


def test_history_files_json_and_csv(splits, tmp_path):
    trainer = make_trainer()
    trainer.fit(splits.train, epochs=2, batch_size=32, validation=splits.val,
                history_file=str(tmp_path / "h.json"))
    data = json.loads((tmp_path / "h.json").read_text())
    assert data["epoch"] == [1, 2] and len(data["val_loss"]) == 2
    trainer.history.save(tmp_path / "h.csv")
    back = History.load(tmp_path / "h.csv")
    assert back.history["epoch"] == [1, 2]
    assert back.history["val_loss"] == pytest.approx(data["val_loss"])
    assert History.load(tmp_path / "h.json").history["loss"] == pytest.approx(data["loss"])


def test_profiler_times_layers_and_detaches(splits, tmp_path):
    model = make_model()
    prof = Profiler(trace=True, report=False)
    trainer = make_trainer(model, profiler=prof)
    trainer.fit(splits.train, epochs=2, batch_size=32, validation=splits.val)
    assert len(prof.epochs) == 2
    rec = prof.epochs[0]
    assert rec["steps"] == 8 and set(rec["layers"]) == {l.name for l in model.layers}
    assert rec["layers"]["dense_0"]["calls"] == 8 and rec["layers"]["dense_0"]["forward"] > 0
    assert "dense_0" in Profiler.table(rec)
    for layer in model.layers:  # wrappers gone: no cost after fit
        assert "forward" not in vars(layer) and "backward" not in vars(layer)
    assert "step" not in vars(trainer.optimizer.optimizer)
    files = prof.write_trace(str(tmp_path / "trace.json"), trainer.comm)
    trace = json.loads(open(files[0]).read())
    names = {e["name"] for e in trace["traceEvents"]}
    assert {"dense_0.forward", "dense_0.backward", "optimizer.update"} <= names


def test_quiet_prints_nothing(splits, capsys):
    make_trainer().fit(splits.train, epochs=1, batch_size=32, validation=splits.val)
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""


def test_verbose_without_bar_prints_epoch_lines(splits, capsys):
    make_trainer(verbose=True).fit(splits.train, epochs=2, batch_size=32, validation=splits.val)
    out = capsys.readouterr().out
    assert "Epoch 1/2:" in out and "val_accuracy=" in out and "samples/s" in out
    assert "Training: 2 epochs" in out


def test_fit_function_and_metric_names(splits):
    model = make_model()
    history = fit(model, splits.train, epochs=1, batch_size=32, progress=False,
                  metrics=["categorical_accuracy", "top2"])
    assert {"accuracy", "top2"} <= set(history.history)
    assert metric_key("acc") == "accuracy" and metric_key("mse") == "mse"


def test_bad_arguments(splits):
    with pytest.raises(ValueError, match="given twice"):
        make_trainer(metrics=["accuracy", "acc"])
    trainer = make_trainer()
    with pytest.raises(ValueError, match="epochs must be"):
        trainer.fit(splits.train, epochs=-1)
    with pytest.raises(ValueError, match="no full batch"):
        trainer.fit(ArrayDataset(np.zeros((5, 1, 4, 4)), np.zeros(5, np.int64), 3), epochs=1,
                    batch_size=8, drop_last=True)


def test_fit_shortcut_learns_synthetic_data():
    from distnn.data import load_dataset
    from distnn.models import get_model
    splits = load_dataset("synthetic", input_shape=(1, 8, 8), num_samples=400, seed=1)
    model = get_model("simplecnn", input_shape=(1, 8, 8), rng=0)
    history = fit(model, splits.train, epochs=3, batch_size=32, lr=0.01, progress=False,
                  validation=splits.test)
    acc = history.history["accuracy"]
    assert acc[-1] > acc[0]
    assert history.history["val_accuracy"][-1] > 0.5
