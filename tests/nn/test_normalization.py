"""BatchNormalization: shapes, running statistics, gradient checks, torch, SyncBatchNorm hook."""
import threading

import numpy as np
import pytest

from distnn.kernels import batchnorm as K
from distnn.nn.normalization import BatchNormalization
from gradcheck import check_layer

pytestmark = pytest.mark.usefixtures("kernel_backend")

RNG = np.random.default_rng(0)
SHAPES = [(3,), (3, 4, 5)]


def built(layer, shape, dtype=np.float64, seed=0):
    layer.build(shape, rng=np.random.default_rng(seed), dtype=dtype)
    return layer


def randomize(layer, seed=1):
    """Non-trivial gamma, beta and running statistics."""
    rng = np.random.default_rng(seed)
    c = layer.params["gamma"].size
    layer.params["gamma"][...] = rng.uniform(0.5, 2.0, c)
    layer.params["beta"][...] = rng.standard_normal(c)
    layer.buffers["running_mean"][...] = rng.standard_normal(c)
    layer.buffers["running_var"][...] = rng.uniform(0.5, 2.0, c)
    return layer


def sample(shape, n=4, dtype=np.float64):
    return (3.0 + 2.0 * RNG.standard_normal((n,) + shape)).astype(dtype)


@pytest.mark.parametrize("shape", SHAPES)
def test_shapes_params_buffers(shape):
    layer = built(BatchNormalization(), shape, dtype=np.float32)
    assert layer.output_shape == shape
    assert set(layer.params) == {"gamma", "beta"} and layer.params["gamma"].shape == (3,)
    np.testing.assert_array_equal(layer.params["gamma"], 1)
    np.testing.assert_array_equal(layer.buffers["running_mean"], 0)
    np.testing.assert_array_equal(layer.buffers["running_var"], 1)
    for training in (True, False):
        y = layer.forward(sample(shape, dtype=np.float32), training=training)
        assert y.shape == (4,) + shape and y.dtype == np.float32
        assert layer.backward(np.ones_like(y)).dtype == np.float32


@pytest.mark.parametrize("shape", SHAPES)
def test_training_normalizes_and_updates_running_stats(shape):
    layer = built(BatchNormalization(momentum=0.8), shape)
    x = sample(shape, n=6)
    y = layer.forward(x, training=True)
    axes = (0,) + tuple(range(2, x.ndim))
    np.testing.assert_allclose(y.mean(axis=axes), 0, atol=1e-12)
    np.testing.assert_allclose(y.var(axis=axes), 1, rtol=1e-4)
    np.testing.assert_allclose(layer.buffers["running_mean"], 0.2 * x.mean(axis=axes))
    np.testing.assert_allclose(layer.buffers["running_var"], 0.8 + 0.2 * x.var(axis=axes, ddof=1))


def test_eval_uses_running_stats():
    layer = randomize(built(BatchNormalization(epsilon=1e-3), (3, 2, 2)))
    x = sample((3, 2, 2))
    rm, rv = layer.buffers["running_mean"].copy(), layer.buffers["running_var"].copy()
    g, b = layer.params["gamma"], layer.params["beta"]
    expect = (x - rm[:, None, None]) / np.sqrt(rv[:, None, None] + 1e-3) * g[:, None, None] \
        + b[:, None, None]
    np.testing.assert_allclose(layer.forward(x, training=False), expect, atol=1e-12)
    np.testing.assert_array_equal(layer.buffers["running_mean"], rm)


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("shape", SHAPES)
def test_gradients(shape, training):
    layer = randomize(built(BatchNormalization(), shape))
    check_layer(layer, sample(shape), training=training)


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_first_layer_skips_dx(training):
    layer = randomize(built(BatchNormalization(), (3,)))
    layer.need_dx = False
    errors = check_layer(layer, sample((3,)), training=training)
    assert set(errors) == {"gamma", "beta"}


def test_buffers_updated_in_place():
    layer = built(BatchNormalization(), (3,))
    rm, rv = layer.buffers["running_mean"], layer.buffers["running_var"]
    layer.forward(sample((3,)), training=True)
    assert layer.buffers["running_mean"] is rm and layer.buffers["running_var"] is rv
    assert np.abs(rm).sum() > 0


def test_errors_and_describe():
    with pytest.raises(ValueError, match="momentum"):
        BatchNormalization(momentum=1.5)
    with pytest.raises(ValueError, match="epsilon"):
        BatchNormalization(epsilon=0)
    layer = built(BatchNormalization(name="bn_a"), (3, 4, 4))
    with pytest.raises(ValueError, match=r"bn_a.*expects input of shape \(batch, 3, 4, 4\)"):
        layer.forward(np.zeros((2, 3, 4, 5)))
    with pytest.raises(RuntimeError, match="before forward"):
        built(BatchNormalization(), (3,)).backward(np.zeros((2, 3)))
    assert BatchNormalization().describe() == ""
    assert BatchNormalization(momentum=0.99).describe() == "momentum=0.99"


def test_batch_of_one_does_not_crash():
    layer = built(BatchNormalization(), (3,))
    y = layer.forward(sample((3,), n=1), training=True)
    np.testing.assert_array_equal(y, 0)
    assert np.isfinite(layer.buffers["running_var"]).all()


@pytest.mark.parametrize("shape", SHAPES)
def test_empty_batch_keeps_running_stats(shape):
    layer = randomize(built(BatchNormalization(), shape))
    before = {k: v.copy() for k, v in layer.buffers.items()}
    for training in (True, False):
        y = layer.forward(np.zeros((0,) + shape), training=training)
        assert y.shape == (0,) + shape
        assert layer.backward(y).shape == (0,) + shape
        np.testing.assert_array_equal(layer.grads["gamma"], 0)
    for k, v in before.items():
        np.testing.assert_array_equal(layer.buffers[k], v)


