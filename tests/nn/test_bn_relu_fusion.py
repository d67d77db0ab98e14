"""BatchNormalization + ReLU fused: the zoo models with the pairs fused and unfused give the
same outputs, gradients, running statistics, names, summaries and checkpoints, bit for bit
(float32, the dtype the compiled kernels are built and cached for: on the compiled backend a
float64 resnet20 first compiles its own kernels, about a minute; real Fashion-MNIST images);
the fused pair passes gradient checks; kept buffers (off by
default) are reused in training only and change no result."""
import numpy as np
import pytest

from distnn.data.registry import load_dataset
from distnn.models import get_model
from distnn.nn import (Add, BatchNormalization, Conv2D, Dense, Flatten, GlobalAvgPool2D, ReLU,
                       Sequential, set_bn_relu_fusion)
from distnn.nn.losses import CategoricalCrossEntropy
from gradcheck import check_layer

pytestmark = pytest.mark.usefixtures("kernel_backend")

FASHION = "/usr/share/datasets/fashion-mnist"


@pytest.fixture(scope="module")
def images():
    """16 Fashion-MNIST training images padded to 1x32x32 (vgg11bn halves it 5 times)."""
    splits = load_dataset("fashion_mnist", path=FASHION, download=False)
    x = splits.train.x[:16].astype(np.float32) / 255.0
    return np.pad(x, ((0, 0), (0, 0), (2, 2), (2, 2))), np.asarray(splits.train.y[:16])


def fused_pairs(model):
    return [(l, l.fused_relu) for l in model.walk()
            if isinstance(l, BatchNormalization) and l.fused_relu is not None]


def run_steps(model, x, y, steps=3):
    """Training steps (SGD by hand on the flat buffers) and an evaluation; every output,
    gradient and running statistic along the way."""
    loss = CategoricalCrossEntropy()
    seen = []
    for _ in range(steps):
        logits = model.forward(x, training=True)
        _, dy = loss(logits, y)
        model.backward(dy)
        seen += [logits.copy(), model.gradients_flat().copy()]
        model.parameters_flat()[...] -= 0.1 * model.gradients_flat()
    seen += [l.buffers[k].copy() for l in model.walk() for k in sorted(l.buffers)]
    seen.append(model.forward(x, training=False).copy())
    return seen


@pytest.mark.parametrize("name", ["resnet20", "vgg11bn"])
def test_zoo_model_fused_equals_unfused(name, images):
    x, y = images
    fused = get_model(name, input_shape=(1, 32, 32), num_classes=10, dtype=np.float32, rng=0)
    plain = get_model(name, input_shape=(1, 32, 32), num_classes=10, dtype=np.float32, rng=0)
    set_bn_relu_fusion(plain, False)
    pairs = fused_pairs(fused)
    bns = [l for l in fused.walk() if isinstance(l, BatchNormalization)]
    # every BN is followed by a ReLU except the residual branches' last ones
    assert len(pairs) == (len(bns) if name == "vgg11bn" else 1 + 9)
    assert not fused_pairs(plain)
    assert fused.summary() == plain.summary()
    a, b = run_steps(fused, x, y), run_steps(plain, x, y)
    assert all(relu._passed for _, relu in pairs)  # the fused path ran (eval forward last)
    assert len(a) == len(b)
    for u, v in zip(a, b):
        np.testing.assert_array_equal(u, v)


def test_checkpoints_load_across_fused_and_unfused(images, tmp_path):
    x, y = images
    fused = get_model("resnet20", input_shape=(1, 32, 32), num_classes=10, dtype=np.float32,
                      rng=0)
    run_steps(fused, x, y, steps=1)
    fused.save_weights(tmp_path / "w.npz")
    plain = get_model("resnet20", input_shape=(1, 32, 32), num_classes=10, dtype=np.float32,
                      rng=1)
    set_bn_relu_fusion(plain, False)
    plain.load_weights(tmp_path / "w.npz")
    np.testing.assert_array_equal(plain.forward(x, training=False),
                                  fused.forward(x, training=False))
    plain.save_weights(tmp_path / "w2.npz")
    again = get_model("resnet20", input_shape=(1, 32, 32), num_classes=10, dtype=np.float32,
                      rng=2)
    again.load_weights(tmp_path / "w2.npz")
    assert fused_pairs(again)
    np.testing.assert_array_equal(again.forward(x, training=True),
                                  fused.forward(x, training=True))


