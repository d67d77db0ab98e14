"""Dense, Flatten, Dropout, activations, Add/Concat blocks, Sequential flat buffers."""
import numpy as np
import pytest

from distnn.nn.activations import LeakyReLU, ReLU, Sigmoid, Softmax, Tanh
from distnn.nn.containers import Add, Concat, Sequential
from distnn.nn.core import Dense, Dropout, Flatten
from gradcheck import check_layer

pytestmark = pytest.mark.usefixtures("kernel_backend")

RNG = np.random.default_rng(0)


def built(layer, shape, dtype=np.float64, seed=0):
    layer.build(shape, rng=np.random.default_rng(seed), dtype=dtype)
    return layer


@pytest.mark.parametrize("use_bias", [True, False])
def test_dense_shape_and_grad(use_bias):
    layer = built(Dense(5, use_bias=use_bias), (7,))
    assert layer.output_shape == (5,)
    assert set(layer.params) == ({"w", "b"} if use_bias else {"w"})
    x = RNG.standard_normal((4, 7))
    assert layer.forward(x).shape == (4, 5)
    check_layer(layer, x)


def test_dense_needs_a_feature_axis():
    with pytest.raises(ValueError, match="feature axis"):
        built(Dense(3), ())


def test_wrong_input_shape_names_layer():
    layer = built(Dense(3, name="fc1"), (4,))
    with pytest.raises(ValueError, match="fc1.*expects input of shape"):
        layer.forward(np.zeros((2, 5)))


def test_flatten():
    layer = built(Flatten(), (2, 3, 4))
    x = RNG.standard_normal((5, 2, 3, 4))
    assert layer.forward(x).shape == (5, 24)
    check_layer(layer, x)


@pytest.mark.parametrize("cls", [ReLU, LeakyReLU, Sigmoid, Tanh, Softmax])
def test_activations_grad(cls):
    layer = built(cls(), (6,))
    x = RNG.standard_normal((3, 6))
    x[np.abs(x) < 1e-3] = 0.5  # keep away from the ReLU kink
    assert layer.forward(x).shape == x.shape
    check_layer(layer, x)


def test_activation_values():
    x = np.array([[-2.0, 0.5, 3.0]])
    np.testing.assert_allclose(built(ReLU(), (3,)).forward(x), [[0, 0.5, 3]])
    np.testing.assert_allclose(built(LeakyReLU(0.1), (3,)).forward(x), [[-0.2, 0.5, 3]])
    s = built(Sigmoid(), (3,)).forward(np.array([[-1000.0, 0.0, 1000.0]]))
    np.testing.assert_allclose(s, [[0, 0.5, 1]])
    p = built(Softmax(), (3,)).forward(x)
    np.testing.assert_allclose(p.sum(), 1.0)


def test_dropout_modes_and_grad():
    layer = built(Dropout(0.5, seed=3), (50,))
    x = RNG.standard_normal((8, 50))
    np.testing.assert_array_equal(layer.forward(x, training=False), x)
    y = layer.forward(x, training=True)
    zero = y == 0
    assert 0.3 < zero.mean() < 0.7
    np.testing.assert_allclose(y[~zero], 2 * x[~zero])
    # masks differ between samples of the batch
    assert not np.array_equal(zero[0], zero[1])
    state = layer.rng.bit_generator.state

    def reset():
        layer.rng.bit_generator.state = state

    check_layer(layer, x, training=True, reset=reset)
    check_layer(layer, x, training=False)


def test_add_block_grad():
    block = built(Add([Dense(4), Tanh()], []), (4,))
    x = RNG.standard_normal((3, 4))
    y = block.forward(x)
    np.testing.assert_allclose(y, x + np.tanh(x @ block.branches[0].layers[0].params["w"]
                                              + block.branches[0].layers[0].params["b"]))
    check_layer(block, x)


def test_concat_block_grad():
    block = built(Concat([], [Dense(2)], [Dense(3), Sigmoid()]), (4,))
    assert block.output_shape == (9,)
    x = RNG.standard_normal((3, 4))
    np.testing.assert_array_equal(block.forward(x)[:, :4], x)
    check_layer(block, x)


