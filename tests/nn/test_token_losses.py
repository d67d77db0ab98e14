"""Token-level cross-entropy over (N, T, V) logits (CategoricalCrossEntropy) against
torch.nn.functional.cross_entropy in float64, forward and gradient, with ignore_index and
label_smoothing; the token metrics (perplexity, token accuracy) and their exact sums."""
from __future__ import annotations

import math

import numpy as np
import pytest

from distnn.nn.losses import CategoricalCrossEntropy, get_loss
from distnn.nn.metrics import categorical_accuracy, get_metric, perplexity, token_accuracy
from distnn.training.evaluation import MetricSet

torch = pytest.importorskip("torch")
F = torch.nn.functional

N, T, V = 4, 6, 9


def data(seed=0, ignored=0, ignore_index=-100):
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((N, T, V)) * 3
    t = rng.integers(0, V, (N, T))
    if ignored:
        t.reshape(-1)[rng.choice(N * T, ignored, replace=False)] = ignore_index
    return z, t


def torch_loss(z, t, **kw):
    zt = torch.tensor(z, requires_grad=True)
    loss = F.cross_entropy(zt.reshape(-1, V), torch.tensor(t).reshape(-1), **kw)
    loss.backward()
    return loss.item(), zt.grad.numpy()


CASES = {  # (ignored labels, ignore_index, label_smoothing)
    "plain": (0, -100, 0.0),
    "ignored": (7, -100, 0.0),
    "smoothed": (0, -100, 0.1),
    "ignored_smoothed": (5, -100, 0.2),
    "ignore_a_class": (0, 3, 0.1),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_torch_cross_entropy_forward_and_gradient(case):
    ignored, index, s = CASES[case]
    z, t = data(1, ignored, index)
    if case == "ignore_a_class":
        assert (t == 3).any()
    value, grad = CategoricalCrossEntropy(label_smoothing=s, ignore_index=index)(z, t)
    ref, ref_grad = torch_loss(z, t, ignore_index=index, label_smoothing=s)
    assert value == pytest.approx(ref, rel=1e-12)
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-10, atol=1e-15)


def test_target_distributions_per_token_match_torch():
    z, _ = data(2)
    q = np.random.default_rng(3).dirichlet(np.ones(V), (N, T))
    value, grad = CategoricalCrossEntropy(label_smoothing=0.1)(z, q)
    zt = torch.tensor(z, requires_grad=True)
    ref = F.cross_entropy(zt.reshape(-1, V), torch.tensor(q).reshape(-1, V),
                          label_smoothing=0.1)
    ref.backward()
    assert value == pytest.approx(ref.item(), rel=1e-12)
    np.testing.assert_allclose(grad, zt.grad.numpy(), rtol=1e-10, atol=1e-15)


def test_probabilities_give_the_loss_of_their_logits():
    z, t = data(4)
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    value, _ = CategoricalCrossEntropy(from_logits=False, eps=1e-12)(p, t)
    assert value == pytest.approx(CategoricalCrossEntropy()(z, t)[0], rel=1e-9)


def test_shards_with_the_global_denominator_sum_to_the_whole_batch():
    """What data parallelism relies on: the ranks' losses (and gradients) with denom = the
    global batch add up to the loss of the whole batch, a mean over its tokens."""
    z, t = data(5)
    loss = get_loss("categorical_cross_entropy")
    whole, whole_grad = loss(z, t)
    parts = [loss(z[a:b], t[a:b], denom=N) for a, b in ((0, 1), (1, N))]
    assert sum(v for v, _ in parts) == pytest.approx(whole, rel=1e-12)
    np.testing.assert_allclose(np.concatenate([g for _, g in parts]), whole_grad, rtol=1e-12)
    assert whole == pytest.approx(torch_loss(z, t)[0], rel=1e-12)


def test_every_label_ignored_is_no_loss():
    z, t = data(6)
    value, grad = CategoricalCrossEntropy()(z, np.full_like(t, -100))
    assert value == 0.0 and not grad.any()


def test_bad_labels_are_named():
    z, t = data(7)
    with pytest.raises(ValueError, match=r"y_true holds label 9, outside \[0, 9\)"):
        CategoricalCrossEntropy()(z, np.where(t == 0, 9, t))
    with pytest.raises(ValueError, match=r"pass labels of shape \(4, 6\)"):
        CategoricalCrossEntropy()(z, t[:, :3])


def test_token_metrics_count_tokens_and_leave_out_ignored_ones():
    z, t = data(8, ignored=6)
    nll, counted = perplexity(z, t)
    assert counted == N * T - 6
    assert math.exp(nll / counted) == pytest.approx(math.exp(torch_loss(z, t)[0]), rel=1e-12)
    right, counted = token_accuracy(z, t)
    keep = t >= 0
    assert right == np.count_nonzero(z.argmax(-1)[keep] == t[keep])
    z, t = data(9)
    assert categorical_accuracy(z, t) == pytest.approx(
        np.count_nonzero(z.argmax(-1) == t) / T)
    assert get_metric("ppl") is perplexity


def test_metric_sums_over_batches_and_ranks_give_exp_of_the_mean_token_loss():
    """Sums of uneven batches on two 'ranks', added as the all-reduce adds them: the
    perplexity is exp of the mean over every token, not a mean of perplexities."""
    z, t = data(10, ignored=5)
    metrics = MetricSet("categorical_cross_entropy", ["perplexity", "token_accuracy",
                                                      "accuracy"])
    ranks = []
    for rows in ((0, 1, 3), (3, 4)):
        sums = metrics.zeros()
        for a, b in zip(rows, rows[1:]):
            value, _ = metrics.loss_fn(z[a:b], t[a:b], denom=b - a)
            metrics.accumulate(sums, z[a:b], t[a:b], value, b - a)
        ranks.append(sums)
    logs = metrics.logs(ranks[0] + ranks[1])
    keep = t >= 0
    assert logs["perplexity"] == pytest.approx(math.exp(torch_loss(z, t)[0]), rel=1e-12)
    assert logs["token_accuracy"] == pytest.approx(
        np.count_nonzero(z.argmax(-1)[keep] == t[keep]) / keep.sum(), rel=1e-12)
    per_sample = [np.sum(np.where(keep[i], -np.log(np.exp(z[i]) / np.exp(z[i]).sum(-1,
                  keepdims=True))[np.arange(T), np.where(keep[i], t[i], 0)], 0)) / T
                  for i in range(N)]
    assert logs["loss"] == pytest.approx(np.mean(per_sample), rel=1e-12)
    assert logs["accuracy"] == pytest.approx(
        np.count_nonzero(z.argmax(-1)[keep] == t[keep]) / (N * T), rel=1e-12)