# -- torch ---------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-5), (np.float32, 1e-4)])
@pytest.mark.parametrize("shape", SHAPES)
def test_matches_torch(shape, dtype, tol):
    torch = pytest.importorskip("torch")
    momentum, eps = 0.7, 1e-3
    layer = randomize(built(BatchNormalization(momentum=momentum, epsilon=eps), shape,
                            dtype=dtype))
    gamma = torch.tensor(layer.params["gamma"], requires_grad=True)
    beta = torch.tensor(layer.params["beta"], requires_grad=True)
    rm = torch.tensor(layer.buffers["running_mean"])
    rv = torch.tensor(layer.buffers["running_var"])
    close = dict(rtol=tol, atol=tol)
    for step, training in enumerate([True, True, True, False, True, False]):
        x = sample(shape, n=5, dtype=dtype) * (1 + step)
        y = layer.forward(x, training=training)
        dy = RNG.standard_normal(y.shape).astype(dtype)
        dx = layer.backward(dy)
        xt = torch.tensor(x, requires_grad=True)
        gamma.grad = beta.grad = None
        yt = torch.nn.functional.batch_norm(xt, rm, rv, gamma, beta, training=training,
                                            momentum=1 - momentum, eps=eps)
        yt.backward(torch.tensor(dy))
        np.testing.assert_allclose(y, yt.detach().numpy(), **close)
        np.testing.assert_allclose(dx, xt.grad.numpy(), **close)
        np.testing.assert_allclose(layer.grads["gamma"], gamma.grad.numpy(), **close)
        np.testing.assert_allclose(layer.grads["beta"], beta.grad.numpy(), **close)
        np.testing.assert_allclose(layer.buffers["running_mean"], rm.numpy(), **close)
        np.testing.assert_allclose(layer.buffers["running_var"], rv.numpy(), **close)


# -- SyncBatchNorm hook --------------------------------------------------------------------
class FakeAllreduce:
    """Sum over `size` threads that each play one rank (a barrier-based all-reduce)."""

    def __init__(self, size):
        self.size = size
        self.barrier = threading.Barrier(size, timeout=10)
        self.slots = [None] * size
        self.calls = [0] * size

    def reducer(self, rank):
        def reduce(arr):
            assert arr.dtype == np.float64 and arr.ndim == 1
            self.calls[rank] += 1
            self.slots[rank] = arr.copy()
            self.barrier.wait()
            total = np.sum(self.slots, axis=0)
            self.barrier.wait()
            return total
        return reduce


def run_ranks(size, fn):
    out, errors = [None] * size, []

    def target(rank):
        try:
            out[rank] = fn(rank)
        except BaseException as exc:  # surface failures from the threads
            errors.append(exc)

    threads = [threading.Thread(target=target, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return out


@pytest.mark.parametrize("size,splits", [(2, [3, 3]), (3, [2, 3, 1]), (3, [4, 0, 2])])
@pytest.mark.parametrize("shape", SHAPES)
def test_sync_reducer_equals_full_batch(shape, size, splits):
    x = sample(shape, n=sum(splits))
    dy = RNG.standard_normal(x.shape)
    full = randomize(built(BatchNormalization(momentum=0.6), shape))
    y_full = full.forward(x, training=True)
    dx_full = full.backward(dy)

    comm = FakeAllreduce(size)
    bounds = np.cumsum([0] + splits)
    layers = [randomize(built(BatchNormalization(momentum=0.6), shape)) for _ in range(size)]

    def rank_step(rank):
        layer = layers[rank]
        layer.stat_reducer = comm.reducer(rank)
        lo, hi = bounds[rank], bounds[rank + 1]
        y = layer.forward(x[lo:hi], training=True)
        dx = layer.backward(dy[lo:hi])
        return y, dx

    results = run_ranks(size, rank_step)
    assert comm.calls == [2] * size  # one reduction in forward, one in backward
    np.testing.assert_allclose(np.concatenate([y for y, _ in results]), y_full, atol=1e-10)
    np.testing.assert_allclose(np.concatenate([d for _, d in results]), dx_full, atol=1e-10)
    for key in ("gamma", "beta"):
        np.testing.assert_allclose(sum(layer.grads[key] for layer in layers), full.grads[key],
                                   atol=1e-10)
    for layer in layers:
        for key in ("running_mean", "running_var"):
            np.testing.assert_allclose(layer.buffers[key], full.buffers[key], atol=1e-10)
    assert layers[0].describe() == "momentum=0.6, sync"


def test_sync_reducer_packs_sums_and_count():
    layer = built(BatchNormalization(), (2, 3, 3))
    seen = []
    layer.stat_reducer = lambda arr: seen.append(arr.copy()) or arr
    x = sample((2, 3, 3), n=2)
    layer.forward(x, training=True)
    layer.backward(np.ones_like(x))
    layer.forward(x, training=False)  # evaluation never reduces
    assert len(seen) == 2
    np.testing.assert_allclose(seen[0], np.concatenate(
        [x.sum(axis=(0, 2, 3)), (x * x).sum(axis=(0, 2, 3)), [18]]))
    assert seen[1].shape == (4,)
    np.testing.assert_allclose(seen[1][:2], 18.0)


def test_stats_kernels_agree():
    x = sample((3, 4, 5), n=3)
    mean, var = K.bn_batch_stats(x)
    m2, v2, count = K.bn_stats_from_sums(K.bn_sums(x))
    assert count == 60
    np.testing.assert_allclose(mean, m2, atol=1e-12)
    np.testing.assert_allclose(var, v2, atol=1e-10)
