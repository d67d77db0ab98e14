"""Embedding, learned and sinusoidal positions, the tied output projection: shapes, gradient
checks, torch parity, ONNX in onnxruntime, and the errors on bad ids and long sequences."""
import numpy as np
import pytest

from distnn.nn import (Dense, Embedding, LayerNormalization, PositionalEmbedding, Sequential,
                       SinusoidalPositionalEmbedding, TiedDense)
from distnn.nn.embedding import sinusoids
from gradcheck import check_layer, numerical_grad, rel_error
from parity import onnx_matches, same, torch_export_matches, torch_parity

RNG = np.random.default_rng(0)
V, D, T = 11, 6, 5


def built(layer, shape, dtype=np.float64, seed=0):
    layer.build(shape, rng=np.random.default_rng(seed), dtype=dtype)
    return layer


def ids(n=3, t=T, vocab=V, seed=1):
    return np.random.default_rng(seed).integers(0, vocab, (n, t)).astype(np.float64)


@pytest.mark.parametrize("padding_idx", [None, 3])
def test_embedding_shape_rows_and_grad(padding_idx):
    layer = built(Embedding(V, D, padding_idx=padding_idx), (T,))
    assert layer.output_shape == (T, D) and layer.params["w"].shape == (V, D)
    x = ids()
    x[0, :2] = 3  # the padding id (when set) and a repeated id
    y = layer.forward(x)
    assert y.shape == (3, T, D)
    np.testing.assert_array_equal(y[1, 2], layer.params["w"][int(x[1, 2])])
    if padding_idx is not None:
        np.testing.assert_array_equal(layer.params["w"][padding_idx], 0)
    if padding_idx is None:
        errors = check_layer(layer, x)
        assert "dx" not in errors and set(errors) == {"w"}
    else:  # the padding row is read but, by definition, gets no gradient (as in torch)
        r = np.random.default_rng(2).standard_normal(y.shape)
        layer.forward(x, training=True)
        layer.backward(r.copy())
        numeric = numerical_grad(lambda: float(np.sum(layer.forward(x) * r)),
                                 layer.params["w"])
        keep = np.arange(V) != padding_idx
        assert rel_error(layer.grads["w"][keep], numeric[keep]) < 1e-7
        assert np.any(numeric[padding_idx] != 0)
    layer.forward(x)
    assert layer.backward(np.ones_like(y)) is None
    if padding_idx is not None:
        np.testing.assert_array_equal(layer.grads["w"][padding_idx], 0)
    # the gradient of a row is the sum over the tokens that read it
    np.testing.assert_allclose(layer.grads["w"][int(x[2, 0])].sum(),
                               D * np.sum(x == x[2, 0]) * (x[2, 0] != padding_idx))


@pytest.mark.parametrize("padding_idx", [None, 0])
def test_embedding_matches_torch(padding_idx):
    torch = pytest.importorskip("torch")
    layer = built(Embedding(V, D, padding_idx=padding_idx), (T,))
    module = torch.nn.Embedding(V, D, padding_idx=padding_idx)
    module.weight.data = torch.tensor(layer.params["w"])
    x = ids()
    x[:, 0] = 0
    torch_parity(layer, x, {"w": ("weight", same)}, module=module, ids=True)
    torch_parity(layer, x, {"w": ("weight", same)}, ids=True)  # its own torch_module()


def test_embedding_integer_input_and_other_ranks():
    layer = built(Embedding(V, D), (2, 3))
    x = RNG.integers(0, V, (4, 2, 3))
    assert layer.forward(x).shape == (4, 2, 3, D)
    shorter = built(Embedding(V, D), (T,)).forward(ids(t=2))  # any sequence length
    assert shorter.shape == (3, 2, D)


@pytest.mark.parametrize("bad,match", [(V, rf"token id {V} is outside its vocabulary of {V}"),
                                       (-1, "token id -1 is outside"),
                                       (2.5, "whole numbers.*2.5")])
def test_embedding_bad_ids_name_the_layer_and_value(bad, match):
    layer = built(Embedding(V, D, name="tok"), (T,))
    x = ids()
    x[1, 3] = bad
    with pytest.raises(ValueError, match=f"'tok'.*{match}"):
        layer.forward(x)


def test_embedding_argument_errors():
    with pytest.raises(ValueError, match="padding_idx"):
        Embedding(4, 2, padding_idx=4)
    with pytest.raises(ValueError, match="vocab_size"):
        Embedding(0, 2)


def test_positional_embedding_shape_grad_and_lengths():
    layer = built(PositionalEmbedding(), (T, D))
    assert layer.max_len == T and layer.params["w"].shape == (T, D)
    x = RNG.standard_normal((3, T, D))
    np.testing.assert_allclose(layer.forward(x), x + layer.params["w"])
    check_layer(layer, x)
    long = built(PositionalEmbedding(max_len=9), (T, D))
    assert long.params["w"].shape == (9, D)
    check_layer(long, x)
    short = RNG.standard_normal((2, 3, D))  # a shorter sequence uses the first positions
    np.testing.assert_allclose(long.forward(short), short + long.params["w"][:3])
    long.backward(np.ones_like(short))
    np.testing.assert_array_equal(long.grads["w"][3:], 0)
    np.testing.assert_allclose(long.grads["w"][:3], 2)


