"""Add + ReLU fused (a residual block's sum and the ReLU after it, with the batch norm
ending its first branch in training): the fused pair gives the unfused pair's outputs,
gradients and running statistics bit for bit (the same float operations in the same order:
gamma * xhat + beta, + the other branch, max(., 0) forward; the mask dy * (y > 0), then the
branches' gradients summed as ``_sum_fresh`` sums them, masked by the ReLU before the
block); the fusion runs on the compiled backend only (the NumPy path is the reference,
unchanged), where the planner allows it; the fused pair passes gradient checks."""
import numpy as np
import pytest

from distnn import kernels
from distnn.kernels import batchnorm as K
from distnn.kernels import planner as plan
from distnn.kernels.backend import compiled
from distnn.models import get_model
from distnn.nn import (Add, BatchNormalization, Conv2D, Dense, Flatten, GlobalAvgPool2D, ReLU,
                       Sequential, set_add_relu_fusion, set_bn_relu_fusion)
from distnn.nn.losses import CategoricalCrossEntropy
from gradcheck import check_layer

pytestmark = pytest.mark.usefixtures("kernel_backend")


def fused_blocks(model):
    return [l for l in model.walk() if isinstance(l, Add) and l.fused_relu is not None]


def run_steps(model, x, y, steps=2):
    """Training steps (SGD by hand on the flat buffers), then an evaluation: every output,
    gradient, input gradient and running statistic along the way."""
    loss = CategoricalCrossEntropy()
    model.layers[0].need_dx = True
    seen = []
    for _ in range(steps):
        logits = model.forward(x, training=True)
        _, dy = loss(logits, y)
        seen += [logits.copy(), model.backward(dy).copy(), model.gradients_flat().copy()]
        model.parameters_flat()[...] -= 0.1 * model.gradients_flat()
    seen += [l.buffers[k].copy() for l in model.walk() for k in sorted(l.buffers)]
    seen.append(model.forward(x, training=False).copy())
    return seen


def data(n=8, shape=(3, 32, 32), classes=10, dtype=np.float32):
    rng = np.random.default_rng(3)
    return rng.standard_normal((n,) + shape).astype(dtype), rng.integers(0, classes, n)


def ran_fused(model) -> bool:
    return all(b._relu_y is not None and b.fused_relu._passed for b in fused_blocks(model))


@pytest.mark.parametrize("bn_relu", [True, False], ids=["bn_relu", "no_bn_relu"])
def test_resnet20_fused_equals_unfused(kernel_backend, bn_relu):
    x, y = data()
    fused = get_model("resnet20", input_shape=(3, 32, 32), num_classes=10, rng=0)
    plain = get_model("resnet20", input_shape=(3, 32, 32), num_classes=10, rng=0)
    set_add_relu_fusion(plain, False)
    for model in (fused, plain):
        set_bn_relu_fusion(model, bn_relu)
    assert len(fused_blocks(fused)) == 9 and not fused_blocks(plain)
    # each block after the first masks its gradient sum with the ReLU before it
    assert [b._upstream is not None for b in fused_blocks(fused)] == [False] + [True] * 8
    assert not any(b._upstream for b in plain.walk() if isinstance(b, Add))
    assert fused.summary() == plain.summary()
    a, b = run_steps(fused, x, y), run_steps(plain, x, y)
    # the compiled backend fused (eval forward last); the NumPy reference never does
    assert ran_fused(fused) == (kernel_backend == "numba")
    assert len(a) == len(b)
    for u, v in zip(a, b):
        np.testing.assert_array_equal(u, v)


def test_planner_switch_turns_the_fusion_off():
    x, y = data(n=4)
    model = get_model("resnet20", input_shape=(3, 32, 32), num_classes=10, rng=0)
    with plan.using(add_relu=False):
        off = run_steps(model, x, y, steps=1)
        assert not any(b._relu_y is not None for b in fused_blocks(model))
    model = get_model("resnet20", input_shape=(3, 32, 32), num_classes=10, rng=0)
    on = run_steps(model, x, y, steps=1)
    for u, v in zip(on, off):
        np.testing.assert_array_equal(u, v)
    assert plan.fuse_add_relu(np.float32) and not plan.fuse_add_relu(np.int32)
    assert not plan.fuse_add_relu(np.float32, plan.Limits(add_relu=False))


def residual_model(dtype=np.float64, third=False):
    """Conv, a residual block (conv, BN, ReLU, conv, BN | identity [| 1x1 conv]) and a ReLU,
    then a downsampling one (stride 2 | 1x1 stride-2 conv) and a ReLU, then Dense: the
    second block masks its gradient sum with the first block's ReLU."""
    branches = [[Conv2D(3, 3, padding=1), BatchNormalization(), ReLU(),
                 Conv2D(3, 3, padding=1), BatchNormalization()], []]
    if third:
        branches.append([Conv2D(3, 1)])
    down = Add([Conv2D(4, 3, strides=2, padding=1), BatchNormalization()],
               [Conv2D(4, 1, strides=2), BatchNormalization()])
    return Sequential([Conv2D(3, 3, padding=1), Add(*branches), ReLU(), down, ReLU(),
                       GlobalAvgPool2D(), Flatten(), Dense(3)], input_shape=(2, 6, 6),
                      dtype=dtype, rng=0)


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_fused_block_gradient_check(kernel_backend, training):
    model = residual_model()
    assert len(fused_blocks(model)) == 2 and model.layers[3]._upstream is model.layers[1]
    model.layers[0].need_dx = True
    x = np.random.default_rng(1).standard_normal((4, 2, 6, 6))
    check_layer(model, x, training=training, tol=1e-5)
    assert ran_fused(model) == (kernel_backend == "numba")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("threads", [1, 2])
