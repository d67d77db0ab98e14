"""Weights files in PyDTNN's layout (``1_Conv2D_w``...): written and read through the
public ``Model.load_weights`` / ``save_pydtnn_weights``, in both array spellings and both
tensor formats PyDTNN writes, with clear errors on a mismatch."""
import numpy as np
import pytest

from distnn.models import get_model
from distnn.nn.pydtnn_weights import is_pydtnn_layout, pydtnn_arrays, save_pydtnn_weights


def _x(shape, n=3):
    return np.random.default_rng(0).random((n, *shape), dtype=np.float32)


@pytest.mark.parametrize("name,shape", [("simplecnn", (1, 28, 28)),
                                        ("alexnet_cifar10", (3, 32, 32)),
                                        ("vgg11bn", (3, 32, 32))])
def test_round_trip(tmp_path, name, shape):
    a = get_model(name, input_shape=shape, rng=1)
    b = get_model(name, input_shape=shape, rng=2)
    if name == "vgg11bn":  # non-trivial running statistics
        for layer in a.walk():
            for v in layer.buffers.values():
                v[...] = np.random.default_rng(3).random(v.shape)
    save_pydtnn_weights(a, tmp_path / "w.npz")
    with np.load(tmp_path / "w.npz") as data:
        keys = list(data.files)
    assert is_pydtnn_layout(keys) and keys[0] == "1_Conv2D_w"
    b.load_weights(tmp_path / "w.npz")
    x = _x(shape)
    np.testing.assert_array_equal(a.forward(x), b.forward(x))
    assert a.named_arrays().keys() == b.named_arrays().keys()
    for k, v in a.named_arrays().items():
        np.testing.assert_array_equal(v, b.named_arrays()[k])


def test_simplecnn_keys_count_layers_as_pydtnn_does():
    keys = list(pydtnn_arrays(get_model("simplecnn", rng=0)))
    # Input 0, Conv2D 1, Relu 2, Conv2D 3, Relu 4, MaxPool2D 5, Flatten 6, FC 7, Relu 8, FC 9
    assert keys == ["1_Conv2D_w", "1_Conv2D_b", "3_Conv2D_w", "3_Conv2D_b", "7_FC_w",
                    "7_FC_b", "9_FC_w", "9_FC_b"]


def test_later_spelling_and_nhwc_tensor_format(tmp_path):
    # keys <id>_<Type>_weights/_biases, convolution weights (ci, kh, kw, co) and the
    # first FC's rows in (H, W, C) order, as PyDTNN writes with --tensor_format nhwc
    a = get_model("simplecnn", rng=1)
    arrays = {}
    for key, value in pydtnn_arrays(a).items():
        key = key.replace("_w", "_weights").replace("_b", "_biases")
        if key.endswith("Conv2D_weights"):
            value = value.transpose(1, 2, 3, 0)
        if key == "7_FC_weights":
            value = value.reshape(8, 12, 12, 128).transpose(1, 2, 0, 3).reshape(value.shape)
        arrays[key] = value
    np.savez(tmp_path / "nhwc.npz", **arrays)
    b = get_model("simplecnn", rng=2)
    b.load_weights(tmp_path / "nhwc.npz")
    x = _x((1, 28, 28))
    np.testing.assert_allclose(a.forward(x), b.forward(x), rtol=1e-6, atol=1e-6)


def test_mismatches_are_clear_errors(tmp_path):
    save_pydtnn_weights(get_model("simplecnn", rng=1), tmp_path / "w.npz")
    with pytest.raises(ValueError, match=r"PyDTNN's layout\) holds the arrays of 4 layers"
                                         r".*'lenet' has 5 layers.*--model"):
        get_model("lenet", rng=0).load_weights(tmp_path / "w.npz")
    with pytest.raises(ValueError, match=r"1_Conv2D_w has shape \(4, 1, 3, 3\) but layer "
                                         r"'conv2d_0'.*expects \(4, 3, 3, 3\)"):
        get_model("simplecnn", input_shape=(3, 28, 28), rng=0).load_weights(tmp_path / "w.npz")
    arrays = dict(np.load(tmp_path / "w.npz"))
    arrays["1_FC_w"] = arrays.pop("1_Conv2D_w")
    arrays["1_FC_b"] = arrays.pop("1_Conv2D_b")
    np.savez(tmp_path / "fc.npz", **arrays)
    with pytest.raises(ValueError, match=r"1_FC is PyDTNN's FC but layer 'conv2d_0'.* "
                                         r"is a Conv2D"):
        get_model("simplecnn", rng=0).load_weights(tmp_path / "fc.npz")
    arrays = dict(np.load(tmp_path / "w.npz"))
    del arrays["3_Conv2D_b"]
    np.savez(tmp_path / "nob.npz", **arrays)
    with pytest.raises(ValueError, match=r"lacks 3_Conv2D_b"):
        get_model("simplecnn", rng=0).load_weights(tmp_path / "nob.npz")
