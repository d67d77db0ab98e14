"""MultiHeadAttention: shapes, float64 central-difference gradients of the input(s) and
every parameter for every option (causal, bias, key padding, dropout, cross-attention with
dmemory, kdim/vdim), parity with torch's nn.MultiheadAttention and
F.scaled_dot_product_attention (forward and backward), the ONNX graph in onnxruntime, and
the key/value-cache decode against the whole causal forward."""
from __future__ import annotations

import numpy as np
import pytest

from distnn.nn import MultiHeadAttention
from distnn.nn.attention import KVCache
from gradcheck import numerical_grad, rel_error

pytestmark = pytest.mark.usefixtures("kernel_backend")

N, T, E, H = 2, 5, 8, 2


def built(layer, shape=(T, E), dtype=np.float64, seed=0, randomize=True):
    layer.build(shape, rng=np.random.default_rng(seed), dtype=dtype)
    if randomize:  # non-zero biases, weights away from the initializer's symmetry
        rng = np.random.default_rng(seed + 100)
        for p in layer.params.values():
            p[...] = rng.standard_normal(p.shape) * 0.5
    return layer


def data(*shape, seed=1, dtype=np.float64):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def padding(n, t, seed=2):
    mask = np.random.default_rng(seed).random((n, t)) < 0.4
    mask[:, 0] = False  # a key left in every row (torch gives NaN for an empty row)
    return mask


def check_gradients(layer, inputs, run, back, reset=None, tol=1e-6):
    """d(sum(y * r))/d(each input, each param) by central differences against back(r)."""
    if reset:
        reset()
    y = run()
    r = np.random.default_rng(7).standard_normal(y.shape)
    dins = back(r.copy())
    analytic = {k: g.copy() for k, g in layer.grads.items()}

    def loss():
        if reset:
            reset()
        return float(np.sum(run() * r))

    def error(got, want):
        # bk's gradient is exactly 0 (q . bk is the same for every key of a row, and
        # softmax ignores a constant): compare absolutely where the truth is ~0
        if np.max(np.abs(want)) < 1e-7:
            return float(np.max(np.abs(got - want)))
        return rel_error(got, want)

    errors = {f"d{i}": error(d, numerical_grad(loss, a))
              for i, (a, d) in enumerate(zip(inputs, dins))}
    errors.update({k: error(analytic[k], numerical_grad(loss, p))
                   for k, p in layer.params.items()})
    bad = {k: e for k, e in errors.items() if not e < tol}
    assert not bad, bad
    return errors


def test_shapes_params_and_declarations():
    layer = built(MultiHeadAttention(H, causal=True), dtype=np.float32, randomize=False)
    assert layer.output_shape == (T, E)
    assert set(layer.params) == {"wq", "wk", "wv", "wo", "bq", "bk", "bv", "bo"}
    assert all(layer.grads[k].shape == p.shape for k, p in layer.params.items())
    assert layer.params["wq"].shape == (E, E) and layer.params["bo"].shape == (E,)
    x = data(3, 11, E, dtype=np.float32)  # another length than the built one
    y = layer.forward(x, training=True)
    assert y.shape == x.shape and y.dtype == np.float32
    assert layer.backward(y).shape == x.shape
    assert set(built(MultiHeadAttention(H, use_bias=False)).params) == {"wq", "wk", "wv",
                                                                      "wo"}
    cross = built(MultiHeadAttention(H, kdim=3, vdim=6))
    assert cross.params["wk"].shape == (3, E) and cross.params["wv"].shape == (6, E)
    assert all(MultiHeadAttention.declares(w) for w in ("onnx_node", "torch_module"))
    with pytest.raises(ValueError, match="not a multiple of num_heads=3"):
        built(MultiHeadAttention(3))
    with pytest.raises(ValueError, match=r"expects x of shape \(batch, length, 8\)"):
        layer.forward(data(2, 4, 5))


