"""Transformer blocks, patches, class token, pooling and the padding mask: shapes, float64
gradient checks of dx and every parameter for every option, forward and backward parity
with torch.nn.TransformerEncoderLayer(norm_first=True, batch_first=True) from the same
weights, the decoder's cached decode, ONNX in onnxruntime and the torch export."""
import numpy as np
import pytest

from distnn.nn import (Dense, Embedding, LayerNormalization, PositionalEmbedding, Sequential,
                       TiedDense)
from distnn.nn.attention import KVCache
from distnn.nn.sequence import ClassToken, PaddingMask, Patchify, SequencePool
from distnn.nn.transformer import (FEED_FORWARD_ACTIVATIONS, TransformerDecoderBlock,
                                   TransformerEncoderBlock)
from gradcheck import check_layer, numerical_grad, rel_error
from parity import onnx_matches, torch_export_matches

N, T, E, H, F = 3, 5, 8, 2, 12


def built(layer, shape=(T, E), dtype=np.float64, seed=0, randomize=True):
    layer.build(shape, rng=np.random.default_rng(seed), dtype=dtype)
    if randomize:  # biases and norms away from 0 and 1
        rng = np.random.default_rng(seed + 100)
        for sub in layer.walk():
            for key, p in sub.params.items():
                p[...] = rng.standard_normal(p.shape) * (0.3 if key.startswith("w") else 0.5)
                if key == "gamma":
                    p += 1
    return layer


def data(*shape, seed=1):
    return np.random.default_rng(seed).standard_normal(shape)


def padding(n=N, t=T, seed=2):
    mask = np.random.default_rng(seed).random((n, t)) < 0.4
    mask[:, 0] = False  # every row keeps a key (torch gives NaN for an empty row)
    return mask


def generators(block):
    return [layer.rng for layer in block.walk() if getattr(layer, "rng", None) is not None]


def block_gradients(block, x, mask=None, reset=None, tol=1e-6):
    """Central differences of sum(y * r) against backward(r): dx and every sublayer's
    parameters (a block keeps none of its own)."""
    if reset:
        reset()
    y = block.forward(x, training=True, key_padding_mask=mask)
    r = np.random.default_rng(9).standard_normal(y.shape)
    dx = block.backward(r.copy())
    analytic = {(i, k): g.copy() for i, s in enumerate(block.walk()) for k, g in s.grads.items()}

    def loss():
        if reset:
            reset()
        return float(np.sum(block.forward(x, training=True, key_padding_mask=mask) * r))

    def error(got, want):  # bk's gradient is exactly 0 (softmax ignores q . bk)
        return (float(np.max(np.abs(got - want))) if np.max(np.abs(want)) < 1e-7
                else rel_error(got, want))

    errors = {"dx": error(dx, numerical_grad(loss, x))}
    errors.update({(i, k): error(analytic[i, k], numerical_grad(loss, p))
                   for i, s in enumerate(block.walk()) for k, p in s.params.items()})
    assert len(errors) == 1 + 16, list(errors)  # dx, 8 attention, 4 norm, 4 dense arrays
    bad = {k: e for k, e in errors.items() if not e < tol}
    assert not bad, bad


def test_shapes_sublayers_and_errors():
    block = built(TransformerEncoderBlock(H, F), dtype=np.float32, randomize=False)
    assert block.output_shape == (T, E) and not block.params
    names = [type(s).__name__ for s in block.sublayers()]
    assert names == ["LayerNormalization", "MultiHeadAttention", "Dropout",
                     "LayerNormalization", "Dense", "ReLU", "Dropout", "Dense", "Dropout"]
    x = data(2, 9, E).astype(np.float32)  # another length than the built one
    y = block.forward(x, training=True)
    assert y.shape == x.shape and y.dtype == np.float32
    assert block.backward(y).shape == x.shape
    model = Sequential([TransformerDecoderBlock(H, F), TransformerDecoderBlock(H, F)],
                       input_shape=(T, E), rng=0)
    assert model.parameters_flat().size == 2 * (4 * E * E + 4 * E + 4 * E + 2 * E * F + F + E)
    assert len({l.name for l in model.walk()}) == len(list(model.walk()))  # unique names
    with pytest.raises(ValueError, match="activation='tanh' is not known"):
        TransformerEncoderBlock(H, F, activation="tanh")
    with pytest.raises(ValueError, match="ff_dim"):
        TransformerEncoderBlock(H, 0)
    with pytest.raises(ValueError, match=r"\(length, embed\)"):
        built(TransformerEncoderBlock(H, F), (E,))


@pytest.mark.parametrize("activation", sorted(FEED_FORWARD_ACTIVATIONS))
def test_gradients_per_activation(activation):
    block_gradients(built(TransformerEncoderBlock(H, F, activation=activation)), data(N, T, E))