def small_model():
    """Conv, a fused pair, a residual block with a fused pair in a branch and an unfused BN
    at its end, then Dense + BN + ReLU (the (N, F) case)."""
    return Sequential([Conv2D(3, 3, padding=1), BatchNormalization(), ReLU(),
                       Add([Conv2D(3, 3, padding=1), BatchNormalization(), ReLU(),
                            Conv2D(3, 3, padding=1), BatchNormalization()], []), ReLU(),
                       GlobalAvgPool2D(), Flatten(), Dense(4), BatchNormalization(), ReLU(),
                       Dense(3)], input_shape=(1, 6, 6), dtype=np.float64, rng=0)


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_fused_model_gradient_check(training, images):
    model = small_model()
    assert len(fused_pairs(model)) == 3
    for layer in model.walk():
        if isinstance(layer, BatchNormalization):  # non-trivial running statistics
            layer.buffers["running_mean"][...] = 0.1
            layer.buffers["running_var"][...] = 0.5
    model.layers[0].need_dx = True
    x = images[0][:5, :, 10:16, 10:16].astype(np.float64)  # the float64 small model
    check_layer(model, x, training=training, tol=1e-5)
    assert all(relu._passed for _, relu in fused_pairs(model))


def test_relu_after_a_fused_batchnorm_still_rectifies_other_input():
    model = small_model()
    bn, relu = model.layers[1], model.layers[2]
    assert bn.fused_relu is relu
    x = np.linspace(-1, 1, 2 * 3 * 6 * 6).reshape(2, 3, 6, 6)
    np.testing.assert_array_equal(relu.forward(x, training=True), np.maximum(x, 0))
    dy = np.ones_like(x)
    np.testing.assert_array_equal(relu.backward(dy), (x > 0).astype(float))


@pytest.fixture
def keep_buffers():
    BatchNormalization.reuse_buffers = ReLU.reuse_buffers = True
    yield
    BatchNormalization.reuse_buffers = ReLU.reuse_buffers = False


def test_buffers_are_not_kept_by_default(images):
    x = images[0][:4, :, 10:16, 10:16].astype(np.float64)
    model = small_model()
    conv, bn = model.layers[0], model.layers[1]
    y1 = bn.forward(conv.forward(x, True), True)
    y2 = bn.forward(conv.forward(x, True), True)
    assert y1 is not y2
    np.testing.assert_array_equal(y1, y2)


def test_kept_buffers_reused_in_training_only(images, kernel_backend, keep_buffers):
    x = images[0][:4, :, 10:16, 10:16].astype(np.float64)
    model = small_model()
    conv, bn = model.layers[0], model.layers[1]
    y1 = bn.forward(conv.forward(x, True), True)
    first = y1.copy()
    y2 = bn.forward(conv.forward(2 * x, True), True)
    # the compiled path writes into the kept array; the NumPy reference allocates
    assert (y1 is y2) == (kernel_backend == "numba")
    assert not np.array_equal(y2, first)
    e1 = bn.forward(conv.forward(x, False), False)
    e2 = bn.forward(conv.forward(x, False), False)
    assert e1 is not e2 and e1 is not y2
    y3 = bn.forward(conv.forward(x, True), True)
    np.testing.assert_array_equal(y3, first)


def test_kept_buffers_give_the_same_training(images, keep_buffers):
    x, y = images
    kept = get_model("resnet20", input_shape=(1, 32, 32), num_classes=10, dtype=np.float32,
                     rng=0)
    a = run_steps(kept, x, y)
    BatchNormalization.reuse_buffers = ReLU.reuse_buffers = False
    fresh = get_model("resnet20", input_shape=(1, 32, 32), num_classes=10, dtype=np.float32,
                      rng=0)
    b = run_steps(fresh, x, y)
    for u, v in zip(a, b):
        np.testing.assert_array_equal(u, v)
