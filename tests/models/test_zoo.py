"""Model zoo: every builder builds, runs forward/backward, and has the parameter count of
the reference architecture (torchvision's counts for the ImageNet models)."""
import numpy as np
import pytest

from distnn.models import MODELS, get_model
from distnn.nn import Add, BatchNormalization, Concat

SMALL = {  # name: (input shape, parameter count)
    "simplemlp": ((1, 28, 28), 784 * 512 + 512 + 2 * (512 * 512 + 512) + 5130),
    "simplecnn": ((1, 28, 28), 149_210),
    "simplecnn_pydtnn": ((1, 28, 28), 202_458),  # PyDTNN 3.11's own definition
    "lenet": ((1, 28, 28), 61_706),
    "resnet20": ((3, 32, 32), None),
    "vgg11bn": ((3, 32, 32), None),
    "alexnet_cifar": ((3, 32, 32), None),
}


@pytest.mark.parametrize("name", sorted(SMALL))
def test_small_models_forward_backward(name):
    shape, count = SMALL[name]
    model = get_model(name, input_shape=shape, rng=0)
    if count is not None:
        assert model.parameters_flat().size == count
    x = np.random.default_rng(0).random((2,) + shape, dtype=np.float32)
    y = model.forward(x, training=True)
    assert y.shape == (2, 10) and y.dtype == np.float32 and np.all(np.isfinite(y))
    model.backward(np.ones_like(y))
    assert np.any(model.gradients_flat() != 0)


@pytest.mark.parametrize("name,count", [
    ("resnet18", 11_689_512), ("resnet34", 21_797_672), ("resnet50", 25_557_032),
    ("densenet121", 7_978_856), ("vgg11_imagenet", 132_863_336),
])
def test_imagenet_models_match_torchvision_parameter_counts(name, count):
    model = get_model(name, rng=0)
    assert model.parameters_flat().size == count
    assert model.output_shape == (1000,)


def test_resnet_uses_add_blocks_and_densenet_concat_blocks():
    r = get_model("resnet20", rng=0)
    assert sum(isinstance(l, Add) for l in r.walk()) == 9
    assert sum(isinstance(l, BatchNormalization) for l in r.walk()) == 19 + 2
    d = get_model("densenet121", build=False)
    assert sum(isinstance(l, Concat) for l in d.walk()) == 6 + 12 + 24 + 16


def test_cifar_resnet_depths_and_errors():
    for depth in (20, 32, 56):
        model = get_model(f"resnet{depth}", rng=0)
        convs = [l for l in model.walk() if type(l).__name__ == "Conv2D"]
        # 6n+1 convolutions on the main path plus 2 projection shortcuts, then the FC
        assert len(convs) == depth - 1 + 2
    with pytest.raises(ValueError, match="not in the zoo"):
        get_model("resnet21")


def test_vgg_depths():
    for depth, convs in ((11, 8), (13, 10), (16, 13), (19, 16)):
        model = get_model(f"vgg{depth}", build=False)
        assert sum(type(l).__name__ == "Conv2D" for l in model.walk()) == convs


def test_every_registered_name_builds_unbuilt():
    for name in MODELS:
        assert get_model(name, build=False).layers