def test_small_block_fused_equals_unfused(dtype, threads):
    previous = kernels.get_num_threads()
    kernels.set_num_threads(threads)
    try:
        x, y = data(n=5, shape=(2, 6, 6), classes=3, dtype=dtype)
        fused, plain = residual_model(dtype), residual_model(dtype)
        set_add_relu_fusion(plain, False)
        for u, v in zip(run_steps(fused, x, y), run_steps(plain, x, y)):
            np.testing.assert_array_equal(u, v)
    finally:
        kernels.set_num_threads(previous)


def test_three_branches_run_unfused_with_the_same_results(kernel_backend):
    x, y = data(n=5, shape=(2, 6, 6), classes=3)
    fused, plain = residual_model(third=True), residual_model(third=True)
    set_add_relu_fusion(plain, False)
    a, b = run_steps(fused, x, y), run_steps(plain, x, y)
    assert fused.layers[1]._relu_y is None and not fused.layers[2]._passed
    assert (fused.layers[3]._relu_y is not None) == (kernel_backend == "numba")
    assert fused.layers[3]._x is None  # its upstream pair ran unfused: no mask to take
    for u, v in zip(a, b):
        np.testing.assert_array_equal(u, v)


def test_relu_after_a_fused_add_still_rectifies_other_input():
    model = residual_model()
    relu = model.layers[2]
    assert model.layers[1].fused_relu is relu
    x = np.linspace(-1, 1, 2 * 3 * 6 * 6).reshape(2, 3, 6, 6)
    np.testing.assert_array_equal(relu.forward(x, training=True), np.maximum(x, 0))
    assert not relu._passed


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("threads", [1, 2])
def test_add_relu_kernel_matches_numpy(kernel_backend, dtype, threads):
    if kernel_backend != "numba":
        pytest.skip("a compiled kernel")
    fast = compiled()
    previous = kernels.get_num_threads()
    kernels.set_num_threads(threads)
    try:
        rng = np.random.default_rng(0)
        n = (1 << 20) + 37  # past parallel_min: split among the threads
        a, b = (rng.standard_normal(n).astype(dtype) for _ in range(2))
        a[:4] = [np.nan, -0.0, 0.0, 1.0]
        b[:4] = [1.0, 0.0, -0.0, -1.0]
        out = np.empty_like(a)
        fast.add_relu(a, b, out)
        ref = np.maximum(a + b, 0)
        np.testing.assert_array_equal(out, ref)
        assert np.isnan(out[0]) and not np.signbit(out[1:4]).any()
    finally:
        kernels.set_num_threads(previous)


def test_the_block_after_a_fused_pair_masks_its_sum_for_it(kernel_backend, monkeypatch):
    if kernel_backend != "numba":
        pytest.skip("the fusion runs on the compiled backend")
    from distnn.kernels import _numba_bn
    fast, calls = compiled(), []
    for module, name in ((fast, "add_relu_backward"), (fast, "relu_backward"),
                         (fast, "add_relu"), (_numba_bn, "bn_add_relu_forward_train")):
        kernel = getattr(module, name)
        monkeypatch.setattr(module, name,
                            lambda *a, k=kernel, n=name: calls.append(n) or k(*a))
    model = residual_model(np.float32)
    x, _ = data(n=3, shape=(2, 6, 6), dtype=np.float32)
    model.forward(x, training=True)
    # in training each block's last batch norm writes the sum and the ReLU
    assert calls == ["bn_add_relu_forward_train"] * 2
    model.backward(np.ones((3, 3), np.float32))
    # the second block masks dy for itself and its sum for the first, which masks nothing
    assert calls[2:] == ["relu_backward", "add_relu_backward"]
    model.forward(x, training=False)
    assert calls[4:] == ["add_relu"] * 2  # evaluation: the batch norms apart


def test_sync_batchnorm_at_a_branch_end_runs_apart_with_the_same_results(kernel_backend):
    x, y = data(n=5, shape=(2, 6, 6), classes=3, dtype=np.float32)
    fused, plain = residual_model(np.float32), residual_model(np.float32)
    set_add_relu_fusion(plain, False)
    for model in (fused, plain):  # a stat_reducer of one rank: the sums unchanged
        for layer in model.walk():
            if isinstance(layer, BatchNormalization):
                layer.stat_reducer = lambda sums: sums
    a, b = run_steps(fused, x, y), run_steps(plain, x, y)
    assert (fused.layers[1]._relu_y is not None) == (kernel_backend == "numba")
    for u, v in zip(a, b):
        np.testing.assert_array_equal(u, v)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("threads", [1, 2])
def test_bn_add_relu_kernel_gives_the_three_steps_bits(kernel_backend, dtype, threads):
    rng = np.random.default_rng(5)
    x = (1.0 + 2.0 * rng.standard_normal((6, 16, 8, 8))).astype(dtype)
    r = rng.standard_normal(x.shape).astype(dtype)
    gamma = rng.uniform(0.5, 2.0, 16).astype(dtype)
    beta = rng.standard_normal(16).astype(dtype)
    previous = kernels.get_num_threads()
    kernels.set_num_threads(threads)
    try:
        out = K.bn_add_relu_forward_train(x, r, gamma, beta, 1e-5)
        y, _, mean, var, invstd = K.bn_forward_train(x, gamma, beta, 1e-5, keep_xhat=False)
    finally:
        kernels.set_num_threads(previous)
    if kernel_backend == "numpy":
        assert out is None  # no fused kernel: the layers run apart
        return
    for u, v in zip(out, (np.maximum(y + r, 0), mean, var, invstd)):
        np.testing.assert_array_equal(u, v)
    assert K.bn_add_relu_forward_train(x, r[:, :, :, :4], gamma, beta, 1e-5) is None
