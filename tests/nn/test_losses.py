"""Losses: value and gradient against torch, central differences, stability, denom."""
import numpy as np
import pytest

from distnn.nn.losses import (LOSSES, BinaryCrossEntropy, CategoricalCrossEntropy,
                              MeanAbsoluteError, MeanSquaredError, get_loss)
from gradcheck import numerical_grad, rel_error

RNG = np.random.default_rng(0)
N, C = 6, 5
LOGITS = RNG.standard_normal((N, C)) * 3
LABELS = RNG.integers(0, C, N)
PROBS = RNG.dirichlet(np.ones(C), N)  # soft targets, rows sum to 1


def torch_value_and_grad(fn, y_pred, *args, **kwargs):
    torch = pytest.importorskip("torch")
    y = torch.tensor(y_pred, requires_grad=True)
    out = fn(y, *[torch.as_tensor(a) for a in args], **kwargs)
    out.backward()
    return out.item(), y.grad.numpy()


def tols(dtype):
    return dict(rtol=1e-4, atol=1e-4) if dtype == np.float32 else dict(rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("smoothing", [0.0, 0.2])
@pytest.mark.parametrize("targets", ["labels", "one_hot", "probs"])
def test_cross_entropy_matches_torch(dtype, smoothing, targets):
    torch = pytest.importorskip("torch")
    y_true = {"labels": LABELS, "one_hot": np.eye(C)[LABELS], "probs": PROBS}[targets]
    y = LOGITS.astype(dtype)
    loss, grad = CategoricalCrossEntropy(label_smoothing=smoothing)(y, y_true)
    t = y_true if targets == "labels" else y_true.astype(dtype)
    ref, ref_grad = torch_value_and_grad(torch.nn.functional.cross_entropy, y, t,
                                         label_smoothing=smoothing)
    assert grad.dtype == dtype and grad.shape == y.shape
    np.testing.assert_allclose(loss, ref, **tols(dtype))
    np.testing.assert_allclose(grad, ref_grad, **tols(dtype))


def test_cross_entropy_from_probabilities_matches_torch_nll():
    torch = pytest.importorskip("torch")
    p = np.exp(LOGITS) / np.exp(LOGITS).sum(1, keepdims=True)
    loss, grad = CategoricalCrossEntropy(from_logits=False)(p, LABELS)
    ref, ref_grad = torch_value_and_grad(
        lambda q, t: torch.nn.functional.nll_loss(torch.log(q), t), p, LABELS)
    np.testing.assert_allclose(loss, ref, rtol=1e-10)
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-10)
    # clipped entries get no gradient and a finite loss
    p[0] = [1.0, 0.0, 0.0, 0.0, 0.0]
    loss, grad = CategoricalCrossEntropy(from_logits=False)(p, np.r_[1, LABELS[1:]])
    assert np.isfinite(loss) and grad[0, 1] == 0 and grad[0, 0] == 0


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_binary_cross_entropy_matches_torch(dtype):
    torch = pytest.importorskip("torch")
    y = (RNG.standard_normal((N, 3)) * 4).astype(dtype)
    t = RNG.uniform(size=(N, 3)).astype(dtype)
    loss, grad = BinaryCrossEntropy()(y, t)
    ref, ref_grad = torch_value_and_grad(
        torch.nn.functional.binary_cross_entropy_with_logits, y, t)
    assert grad.dtype == dtype
    np.testing.assert_allclose(loss, ref, **tols(dtype))
    np.testing.assert_allclose(grad, ref_grad, **tols(dtype))
    p = 1 / (1 + np.exp(-y.astype(np.float64)))
    t = t.astype(np.float64)
    loss_p, grad_p = BinaryCrossEntropy(from_logits=False)(p, t)
    ref, ref_grad = torch_value_and_grad(torch.nn.functional.binary_cross_entropy, p, t)
    np.testing.assert_allclose(loss_p, ref, rtol=1e-6)
    np.testing.assert_allclose(grad_p, ref_grad, rtol=1e-6, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("name, cls", [("mse_loss", MeanSquaredError),
                                       ("l1_loss", MeanAbsoluteError)])
def test_regression_losses_match_torch(dtype, name, cls):
    torch = pytest.importorskip("torch")
    y = RNG.standard_normal((N, 2, 3)).astype(dtype)
    t = RNG.standard_normal((N, 2, 3)).astype(dtype)
    loss, grad = cls()(y, t)
    ref, ref_grad = torch_value_and_grad(getattr(torch.nn.functional, name), y, t)
    assert grad.dtype == dtype
    np.testing.assert_allclose(loss, ref, **tols(dtype))
    np.testing.assert_allclose(grad, ref_grad, **tols(dtype))


GRAD_CASES = {
    "cce_labels": (CategoricalCrossEntropy(), lambda: LABELS, (N, C)),
    "cce_smooth_probs": (CategoricalCrossEntropy(label_smoothing=0.1), lambda: PROBS, (N, C)),
    "cce_unnormalised_targets": (CategoricalCrossEntropy(), lambda: 2 * PROBS, (N, C)),
    "cce_from_probs": (CategoricalCrossEntropy(from_logits=False), lambda: PROBS, (N, C)),
    "bce": (BinaryCrossEntropy(), lambda: RNG.uniform(size=(N, 4)), (N, 4)),
    "bce_from_probs": (BinaryCrossEntropy(from_logits=False),
                       lambda: RNG.uniform(size=(N, 4)), (N, 4)),
    "mse": (MeanSquaredError(), lambda: RNG.standard_normal((N, 2, 2)), (N, 2, 2)),
    "mae": (MeanAbsoluteError(), lambda: RNG.standard_normal((N, 3)), (N, 3)),
}


@pytest.mark.parametrize("case", sorted(GRAD_CASES))
def test_gradient_central_differences(case):
    loss_fn, make_target, shape = GRAD_CASES[case]
    y_true = make_target()
    if loss_fn.__dict__.get("from_logits") is False:
        y = RNG.uniform(0.05, 0.95, shape)
    else:
        y = RNG.standard_normal(shape)
    _, grad = loss_fn(y, y_true, denom=4)
    num = numerical_grad(lambda: loss_fn(y, y_true, denom=4)[0], y)
    assert rel_error(grad, num) < 1e-6


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_huge_logits_are_stable(dtype):
    torch = pytest.importorskip("torch")
    y = np.array([[1e4, -1e4, 0.0], [-1e4, 1e4, 5e3], [0.0, 0.0, 1e4]], dtype)
    labels = np.array([1, 1, 0])
    for smoothing in (0.0, 0.3):
        loss, grad = CategoricalCrossEntropy(label_smoothing=smoothing)(y, labels)
        assert np.isfinite(loss) and np.isfinite(grad).all()
        ref, ref_grad = torch_value_and_grad(torch.nn.functional.cross_entropy,
                                             y.astype(np.float64), labels,
                                             label_smoothing=smoothing)
        np.testing.assert_allclose(loss, ref, rtol=1e-6)
        np.testing.assert_allclose(grad, ref_grad, atol=1e-6)
    t = np.array([[1.0, 0.0, 0.5]] * 3, dtype)
    loss, grad = BinaryCrossEntropy()(y, t)
    ref, ref_grad = torch_value_and_grad(torch.nn.functional.binary_cross_entropy_with_logits,
                                         y.astype(np.float64), t.astype(np.float64))
    assert np.isfinite(loss) and np.isfinite(grad).all()
    np.testing.assert_allclose(loss, ref, rtol=1e-6)
    np.testing.assert_allclose(grad, ref_grad, atol=1e-7)


@pytest.mark.parametrize("name", ["cce", "bce", "mse", "mae"])
def test_denom_scales_value_and_gradient(name):
    loss_fn = get_loss(name)
    y = RNG.standard_normal((N, C))
    t = LABELS if name == "cce" else RNG.uniform(size=(N, C))
    mean_loss, mean_grad = loss_fn(y, t)
    loss, grad = loss_fn(y, t, denom=24)
    np.testing.assert_allclose(loss, mean_loss * N / 24, rtol=1e-12)
    np.testing.assert_allclose(grad, mean_grad * N / 24, rtol=1e-12)
    # two shards with the global batch as denom sum to the loss and gradient of the whole
    l1, g1 = loss_fn(y[:4], t[:4], denom=N)
    l2, g2 = loss_fn(y[4:], t[4:], denom=N)
    np.testing.assert_allclose(l1 + l2, mean_loss, rtol=1e-12)
    np.testing.assert_allclose(np.concatenate([g1, g2]), mean_grad, rtol=1e-12)
    # an empty shard contributes nothing
    l0, g0 = loss_fn(y[:0], t[:0], denom=N)
    assert l0 == 0.0 and g0.shape == (0, C)


def test_column_targets_interchangeable():
    y = RNG.standard_normal((N, 1))
    t = RNG.uniform(size=N)
    for loss_fn in (BinaryCrossEntropy(), MeanSquaredError(), MeanAbsoluteError()):
        a, ga = loss_fn(y, t)
        b, gb = loss_fn(y, t[:, None])
        assert a == b and np.array_equal(ga, gb) and ga.shape == (N, 1)


def test_errors():
    cce = CategoricalCrossEntropy()
    with pytest.raises(ValueError, match=r"label 7, outside \[0, 5\)"):
        cce(LOGITS, np.r_[LABELS[:-1], 7])
    with pytest.raises(ValueError, match=r"label -1"):
        cce(LOGITS, np.r_[LABELS[:-1], -1])
    with pytest.raises(ValueError, match=r"y_true has shape \(4,\) but y_pred has shape \(6, 5\)"):
        cce(LOGITS, LABELS[:4])
    with pytest.raises(ValueError, match=r"y_true has shape \(6, 4\) but y_pred has shape"):
        cce(LOGITS, np.zeros((N, 4)))
    with pytest.raises(ValueError, match="must be integers"):
        cce(LOGITS, LABELS + 0.5)
    with pytest.raises(ValueError, match=r"y_true has shape \(6, 3\) but y_pred has shape "
                                         r"\(6, 5\)"):
        MeanSquaredError()(LOGITS, np.zeros((N, 3)))
    with pytest.raises(ValueError, match="denom must be a number > 0"):
        cce(LOGITS, LABELS, denom=0)
    with pytest.raises(ValueError, match="float array"):
        MeanSquaredError()(np.ones((2, 2), int), np.ones((2, 2)))
    with pytest.raises(ValueError, match="label_smoothing must be in"):
        CategoricalCrossEntropy(label_smoothing=1.5)


def test_registry():
    assert get_loss("CCE").__class__ is CategoricalCrossEntropy
    for name in ("categorical_cross_entropy", "cross_entropy"):
        assert LOSSES[name] is CategoricalCrossEntropy
    assert LOSSES["bce"] is LOSSES["binary_cross_entropy"] is BinaryCrossEntropy
    assert LOSSES["mse"] is LOSSES["mean_squared_error"] is MeanSquaredError
    assert LOSSES["mae"] is LOSSES["mean_absolute_error"] is MeanAbsoluteError
    assert get_loss("cce", label_smoothing=0.1).label_smoothing == 0.1
    smooth = CategoricalCrossEntropy(label_smoothing=0.1)
    assert get_loss(smooth) is smooth
    with pytest.raises(ValueError, match=r"loss 'hinge' is unknown; valid choices: bce"):
        get_loss("hinge")