def test_positions_refuse_a_longer_sequence():
    for layer in (PositionalEmbedding(name="pos"), SinusoidalPositionalEmbedding(name="pos")):
        built(layer, (T, D))
        with pytest.raises(ValueError, match=rf"'pos' holds {T} positions but got a sequence "
                                             rf"of {T + 1}; crop the sequences to {T}"):
            layer.forward(np.zeros((1, T + 1, D)))
    with pytest.raises(ValueError, match="holds 3 positions"):
        built(PositionalEmbedding(max_len=3), (T, D))
    with pytest.raises(ValueError, match=r"needs per-sample input \(T, dim\)"):
        built(PositionalEmbedding(), (D,))


def test_sinusoidal_positions():
    table = sinusoids(7, 6)
    t, i = 5, 2  # column 2i is sin(t / 10000**(2i/d)), column 2i+1 its cos
    np.testing.assert_allclose(table[t, 2 * i], np.sin(t / 10000 ** (2 * i / 6)))
    np.testing.assert_allclose(table[t, 2 * i + 1], np.cos(t / 10000 ** (2 * i / 6)))
    assert sinusoids(4, 5).shape == (4, 5)  # odd widths end on a sine
    layer = built(SinusoidalPositionalEmbedding(), (T, D))
    assert not layer.params
    x = RNG.standard_normal((2, T, D))
    np.testing.assert_allclose(layer.forward(x), x + sinusoids(T, D))
    check_layer(layer, x)


def _tied_model(use_bias, padding_idx=None, dtype=np.float64):
    emb = Embedding(V, D, padding_idx=padding_idx)
    return emb, Sequential([emb, PositionalEmbedding(), Dense(D), LayerNormalization(),
                            TiedDense(emb, use_bias=use_bias)], input_shape=(T,), dtype=dtype,
                           rng=0)


@pytest.mark.parametrize("use_bias,padding_idx", [(False, None), (True, None), (False, 2)])
def test_tied_embedding_gradient_in_one_buffer_entry(use_bias, padding_idx):
    emb, model = _tied_model(use_bias, padding_idx)
    tied = model.layers[-1]
    assert model.output_shape == (T, V)
    assert set(tied.params) == ({"b"} if use_bias else set())
    # the weight lives once in the flat buffer
    assert model.parameters_flat().size == (V * D + T * D + D * D + D + 2 * D
                                            + (V if use_bias else 0))
    r = np.random.default_rng(7).standard_normal((3, T, V))
    flat = model.parameters_flat()
    x = ids()
    x[x == 2] = 4  # no padding token: every entry, the padding row's through the head
    for padded in (False, True) if padding_idx is not None else (False,):
        if padded:  # the padding row is read but the lookup does not train it
            x[0, :2] = padding_idx

        def loss():
            return float(np.sum(model.forward(x, training=True) * r))

        y = model.forward(x, training=True)
        assert y.shape == (3, T, V)
        model.backward(r.copy())
        analytic = model.gradients_flat().copy()
        keep = np.ones(flat.size, bool)
        if padded:
            keep[padding_idx * D:(padding_idx + 1) * D] = False  # w is first in the buffer
        assert rel_error(analytic[keep], numerical_grad(loss, flat)[keep]) < 1e-7
    # the input and output parts both reach w's gradient
    model.forward(x, training=True)
    model.backward(r.copy())
    np.testing.assert_allclose(model.gradients_flat(), analytic)  # overwritten, not summed


def test_tied_dense_checks():
    emb = Embedding(V, D)
    with pytest.raises(ValueError, match="not built"):
        built(TiedDense(emb), (T, D))
    built(emb, (T,))
    with pytest.raises(ValueError, match=f"width {D}"):
        built(TiedDense(emb), (T, D + 1))
    with pytest.raises(ValueError, match="must be an Embedding"):
        TiedDense(Dense(3))


def test_tied_model_to_torch_and_onnx():
    pytest.importorskip("torch")
    pytest.importorskip("onnxruntime")
    _, model = _tied_model(True, padding_idx=1)
    seq = Sequential([Embedding(V, D), SinusoidalPositionalEmbedding()], input_shape=(T,),
                     dtype=np.float64, rng=0)
    for m in (model, seq):
        x = ids(n=4)
        torch_export_matches(m, x)
        ops = onnx_matches(m, x)
        assert "Gather" in ops
    # one weight initializer for the embedding and the output projection
    from distnn.nn.onnx_export import onnx_model
    proto = onnx_model(model)
    assert [t.name for t in proto.graph.initializer].count("embedding_0/w") == 1
    assert "Transpose" in [n.op_type for n in proto.graph.node]


def test_embedding_from_onnx_reads_the_gather_back():
    pytest.importorskip("onnx")
    from distnn.models.onnx_import import _attrs, _Graph
    from distnn.nn.onnx_export import onnx_model
    model = Sequential([Embedding(V, D), LayerNormalization()], input_shape=(T,), rng=0)
    g = _Graph(onnx_model(model), "tokens.onnx")
    gather = next(n for n in g.nodes if n.op_type == "Gather")
    assert gather.op_type in Embedding.onnx_ops
    layer, arrays = Embedding.from_onnx(g, gather, _attrs(gather))
    assert (layer.vocab_size, layer.dim) == (V, D)
    np.testing.assert_array_equal(arrays["w"], model.layers[0].params["w"])
