"""Inference programs (``distnn.nn.inference``): ``predict`` runs a model's leading
convolutions, batch norms, ReLUs, residual sums and max poolings as oneDNN primitives
(batch norm folded into the convolution) and equals the layers' own inference to float32
tolerance, through ``Model.predict``, ``distnn.training.predict`` and ``distnn predict``;
without oneDNN (or with ``DISTNN_INFERENCE=layers``) the layers run; predict writes no
parameter and leaves training bit for bit as it was."""

import numpy as np
import pytest
from helpers import run_distnn

from distnn import distributed as dist
from distnn.data import ArrayDataset
from distnn.models import get_model
from distnn.nn.inference import why_not
from distnn.training import predict
from parity import perturb_batch_norms


def _model(name, shape, seed=0):
    model = get_model(name, input_shape=shape, rng=seed)
    perturb_batch_norms(model, np.random.default_rng(seed + 1), spread=0.1, var=(0.5, 1.5))
    return model


def _layers(model, x, batch):
    return np.concatenate([model.forward(x[i:i + batch], training=False)
                           for i in range(0, len(x), batch)])


def _need_program(model):
    reason = why_not(model)
    if reason is not None:
        pytest.skip(f"no inference program: {reason}")


@pytest.mark.parametrize("name,shape", [("resnet20", (3, 16, 16)), ("vgg11bn", (3, 32, 32)),
                                        ("simplecnn", (1, 28, 28))])
def test_predict_equals_the_layers_inference(name, shape):
    model = _model(name, shape)
    _need_program(model)
    x = np.random.default_rng(2).normal(size=(21,) + shape).astype(np.float32)
    want = _layers(model, x, 8)  # batches 8, 8, 5: two programs
    got = model.predict(x, batch_size=8)
    scale = np.abs(want).max()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * scale)
    comm = dist.init()
    got = predict(model, comm, ArrayDataset(x, np.zeros(len(x), np.int64)), batch_size=8)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * scale)


def test_predict_takes_changed_weights_and_writes_none():
    model = _model("resnet20", (3, 8, 8))
    _need_program(model)
    x = np.random.default_rng(3).normal(size=(6, 3, 8, 8)).astype(np.float32)
    model.predict(x)
    before = {k: v.copy() for k, v in model.named_arrays().items()}
    for layer in model.walk():  # in place, as an optimizer does
        for value in layer.params.values():
            value *= 0.9
    changed = {k: v.copy() for k, v in model.named_arrays().items()}
    got = model.predict(x)
    for key, value in model.named_arrays().items():
        np.testing.assert_array_equal(value, changed[key])
    assert any(not np.array_equal(changed[k], before[k]) for k in before)
    want = _layers(model, x, 6)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())


def test_training_is_bit_identical_after_predict():
    def step(model, x):
        y = model.forward(x, training=True)
        model.backward(np.ones_like(y))
        return y, model.gradients_flat().copy()

    x = np.random.default_rng(4).normal(size=(4, 3, 8, 8)).astype(np.float32)
    plain, used = _model("resnet20", (3, 8, 8)), _model("resnet20", (3, 8, 8))
    used.predict(x)
    y0, g0 = step(plain, x)
    y1, g1 = step(used, x)
    np.testing.assert_array_equal(y0, y1)
    np.testing.assert_array_equal(g0, g1)
    np.testing.assert_array_equal(plain.parameters_flat(), used.parameters_flat())


def test_layers_run_when_switched_off(monkeypatch):
    model = _model("resnet20", (3, 8, 8))
    monkeypatch.setenv("DISTNN_INFERENCE", "layers")
    assert why_not(model) == "DISTNN_INFERENCE=layers"
    x = np.random.default_rng(5).normal(size=(5, 3, 8, 8)).astype(np.float32)
    np.testing.assert_array_equal(model.predict(x, batch_size=2), _layers(model, x, 2))


DATA = ["--dataset", "synthetic", "--model", "resnet20", "--input_shape", "3,8,8",
        "--num_samples", "60", "--batch_size", "7", "--quiet"]


def test_distnn_predict_with_without_and_missing_onednn(tmp_path):
    proc = run_distnn("train", *DATA, "--num_epochs", "1", "--steps_per_epoch", "2",
                      "--evaluate", "false", "--save_weights", "w.npz", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    runs = {"program": {}, "layers": {"DISTNN_INFERENCE": "layers"},
            "missing": {"DISTNN_ONEDNN_LIB": str(tmp_path / "no-libdnnl.so")}}
    logits = {}
    for label, env in runs.items():
        proc = run_distnn("predict", *DATA, "--weights", "w.npz", "--output", f"{label}.npz",
                          cwd=tmp_path, **env)
        assert proc.returncode == 0, proc.stderr
        with np.load(tmp_path / f"{label}.npz") as out:
            logits[label] = out["logits"]
    np.testing.assert_array_equal(logits["missing"], logits["layers"])
    want = logits["layers"]
    np.testing.assert_allclose(logits["program"], want, rtol=1e-4,
                               atol=1e-5 * np.abs(want).max())