@pytest.mark.parametrize("cls,masked", [(TransformerEncoderBlock, True),
                                        (TransformerDecoderBlock, False),
                                        (TransformerDecoderBlock, True)])
def test_gradients_causal_and_masked(cls, masked):
    block_gradients(built(cls(H, F)), data(N, T, E), mask=padding() if masked else None)


@pytest.mark.parametrize("cls", [TransformerEncoderBlock, TransformerDecoderBlock])
def test_gradients_with_dropout(cls):
    block = built(cls(H, F, dropout=0.3))
    states = [g.bit_generator.state for g in generators(block)]
    assert len(states) == 4  # three dropouts and the attention's

    def reset():
        for g, s in zip(generators(block), states):
            g.bit_generator.state = s

    x = data(N, T, E)
    reset()
    assert not np.allclose(block.forward(x, training=True), block.forward(x, training=False))
    block_gradients(block, x, reset=reset)


def _torch_grads(block, module):
    """distnn key -> the same gradient from the torch.nn.TransformerEncoderLayer inside."""
    layer, e = module.layer, E
    attn, inw, inb = layer.self_attn, layer.self_attn.in_proj_weight.grad, \
        layer.self_attn.in_proj_bias.grad
    out = {}
    for i, k in enumerate("qkv"):
        out[f"{block.attn.name}/w{k}"] = inw[i * e:(i + 1) * e].T
        out[f"{block.attn.name}/b{k}"] = inb[i * e:(i + 1) * e]
    out[f"{block.attn.name}/wo"] = attn.out_proj.weight.grad.T
    out[f"{block.attn.name}/bo"] = attn.out_proj.bias.grad
    for mine, theirs in ((block.ln1, layer.norm1), (block.ln2, layer.norm2)):
        out[f"{mine.name}/gamma"], out[f"{mine.name}/beta"] = theirs.weight.grad, theirs.bias.grad
    for mine, theirs in ((block.ff1, layer.linear1), (block.ff2, layer.linear2)):
        out[f"{mine.name}/w"], out[f"{mine.name}/b"] = theirs.weight.grad.T, theirs.bias.grad
    return {k: v.numpy() for k, v in out.items()}


@pytest.mark.parametrize("cls,activation,masked", [
    (TransformerEncoderBlock, "relu", False), (TransformerEncoderBlock, "gelu", True),
    (TransformerEncoderBlock, "gelu_tanh", False), (TransformerEncoderBlock, "silu", True),
    (TransformerDecoderBlock, "gelu", False), (TransformerDecoderBlock, "relu", True)])
def test_matches_torch_encoder_layer(cls, activation, masked):
    torch = pytest.importorskip("torch")
    model = Sequential([cls(H, F, activation=activation)], input_shape=(T, E),
                       dtype=np.float64, rng=0)  # unique sublayer names
    block = built(model.layers[0])
    block.need_dx = True  # the first layer of a model computes no dx by default
    module = block.torch_module().double()
    assert isinstance(module.layer, torch.nn.TransformerEncoderLayer)
    assert module.layer.norm_first and module.layer.self_attn.batch_first
    x, mask = data(N, T, E), padding() if masked else None
    y = block.forward(x, training=True, key_padding_mask=mask)
    dy = data(N, T, E, seed=4)
    dx = block.backward(dy.copy())
    tx = torch.tensor(x, requires_grad=True)
    ty = module(tx, key_padding_mask=None if mask is None else torch.tensor(mask))
    ty.backward(torch.tensor(dy))
    tol = 1e-10
    np.testing.assert_allclose(y, ty.detach().numpy(), rtol=tol, atol=tol)
    np.testing.assert_allclose(dx, tx.grad.numpy(), rtol=tol, atol=tol)
    want = _torch_grads(block, module)
    got = {f"{s.name}/{k}": g for s in block.walk() for k, g in s.grads.items()}
    assert set(got) == set(want)
    for key in got:
        np.testing.assert_allclose(got[key], want[key], rtol=tol, atol=tol, err_msg=key)


def test_decoder_decode_equals_the_causal_forward():
    block = built(TransformerDecoderBlock(H, F, dropout=0.2))
    x = data(N, 7, E)
    whole = block.forward(x, training=False)
    cache = KVCache()
    parts = [block.decode(x[:, :3], cache)] + [block.decode(x[:, t:t + 1], cache)
                                               for t in range(3, 7)]
    assert cache.length == 7
    np.testing.assert_allclose(np.concatenate(parts, axis=1), whole, rtol=1e-12, atol=1e-12)


