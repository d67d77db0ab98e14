"""Metrics: per-batch sums against hand-computed values, integer and one-hot labels."""
import numpy as np
import pytest

from distnn.nn.metrics import (METRICS, categorical_accuracy, categorical_hinge, categorical_mae,
                            categorical_mse, get_metric, mean_absolute_error,
                            mean_squared_error, top_k_accuracy)

Y = np.array([[0.1, 0.7, 0.2],
              [0.5, 0.3, 0.2],
              [0.2, 0.2, 0.6],
              [0.3, 0.4, 0.3]])
LABELS = np.array([1, 2, 2, 0])
ONE_HOT = np.eye(3)[LABELS]


@pytest.mark.parametrize("y_true", [LABELS, ONE_HOT], ids=["labels", "one_hot"])
def test_accuracy(y_true):
    assert categorical_accuracy(Y, y_true) == 2.0  # samples 0 and 2
    assert METRICS["acc"] is METRICS["accuracy"] is categorical_accuracy


@pytest.mark.parametrize("y_true", [LABELS, ONE_HOT], ids=["labels", "one_hot"])
def test_top_k(y_true):
    assert top_k_accuracy(Y, y_true, k=1) == 2.0
    # top 2: sample 1 (label 2 scores 0.2, third) misses; sample 3 (0.3 ties 2nd) counts
    assert top_k_accuracy(Y, y_true, k=2) == 3.0
    assert top_k_accuracy(Y, y_true, k=3) == 4.0
    assert get_metric("top2")(Y, y_true) == 3.0
    assert get_metric("top_2_accuracy")(Y, y_true) == 3.0
    assert get_metric("top5")(Y, y_true) == 4.0  # k beyond the class count: all in


def test_top_k_larger_problem_against_sort():
    rng = np.random.default_rng(0)
    y = rng.standard_normal((50, 10))
    labels = rng.integers(0, 10, 50)
    top5 = np.argsort(-y, axis=1)[:, :5]
    expected = sum(labels[i] in top5[i] for i in range(50))
    assert METRICS["top5"](y, labels) == METRICS["top_5_accuracy"](y, labels) == expected
    assert get_metric("top5").__name__ == "top5_accuracy"


@pytest.mark.parametrize("y_true", [LABELS, ONE_HOT], ids=["labels", "one_hot"])
def test_categorical_hinge(y_true):
    # per sample: max(0, 1 + max wrong score - true score)
    expected = (1 + 0.2 - 0.7) + (1 + 0.5 - 0.2) + (1 + 0.2 - 0.6) + (1 + 0.4 - 0.3)
    assert categorical_hinge(Y, y_true) == pytest.approx(expected)
    big_margin = np.array([[5.0, -1.0, 0.0]])
    assert categorical_hinge(big_margin, np.array([0])) == 0.0
    # Keras' definition: max over (1 - t) * y, so negative wrong scores count as 0
    assert categorical_hinge(np.array([[-2.0, -3.0]]), np.array([0])) == pytest.approx(3.0)


@pytest.mark.parametrize("y_true", [LABELS, ONE_HOT], ids=["labels", "one_hot"])
def test_categorical_mse_mae(y_true):
    diff = Y - ONE_HOT
    assert categorical_mse(Y, y_true) == pytest.approx(np.sum(diff ** 2) / 3)
    assert categorical_mae(Y, y_true) == pytest.approx(np.sum(np.abs(diff)) / 3)
    # sample 0: (0.01 + 0.09 + 0.04) / 3
    assert categorical_mse(Y[:1], y_true[:1]) == pytest.approx(0.14 / 3)


def test_regression_metrics():
    y = np.array([[1.0, 2.0], [3.0, 5.0]])
    t = np.array([[1.0, 4.0], [2.0, 5.0]])
    assert mean_squared_error(y, t) == pytest.approx((0 + 4) / 2 + (1 + 0) / 2)
    assert mean_absolute_error(y, t) == pytest.approx((0 + 2) / 2 + (1 + 0) / 2)
    assert get_metric("mse")(np.array([1.0, 2.0]), np.array([[0.0], [2.0]])) == 1.0
    assert get_metric("mae")(np.zeros((0, 3)), np.zeros((0, 3))) == 0.0


def test_sums_add_over_shards():
    rng = np.random.default_rng(1)
    y, labels = rng.standard_normal((9, 4)), rng.integers(0, 4, 9)
    for name in ("accuracy", "top5", "categorical_hinge", "categorical_mse", "categorical_mae"):
        m = get_metric(name)
        assert m(y[:4], labels[:4]) + m(y[4:], labels[4:]) == pytest.approx(m(y, labels))


def test_errors_and_registry():
    with pytest.raises(ValueError, match=r"metric 'f1' is unknown; valid choices: acc, "):
        get_metric("f1")
    with pytest.raises(ValueError, match=r"k must be >= 1"):
        get_metric("top0")
    with pytest.raises(ValueError, match=r"y_true has shape \(3,\) but y_pred has shape "
                                         r"\(4, 3\)"):
        categorical_accuracy(Y, LABELS[:3])
    with pytest.raises(ValueError, match=r"label 3, outside \[0, 3\)"):
        categorical_accuracy(Y, np.array([0, 1, 2, 3]))
    with pytest.raises(ValueError, match=r"y_true has shape \(4, 2\)"):
        categorical_mse(Y, np.zeros((4, 2)))
    assert get_metric(categorical_hinge) is categorical_hinge
    for name in ("accuracy", "categorical_accuracy", "acc", "top5", "top_5_accuracy",
                 "categorical_hinge", "categorical_mse", "categorical_mae", "mse", "mae"):
        assert name in METRICS
