"""ONNX import of a ``torch.nn.TransformerEncoder`` written by ``torch.onnx.export``
(opset 17, batch first): each attention subgraph becomes one ``MultiHeadAttention``, the
residuals ``Add`` blocks, the norms ``LayerNormalization``; the imported model predicts
what torch predicts (float32), its gradients are torch's (float64) and a step of
gradient descent on them lowers a loss."""
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
torch = pytest.importorskip("torch")

from distnn.models.onnx_import import ModelFileError, load_onnx_model  # noqa: E402
from distnn.nn import Add, LayerNormalization, MultiHeadAttention  # noqa: E402

N, T, E, H, FF = 3, 5, 16, 2, 32


def _encoder(norm_first: bool, layers: int = 2, seed: int = 0):
    torch.manual_seed(seed)
    layer = torch.nn.TransformerEncoderLayer(E, H, FF, dropout=0.0, batch_first=True,
                                             norm_first=norm_first)
    enc = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False).eval()
    with torch.no_grad():  # torch starts the biases at 0 and the norms at 1: move them
        for p in enc.parameters():
            p.add_(0.2 * torch.randn_like(p))
    return enc


def _export(module, path, dynamo=False):
    torch.onnx.export(module, (torch.zeros(N, T, E),), str(path), opset_version=17,
                      dynamo=dynamo)
    return str(path)


@pytest.fixture(scope="module", params=[False, True], ids=["post-LN", "pre-LN"])
def exported(request, tmp_path_factory):
    torch.set_num_threads(1)
    enc = _encoder(request.param)
    return enc, _export(enc, tmp_path_factory.mktemp("enc") / "encoder.onnx")


def _x(dtype=np.float32):
    return np.random.default_rng(1).standard_normal((N, T, E)).astype(dtype)


def test_the_encoder_imports_as_attention_and_predicts_as_torch(exported):
    enc, path = exported
    model = load_onnx_model(path, input_shape=(T, E))
    mhas = [l for l in model.walk() if isinstance(l, MultiHeadAttention)]
    assert [m.num_heads for m in mhas] == [H, H] and not any(m.causal for m in mhas)
    assert sum(isinstance(l, Add) for l in model.layers) == 4  # two residuals a layer
    assert sum(isinstance(l, LayerNormalization) for l in model.walk()) == 4
    assert model.parameters_flat().size == sum(p.numel() for p in enc.parameters())
    with torch.inference_mode():
        want = enc(torch.from_numpy(_x())).numpy()
    got = model.predict(_x())
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-6)


def test_gradients_are_torchs_and_a_step_lowers_the_loss(exported):
    enc, path = exported
    model = load_onnx_model(path, input_shape=(T, E), dtype=np.float64)
    ref = _encoder(enc.layers[0].norm_first).double()
    x = _x(np.float64)
    target = np.random.default_rng(2).standard_normal((N, T, E))

    def loss_and_dy(y):
        return float(np.mean((y - target) ** 2)), 2 * (y - target) / y.size

    y = model.forward(x, training=True)
    loss, dy = loss_and_dy(y)
    dx = model.backward(dy)
    xt = torch.from_numpy(x).requires_grad_()
    yt = ref(xt)
    yt.backward(torch.from_numpy(dy))
    np.testing.assert_allclose(y, yt.detach().numpy(), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(dx, xt.grad.numpy(), rtol=1e-9, atol=1e-12)
    mha = next(l for l in model.walk() if isinstance(l, MultiHeadAttention))
    attn = ref.layers[0].self_attn
    w_grad = attn.in_proj_weight.grad.numpy()
    for i, key in enumerate("qkv"):
        np.testing.assert_allclose(mha.grads["w" + key], w_grad[i * E:(i + 1) * E].T,
                                   rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(mha.grads["wo"], attn.out_proj.weight.grad.numpy().T,
                               rtol=1e-9, atol=1e-12)
    total = np.sqrt(sum(float((p.grad ** 2).sum()) for p in ref.parameters()))
    assert np.linalg.norm(model.gradients_flat()) == pytest.approx(total, rel=1e-9)
    before = model.parameters_flat().copy()
    model.parameters_flat()[...] -= 0.05 * model.gradients_flat()
    assert not np.array_equal(model.parameters_flat(), before)
    assert loss_and_dy(model.forward(x, training=True))[0] < loss


def test_a_causal_encoder_imports_causal(tmp_path):
    class Causal(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.enc = _encoder(True, layers=1, seed=3)

        def forward(self, x):
            mask = torch.nn.Transformer.generate_square_subsequent_mask(T)
            return self.enc(x, mask=mask, is_causal=True)

    module = Causal().eval()
    model = load_onnx_model(_export(module, tmp_path / "causal.onnx"), input_shape=(T, E))
    assert [l.causal for l in model.walk() if isinstance(l, MultiHeadAttention)] == [True]
    with torch.inference_mode():
        want = module(torch.from_numpy(_x())).numpy()
    np.testing.assert_allclose(model.predict(_x()), want, rtol=1e-5, atol=2e-6)


def test_a_sequence_first_encoder_is_refused_in_one_line(tmp_path):
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(E, H, FF, dropout=0.0)  # (T, N, E)
    enc = torch.nn.TransformerEncoder(layer, 1, enable_nested_tensor=False).eval()
    path = _export(enc, tmp_path / "seq_first.onnx")
    with pytest.raises(ModelFileError) as info:
        load_onnx_model(path, input_shape=(T, E))
    assert "seq_first.onnx" in str(info.value) and "\n" not in str(info.value)