def test_patchify_class_token_and_pool_layers():
    patches = built(Patchify(2), (3, 4, 6))
    assert patches.output_shape == (6, 12)
    x = data(2, 3, 4, 6)
    y = patches.forward(x)
    # patch (row 1, col 2) is x[:, :, 2:4, 4:6], channel first
    np.testing.assert_array_equal(y[:, 1 * 3 + 2], x[:, :, 2:4, 4:6].reshape(2, 12))
    check_layer(patches, x)
    token = built(ClassToken(), (T, E))
    assert token.output_shape == (T + 1, E)
    check_layer(token, data(N, T, E))
    for mode in ("mean", "cls"):
        check_layer(built(SequencePool(mode), (T, E)), data(N, T, E))
    pool = built(SequencePool("mean"), (T, E))
    mask = padding()
    xs = data(N, T, E)
    y = pool.forward(xs, key_padding_mask=mask)
    np.testing.assert_allclose(y[1], xs[1][~mask[1]].mean(axis=0))
    r = data(N, E, seed=3)
    pool.backward(r)
    numeric = numerical_grad(lambda: float(np.sum(pool.forward(xs, key_padding_mask=mask) * r)),
                             xs)
    assert rel_error(pool.backward(r), numeric) < 1e-8
    with pytest.raises(ValueError, match="multiples of patch_size=5"):
        built(Patchify(5), (1, 28, 28))
    with pytest.raises(ValueError, match="mode must be"):
        SequencePool("max")


def _classifier(t=T, vocab=20):
    return Sequential([PaddingMask([Embedding(vocab, E, padding_idx=0),
                                    PositionalEmbedding(max_len=T),
                                    TransformerEncoderBlock(H, F, activation="gelu"),
                                    LayerNormalization(), SequencePool("mean")]),
                       Dense(3)], input_shape=(t,), dtype=np.float64, rng=0)


def test_padding_mask_hides_the_padding():
    model = _classifier()
    real = np.random.default_rng(5).integers(1, 20, (N, 3)).astype(np.float64)
    short = np.concatenate([real, np.zeros((N, 2))], axis=1)  # 2 padding tokens
    y = model.forward(short)
    # other padding content (another padding row in the embedding) changes nothing
    model.layers[0].layers[0].params["w"][0] = 5.0
    np.testing.assert_allclose(model.forward(short), y, rtol=1e-12)
    # and the same sequences unpadded, in a model of length 3 with the same weights
    unpadded = _classifier(t=3)
    unpadded.parameters_flat()[...] = model.parameters_flat()
    np.testing.assert_allclose(unpadded.forward(real), y, rtol=1e-10)


def test_padding_mask_gradients_and_default():
    model = _classifier()
    x = np.random.default_rng(6).integers(1, 20, (N, T)).astype(np.float64)
    x[0, 3:] = 0
    x[2, 1:] = 0
    r = data(N, 3, seed=8)
    model.forward(x, training=True)
    model.backward(r.copy())
    analytic = model.gradients_flat().copy()
    flat = model.parameters_flat()
    numeric = numerical_grad(lambda: float(np.sum(model.forward(x, training=True) * r)), flat)
    keep = np.ones(flat.size, bool)
    keep[:E] = False  # the padding row: read, not trained (as torch.nn.Embedding)
    assert rel_error(analytic[keep], numeric[keep]) < 1e-6
    np.testing.assert_array_equal(analytic[:E], 0)
    assert PaddingMask([Embedding(4, 2, padding_idx=3)]).padding_idx == 3
    with pytest.raises(ValueError, match="give padding_idx"):
        PaddingMask([Embedding(4, 2)])


def test_export_of_blocks_to_onnx_and_torch():
    pytest.importorskip("onnxruntime")
    pytest.importorskip("torch")
    emb = Embedding(13, E)
    gpt = Sequential([emb, PositionalEmbedding(), TransformerDecoderBlock(H, F),
                      TransformerDecoderBlock(H, F, activation="gelu_tanh"),
                      LayerNormalization(), TiedDense(emb)], input_shape=(T,),
                     dtype=np.float64, rng=0)
    vit = Sequential([Patchify(2), Dense(E), ClassToken(), PositionalEmbedding(),
                      TransformerEncoderBlock(H, F, activation="silu"), LayerNormalization(),
                      SequencePool("cls"), Dense(3)], input_shape=(1, 4, 4),
                     dtype=np.float64, rng=0)
    pooled = Sequential([TransformerEncoderBlock(H, F), SequencePool("mean")],
                        input_shape=(T, E), dtype=np.float64, rng=0)
    for model, x in ((gpt, np.random.default_rng(0).integers(0, 13, (N, T)).astype(float)),
                     (vit, data(N, 1, 4, 4)), (pooled, data(N, T, E))):
        for layer in model.walk():
            if isinstance(layer, ClassToken):
                layer.params["token"][...] = data(E, seed=3)
        torch_export_matches(model, x)
        onnx_matches(model, x, tol=1e-4)
    with pytest.raises(ValueError, match="PaddingMask"):
        _classifier().to_torch()

