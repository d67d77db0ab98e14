"""PyDTNN's nets in the zoo: ``alexnet_cifar10`` is PyDTNN's architecture (first convolution
with stride 2, a 4096-4096 head), and ``alexnet``/``vggN`` build the ImageNet nets for
ImageNet-sized images (PyDTNN's ``alexnet``, ``vgg16`` are its ImageNet models)."""
import numpy as np
import pytest

from distnn import kernels
from distnn.models import IMAGENET_SIDE, get_model, zoo_name
from distnn.nn import Conv2D, Dense


def _conv_bias(co, ci, k):
    return co * ci * k * k + co


def test_alexnet_cifar10_is_pydtnns_architecture():
    model = get_model("alexnet_cifar10", rng=0)
    convs = [l for l in model.walk() if isinstance(l, Conv2D)]
    dense = [l for l in model.walk() if isinstance(l, Dense)]
    assert convs[0].output_shape == (64, 16, 16)  # stride 2 on 32x32
    assert [l.output_shape[0] for l in convs] == [64, 192, 384, 256, 256]
    assert [l.output_shape[0] for l in dense] == [4096, 4096, 10]
    assert dense[0].input_shape == (256 * 2 * 2,)
    expected = (_conv_bias(64, 3, 3) + _conv_bias(192, 64, 3) + _conv_bias(384, 192, 3)
                + _conv_bias(256, 384, 3) + _conv_bias(256, 256, 3)
                + 1024 * 4096 + 4096 + 4096 * 4096 + 4096 + 4096 * 10 + 10)
    assert model.parameters_flat().size == expected
    x = np.random.default_rng(0).random((3, 3, 32, 32), dtype=np.float32)
    y = model.forward(x, training=True)
    assert y.shape == (3, 10) and np.all(np.isfinite(y))


@pytest.fixture
def numpy_kernels():
    """The NumPy kernels for one test: the model's assembly is what it checks (every
    layer's gradients are checked on both backends in tests/nn and tests/kernels), and the
    compiled backend would first compile its float64 kernels for this net, ~30 s."""
    previous = kernels.backend()
    kernels.set_backend("numpy")
    yield
    kernels.set_backend(previous)


def test_alexnet_cifar10_gradients_match_central_differences(numpy_kernels):
    # float64, inference mode (dropout is the identity): the derivative of sum(y * r) along
    # a random direction v, (L(p + eps v) - L(p - eps v)) / 2 eps, equals <dL/dp, v> from
    # backward: for all parameters at once (the flat buffer), then for the arrays of the
    # stride-2 convolution and of the three dense layers alone
    model = get_model("alexnet_cifar10", num_classes=5, dtype=np.float64, rng=0)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 3, 32, 32))
    r = rng.standard_normal((1, 5))

    def loss():
        return float(np.sum(model.forward(x, training=False) * r))

    model.forward(x, training=False)
    model.backward(r.copy())
    first_conv = next(l for l in model.walk() if isinstance(l, Conv2D))
    dense = [l for l in model.walk() if isinstance(l, Dense)]
    arrays = [(model.parameters_flat(), model.gradients_flat().copy(), "all")]
    arrays += [(l.params[k], l.grads[k].copy(), f"{l.name}/{k}")
               for l in (first_conv, *dense) for k in ("w", "b")]
    eps = 1e-8  # small: a step of all 23M parameters at once crosses ReLU kinks at 1e-6
    for p, grad, what in arrays:
        v = rng.standard_normal(p.shape)
        old = p.copy()
        p += eps * v
        fp = loss()
        p[...] = old - eps * v
        fm = loss()
        p[...] = old
        numeric = (fp - fm) / (2 * eps)
        assert numeric == pytest.approx(float(np.sum(grad * v)), rel=1e-5, abs=1e-8), what


@pytest.mark.parametrize("name,imagenet", [
    ("alexnet", "alexnet_imagenet"), ("vgg11", "vgg11_imagenet"),
    ("vgg16", "vgg16_imagenet"), ("vgg16bn", "vgg16bn_imagenet")])
def test_imagenet_sized_input_picks_the_imagenet_net(name, imagenet):
    assert zoo_name(name, (3, 32, 32)) == name
    assert zoo_name(name, (3, 227, 227)) == imagenet
    assert zoo_name(name, (3, IMAGENET_SIDE, IMAGENET_SIDE)) == imagenet
    assert zoo_name(name, (3, IMAGENET_SIDE - 1, 200)) == name
    assert zoo_name("resnet20", (3, 224, 224)) == "resnet20"  # one net per name: as named


def test_alexnet_at_227_is_the_imagenet_alexnet():
    model = get_model("alexnet", input_shape=(3, 227, 227), num_classes=1000, build=True)
    assert model.name == "alexnet_imagenet"
    dense = [l for l in model.walk() if isinstance(l, Dense)]
    # PyDTNN's (and Krizhevsky's) head: 256x6x6 -> 4096 -> 4096 -> 1000
    assert [l.input_shape[0] for l in dense] == [9216, 4096, 4096]
    assert model.parameters_flat().size == get_model("alexnet_imagenet", rng=0,
                                                     input_shape=(3, 227, 227)
                                                     ).parameters_flat().size