@pytest.mark.parametrize("padded", [False, True], ids=["dense", "padded"])
@pytest.mark.parametrize("use_bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_self_attention_gradients(causal, use_bias, padded):
    layer = built(MultiHeadAttention(H, causal=causal, use_bias=use_bias))
    x = data(N, T, E)
    mask = padding(N, T) if padded else None
    check_gradients(layer, [x], lambda: layer.forward(x, True, key_padding_mask=mask),
                    lambda dy: [layer.backward(dy)])


@pytest.mark.parametrize("option", ["plain", "causal", "padded", "kdim", "value", "nobias"])
def test_cross_attention_gradients_include_dmemory(option):
    kdim = 3 if option in ("kdim", "value") else None
    vdim = 6 if option == "value" else None
    layer = built(MultiHeadAttention(H, causal=option == "causal", kdim=kdim, vdim=vdim,
                                     use_bias=option != "nobias"))
    x = data(N, 4, E)
    memory = data(N, 7, kdim or E, seed=3)
    mask = padding(N, 7) if option == "padded" else None
    inputs = [x, memory]
    value = None
    if option == "value":
        value = data(N, 7, 6, seed=4)
        inputs.append(value)
    errors = check_gradients(
        layer, inputs,
        lambda: layer.attend(x, memory, True, key_padding_mask=mask, value=value),
        layer.attend_backward)
    assert len([k for k in errors if k.startswith("d")]) == len(inputs)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_attention_dropout_gradients_and_evaluation(causal):
    layer = built(MultiHeadAttention(H, causal=causal, dropout=0.3, seed=5))
    x = data(N, T, E)

    def reset():
        layer.rng = np.random.default_rng(5)

    check_gradients(layer, [x], lambda: layer.forward(x, True), lambda dy: [layer.backward(dy)],
                    reset=reset)
    plain = built(MultiHeadAttention(H, causal=causal))
    assert np.allclose(layer.forward(x, False), plain.forward(x, False), atol=1e-14)
    reset()
    dropped = layer.forward(x, True)
    assert not np.allclose(dropped, plain.forward(x, False))


def _torch_mha(layer):
    return layer.torch_module().double()


def _torch_grads(module):
    """distnn's parameter layout from torch's gradients."""
    m = module.mha
    if m._qkv_same_embed_dim:
        wq, wk, wv = (w.T for w in m.in_proj_weight.grad.numpy().reshape(3, E, -1))
    else:
        wq, wk, wv = (getattr(m, f"{c}_proj_weight").grad.numpy().T for c in "qkv")
    out = {"wq": wq, "wk": wk, "wv": wv, "wo": m.out_proj.weight.grad.numpy().T}
    if m.in_proj_bias is not None:
        out.update(zip(("bq", "bk", "bv"), m.in_proj_bias.grad.numpy().reshape(3, E)))
        out["bo"] = m.out_proj.bias.grad.numpy()
    return out


@pytest.mark.parametrize("padded", [False, True], ids=["dense", "padded"])
@pytest.mark.parametrize("use_bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_self_attention_matches_torch_multihead_attention(causal, use_bias, padded):
    torch = pytest.importorskip("torch")
    layer = built(MultiHeadAttention(H, causal=causal, use_bias=use_bias), (9, E))
    x = data(3, 9, E)
    dy = data(3, 9, E, seed=9)
    mask = padding(3, 9) if padded else None
    y = layer.forward(x, True, key_padding_mask=mask)
    dx = layer.backward(dy)
    module = _torch_mha(layer)
    tx = torch.tensor(x, requires_grad=True)
    ty = module(tx, key_padding_mask=None if mask is None else torch.tensor(mask))
    ty.backward(torch.tensor(dy))
    np.testing.assert_allclose(y, ty.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(dx, tx.grad.numpy(), rtol=1e-9, atol=1e-12)
    for k, g in _torch_grads(module).items():
        np.testing.assert_allclose(layer.grads[k], g, rtol=1e-9, atol=1e-12, err_msg=k)


@pytest.mark.parametrize("kdim", [None, 3], ids=["same", "kdim"])
def test_cross_attention_matches_torch_multihead_attention(kdim):
    torch = pytest.importorskip("torch")
    layer = built(MultiHeadAttention(H, kdim=kdim))
    x, memory = data(N, 4, E), data(N, 7, kdim or E, seed=3)
    mask, dy = padding(N, 7), data(N, 4, E, seed=8)
    y = layer.attend(x, memory, True, key_padding_mask=mask)
    dx, dmem = layer.attend_backward(dy)
    module = _torch_mha(layer)
    tx, tm = (torch.tensor(a, requires_grad=True) for a in (x, memory))
    ty = module.mha(tx, tm, tm, key_padding_mask=torch.tensor(mask), need_weights=False)[0]
    ty.backward(torch.tensor(dy))
    np.testing.assert_allclose(y, ty.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(dx, tx.grad.numpy(), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(dmem, tm.grad.numpy(), rtol=1e-9, atol=1e-12)
    for k, g in _torch_grads(module).items():
        np.testing.assert_allclose(layer.grads[k], g, rtol=1e-9, atol=1e-12, err_msg=k)


def test_matches_projections_around_torch_sdpa():
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    layer = built(MultiHeadAttention(H, causal=True), (6, E))
    x = data(N, 6, E)
    p = {k: torch.tensor(a, requires_grad=True) for k, a in layer.params.items()}
    tx = torch.tensor(x, requires_grad=True)

    def heads(t):
        return t.reshape(N, 6, H, E // H).transpose(1, 2)

    q, k, v = (heads(tx @ p["w" + c] + p["b" + c]) for c in "qkv")
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    ty = o.transpose(1, 2).reshape(N, 6, E) @ p["wo"] + p["bo"]
    dy = data(N, 6, E, seed=4)
    ty.backward(torch.tensor(dy))
    np.testing.assert_allclose(layer.forward(x, True), ty.detach().numpy(), atol=1e-12)
    np.testing.assert_allclose(layer.backward(dy), tx.grad.numpy(), atol=1e-12)
    for key, t in p.items():
        np.testing.assert_allclose(layer.grads[key], t.grad.numpy(), atol=1e-12, err_msg=key)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_onnx_graph_in_onnxruntime_equals_forward(causal):
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    from onnx import TensorProto, checker, helper, numpy_helper

    from distnn.nn.onnx_export import OPSET, _Graph
    layer = built(MultiHeadAttention(H, causal=causal), (6, E), dtype=np.float32)
    g = _Graph(helper, numpy_helper)
    out = layer.onnx_node(g, "input")
    graph = helper.make_graph(
        g.nodes, "mha", [helper.make_tensor_value_info("input", TensorProto.FLOAT,
                                                       ["batch", 6, E])],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, ["batch", 6, E])],
        initializer=g.inits)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    proto.ir_version = min(proto.ir_version, 8)
    checker.check_model(proto)
    ops = {n.op_type for n in proto.graph.node}
    assert ops <= {"MatMul", "Add", "Mul", "Reshape", "Transpose", "Softmax"}
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    x = data(3, 6, E, dtype=np.float32)
    (y,) = sess.run(None, {"input": x})
    np.testing.assert_allclose(y, layer.forward(x, False), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("chunks", [[1] * 9, [3, 1, 1, 2, 2], [9]], ids=["1x9", "mixed", "all"])
def test_decode_with_the_cache_equals_the_whole_causal_forward(chunks):
    layer = built(MultiHeadAttention(H, causal=True), (9, E))
    x = data(N, 9, E)
    whole = layer.forward(x, False)
    cache, outs, start = KVCache(), [], 0
    for c in chunks:
        outs.append(layer.decode(x[:, start:start + c], cache))
        start += c
        assert cache.length == start and cache.k.shape == (N, H, start, E // H)
    np.testing.assert_allclose(np.concatenate(outs, axis=1), whole, rtol=1e-12, atol=1e-13)


def test_decode_refuses_a_non_causal_layer_and_a_mismatched_cache():
    layer = built(MultiHeadAttention(H))
    with pytest.raises(ValueError, match="causal=True"):
        layer.decode(data(N, 1, E), KVCache())
    causal = built(MultiHeadAttention(H, causal=True))
    cache = KVCache()
    causal.decode(data(N, 2, E), cache)
    with pytest.raises(ValueError, match="one cache per sequence batch"):
        causal.decode(data(N + 1, 1, E), cache)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_the_torch_module_traces_to_torchscript(causal):
    """save_torch traces the exported modules (torch.jit.trace with its check run)."""
    torch = pytest.importorskip("torch")
    import warnings
    layer = built(MultiHeadAttention(H, causal=causal), (6, E), dtype=np.float32)
    module = torch.nn.Sequential(layer.torch_module()).float().eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TorchScript's deprecation notice
        traced = torch.jit.trace(module, torch.zeros(2, 6, E))
    x = data(3, 6, E, dtype=np.float32)
    np.testing.assert_allclose(traced(torch.tensor(x)).detach().numpy(), layer.forward(x),
                               rtol=1e-5, atol=1e-5)
