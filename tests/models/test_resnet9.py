"""The zoo's resnet9 is Needle's ResNet9 (the model of Needle's apps/ddp): shape, parameter
count, a float64 central-difference check of sampled gradients, and the same outputs and
gradients as the architecture written in torch as Needle's hw4 writes it."""
import numpy as np
import pytest
from gradcheck import central_difference

from distnn.models import get_model
from distnn.nn import Add, BatchNormalization, Conv2D, Dense

# conv(3->16, 7x7) + conv(16->32) + 2 conv(32->32) + conv(32->64) + conv(64->128)
# + 2 conv(128->128), each with bias and a BatchNorm (gamma, beta); Dense 128->128->10
COUNT = ((3 * 49 + 1) * 16 + 32 + (16 * 9 + 1) * 32 + 64 + 2 * ((32 * 9 + 1) * 32 + 64)
         + (32 * 9 + 1) * 64 + 128 + (64 * 9 + 1) * 128 + 256
         + 2 * ((128 * 9 + 1) * 128 + 256) + 129 * 128 + 129 * 10)


def test_resnet9_shape_and_structure():
    model = get_model("resnet9", rng=0)
    assert COUNT == 431_946 and model.parameters_flat().size == COUNT
    assert model.input_shape == (3, 32, 32) and model.output_shape == (10,)
    assert sum(isinstance(l, Add) for l in model.walk()) == 2
    assert sum(isinstance(l, BatchNormalization) for l in model.walk()) == 8
    convs = [l for l in model.walk() if isinstance(l, Conv2D)]
    assert [l.filters for l in convs] == [16, 32, 32, 32, 64, 128, 128, 128]
    x = np.random.default_rng(0).random((3, 3, 32, 32), dtype=np.float32)
    y = model.forward(x, training=True)
    assert y.shape == (3, 10) and y.dtype == np.float32 and np.all(np.isfinite(y))
    assert get_model("resnet9", num_classes=7, rng=0).output_shape == (7,)


def test_resnet9_sampled_gradients_match_central_differences():
    model = get_model("resnet9", dtype=np.float64, rng=1)
    model.layers[0].need_dx = True  # a model's first layer skips dx unless asked
    gen = np.random.default_rng(2)
    x = gen.standard_normal((4, 3, 32, 32))
    r = gen.standard_normal((4, 10))

    def loss():
        return float(np.sum(model.forward(x, training=True) * r))

    model.forward(x, training=True)
    dx = model.backward(r.copy())
    grads = model.gradients_flat().copy()
    params = model.parameters_flat()
    # a few entries of every layer's parameters, and of the input
    picks = [int(i) for _, lo, hi in model.layer_ranges() if hi > lo
             for i in gen.integers(lo, hi, 2)]
    for i in picks:
        num = central_difference(loss, params, i)
        assert abs(num - grads[i]) <= 1e-5 * max(1.0, abs(num)), (i, num, grads[i])
    for idx in zip(*(gen.integers(0, s, 4) for s in x.shape)):
        num = central_difference(loss, x, idx)
        assert abs(num - dx[idx]) <= 1e-5 * max(1.0, abs(num)), (idx, num, dx[idx])


def test_resnet9_equals_needles_architecture_written_in_torch():
    torch = pytest.importorskip("torch")
    nn = torch.nn

    def conv_bn(a, b, k, s):  # Needle's ConvBN: Conv(padding k // 2, bias), BatchNorm, ReLU
        return nn.Sequential(nn.Conv2d(a, b, k, s, padding=k // 2), nn.BatchNorm2d(b),
                             nn.ReLU())

    class Residual(nn.Module):
        def __init__(self, fn):
            super().__init__()
            self.fn = fn

        def forward(self, x):
            return self.fn(x) + x

    ref = nn.Sequential(
        conv_bn(3, 16, 7, 4), conv_bn(16, 32, 3, 2),
        Residual(nn.Sequential(conv_bn(32, 32, 3, 1), conv_bn(32, 32, 3, 1))),
        conv_bn(32, 64, 3, 2), conv_bn(64, 128, 3, 2),
        Residual(nn.Sequential(conv_bn(128, 128, 3, 1), conv_bn(128, 128, 3, 1))),
        nn.Flatten(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10)).double()
    model = get_model("resnet9", dtype=np.float64, rng=3)
    model.layers[0].need_dx = True
    ours = [l for l in model.walk() if isinstance(l, (Conv2D, BatchNormalization, Dense))]
    theirs = [m for m in ref.modules()
              if isinstance(m, (nn.Conv2d, nn.BatchNorm2d, nn.Linear))]
    assert len(ours) == len(theirs) == 18
    with torch.no_grad():
        for a, b in zip(ours, theirs):
            if isinstance(b, nn.BatchNorm2d):
                b.weight.copy_(torch.from_numpy(a.params["gamma"]))
                b.bias.copy_(torch.from_numpy(a.params["beta"]))
            else:
                w = a.params["w"]
                b.weight.copy_(torch.from_numpy(w.T.copy() if w.ndim == 2 else w))
                b.bias.copy_(torch.from_numpy(a.params["b"]))
    x = np.random.default_rng(4).standard_normal((5, 3, 32, 32))
    y = model.forward(x, training=True)
    xt = torch.from_numpy(x.copy()).requires_grad_()
    yt = ref(xt)
    np.testing.assert_allclose(y, yt.detach().numpy(), rtol=1e-9, atol=1e-10)
    r = np.random.default_rng(5).standard_normal(y.shape)
    dx = model.backward(r.copy())
    (yt * torch.from_numpy(r)).sum().backward()
    np.testing.assert_allclose(dx, xt.grad.numpy(), rtol=1e-8, atol=1e-10)
    first = ours[0]
    np.testing.assert_allclose(first.grads["w"], theirs[0].weight.grad.numpy(), rtol=1e-8,
                               atol=1e-10)