def test_add_rejects_mismatched_branches():
    with pytest.raises(ValueError, match="branch output shapes differ"):
        built(Add([Dense(3)], []), (4,))


def _mlp(seed=0, dtype=np.float64):
    return Sequential([Flatten(), Dense(6), ReLU(), Add([Dense(6), Tanh()], []), Dense(3)],
                      input_shape=(2, 4), dtype=dtype, rng=seed)


def test_flat_buffers_are_views():
    model = _mlp()
    flat = model.parameters_flat()
    assert flat.flags.c_contiguous and flat.size == sum(
        p.size for l in model.walk() for p in l.params.values())
    for layer in model.walk():
        for k, p in layer.params.items():
            assert np.shares_memory(p, flat)
            assert np.shares_memory(layer.grads[k], model.gradients_flat())
    x = RNG.standard_normal((5, 2, 4))
    before = model.forward(x)
    flat *= 0.5  # mutate in place -> the model computes something else
    after = model.forward(x)
    assert not np.allclose(before, after)
    flat[...] = 0
    np.testing.assert_array_equal(model.forward(x), 0)


def test_all_gradients_land_in_flat_buffer():
    model = _mlp()
    x = RNG.standard_normal((5, 2, 4))
    model.gradients_flat()[...] = np.nan
    y = model.forward(x, training=True)
    model.backward(np.ones_like(y))
    g = model.gradients_flat()
    assert np.all(np.isfinite(g)) and np.any(g != 0)
    # central difference on a few entries of the flat buffer
    p = model.parameters_flat()
    for i in RNG.choice(p.size, 8, replace=False):
        old = p[i]
        p[i] = old + 1e-6
        fp = model.forward(x).sum()
        p[i] = old - 1e-6
        fm = model.forward(x).sum()
        p[i] = old
        assert abs((fp - fm) / 2e-6 - g[i]) < 1e-6 * max(1, abs(g[i]))


def test_grad_hooks_in_backward_order_and_layer_ranges():
    model = _mlp()
    seen = []
    model.grad_hooks.append(lambda layer: seen.append(layer.name))
    y = model.forward(RNG.standard_normal((2, 2, 4)), training=True)
    model.backward(np.ones_like(y))
    ranges = model.layer_ranges()
    assert seen == [layer.name for layer, _, _ in reversed(ranges)]
    assert ranges[0][1] == 0 and ranges[-1][2] == model.parameters_flat().size
    assert all(a[2] == b[1] for a, b in zip(ranges, ranges[1:]))


def test_names_deterministic_and_float32():
    a, b = _mlp(dtype=np.float32), _mlp(dtype=np.float32)
    assert list(a.named_arrays()) == list(b.named_arrays())
    assert a.parameters_flat().dtype == np.float32
    y = a.forward(RNG.standard_normal((2, 2, 4)))
    assert y.dtype == np.float32


def test_save_load_roundtrip_and_mismatch(tmp_path):
    a, b = _mlp(seed=1), _mlp(seed=2)
    path = tmp_path / "w.npz"
    a.save_weights(path)
    b.load_weights(path)
    np.testing.assert_array_equal(a.parameters_flat(), b.parameters_flat())
    other = Sequential([Flatten(), Dense(7), ReLU(), Add([Dense(7), Tanh()], []), Dense(3)],
                       input_shape=(2, 4), dtype=np.float64)
    with pytest.raises(ValueError, match="dense_0/w.*shape"):
        other.load_weights(path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        a.load_weights(tmp_path / "missing.npz")
    (tmp_path / "bad.npz").write_bytes(b"garbage")
    with pytest.raises(ValueError, match="bad.npz' is truncated or corrupt"):
        a.load_weights(tmp_path / "bad.npz")


def test_summary_table():
    text = _mlp().summary()
    assert "dense_0" in text and "Total parameters" in text and "#Params" in text


def test_reuse_freed_memory_toggles_on_glibc():
    import sys

    from distnn.nn import reuse_freed_memory
    expected = sys.platform.startswith("linux")
    assert reuse_freed_memory(False) is expected
    assert reuse_freed_memory(True) is expected
