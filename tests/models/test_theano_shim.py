"""``import theano`` served by PyTensor (distnn.models.theano_shim) and the Theano ops it
adds (distnn.models.theano_ops): conv2d and pool_2d against torch's, float64."""
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("pytensor")
torch = pytest.importorskip("torch")

from distnn.models.theano_shim import theano_names  # noqa: E402

F = torch.nn.functional
MODE = "FAST_COMPILE"  # the Python linker: no per-op compilation (PyTensor's default is numba)


@pytest.fixture(scope="module")
def theano():
    with theano_names():
        import theano
        import theano.tensor.nnet
        import theano.tensor.signal.pool
        yield theano


def test_the_names_enter_sys_modules_only_when_a_model_imports_theano():
    code = ("import sys, distnn.run.theanompi, distnn.models.theano_shim as s\n"
            "assert 'theano' not in sys.modules\n"
            "with s.theano_names():\n"
            "    import theano.tensor as T\n"
            "    from theano.tensor.nnet import conv2d\n"
            "    from theano.tensor.signal import pool\n"
            "print(T.nnet.softmax.__module__, pool.pool_2d.__name__, sys.modules['theano'])\n"
            "assert not any(type(f).__module__ == s.__name__ for f in sys.meta_path)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "distnn.models.theano_ops pool_2d" in proc.stdout


def test_gpu_modules_are_refused_in_one_line(theano):
    with theano_names(), pytest.raises(ImportError, match="no GPU backend here"):
        import theano.gpuarray  # noqa: F401


def test_config_and_renamed_names(theano):
    import pytensor
    assert theano.config.floatX == pytensor.config.floatX
    assert theano.config.device == "cpu"
    T = theano.tensor
    x = T.dmatrix()
    y = T.lvector()
    p = T.nnet.softmax(x)
    f = theano.function([x, y], [p, T.nnet.categorical_crossentropy(p, y),
                                 T.nnet.relu(x), T.nnet.relu(x, 0.1), T.nnet.sigmoid(x)],
                        mode=MODE)
    a = np.array([[1.0, -2.0, 0.5], [0.0, 3.0, -1.0]])
    labels = np.array([2, 1])
    sm, ce, r, leaky, sig = f(a, labels)
    ref = torch.softmax(torch.tensor(a), 1).numpy()
    np.testing.assert_allclose(sm, ref, rtol=1e-12)
    np.testing.assert_allclose(ce, -np.log(ref[[0, 1], labels]), rtol=1e-12)
    np.testing.assert_allclose(r, np.maximum(a, 0))
    np.testing.assert_allclose(leaky, np.where(a > 0, a, 0.1 * a))
    np.testing.assert_allclose(sig, 1 / (1 + np.exp(-a)), rtol=1e-12)


CONV = [("valid", (1, 1), (1, 1), True), ("half", (2, 1), (1, 1), False),
        ("full", (1, 2), (2, 1), True), ((1, 2), (2, 2), (1, 1), False)]


@pytest.mark.parametrize("border_mode, subsample, dilation, flip", CONV)
def test_conv2d_and_its_gradients_match_torch(theano, border_mode, subsample, dilation, flip):
    from theano.tensor.nnet import conv2d
    T = theano.tensor
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 9, 8))
    w = rng.standard_normal((4, 3, 3, 2))
    X, W = T.dtensor4(), theano.shared(w)
    y = conv2d(X, W, border_mode=border_mode, subsample=subsample,
               filter_dilation=dilation, filter_flip=flip)
    dy = T.dtensor4()
    f = theano.function([X, dy], [y, *theano.grad(T.sum(y * dy), [X, W])], mode=MODE)
    kh, kw = w.shape[2:]
    extent = (dilation[0] * (kh - 1), dilation[1] * (kw - 1))
    pad = {"valid": (0, 0), "full": extent,
           "half": ((extent[0] + 1) // 2, (extent[1] + 1) // 2)}.get(border_mode, border_mode)
    xt = torch.tensor(x, requires_grad=True)
    wt = torch.tensor(w, requires_grad=True)
    ref = F.conv2d(xt, wt.flip(2, 3) if flip else wt, stride=subsample, padding=pad,
                   dilation=dilation)
    g = rng.standard_normal(tuple(ref.shape))
    ref.backward(torch.tensor(g))
    out, dx, dw = f(x, g)
    np.testing.assert_allclose(out, ref.detach().numpy(), atol=1e-12)
    np.testing.assert_allclose(dx, xt.grad.numpy(), atol=1e-12)
    np.testing.assert_allclose(dw, wt.grad.numpy(), atol=1e-12)


POOL = [((2, 2), None, True, (0, 0), "max"), ((3, 3), (2, 2), False, (0, 0), "max"),
        ((3, 2), (1, 2), True, (1, 1), "average_exc_pad"),
        ((2, 3), (2, 2), True, (1, 1), "average_inc_pad"),
        ((2, 2), None, False, (0, 0), "average_inc_pad"), ((2, 2), (1, 1), True, (0, 0), "sum")]


@pytest.mark.parametrize("ws, stride, ignore_border, pad, mode", POOL)
def test_pool_2d_and_its_gradient_match_torch(theano, ws, stride, ignore_border, pad, mode):
    from theano.tensor.signal.pool import pool_2d
    T = theano.tensor
    x = np.random.default_rng(1).permutation(2 * 3 * 9 * 7).reshape(2, 3, 9, 7) / 10.0
    X, dy = T.dtensor4(), T.dtensor4()
    y = pool_2d(X, ws=ws, stride=stride, ignore_border=ignore_border, pad=pad, mode=mode)
    f = theano.function([X, dy], [y, theano.grad(T.sum(y * dy), X)], mode=MODE)
    xt = torch.tensor(x, requires_grad=True)
    s = stride or ws
    if mode == "max":
        ref = F.max_pool2d(xt, ws, s, pad, ceil_mode=not ignore_border)
    else:
        ref = F.avg_pool2d(xt, ws, s, pad, ceil_mode=not ignore_border,
                           count_include_pad=mode != "average_exc_pad")
        if mode == "sum":
            ref = ref * (ws[0] * ws[1])
    g = np.random.default_rng(2).standard_normal(tuple(ref.shape))
    ref.backward(torch.tensor(g))
    out, dx = f(x, g)
    np.testing.assert_allclose(out, ref.detach().numpy(), atol=1e-12)
    np.testing.assert_allclose(dx, xt.grad.numpy(), atol=1e-12)


def test_pool_2d_errors(theano):
    from theano.tensor.signal.pool import pool_2d
    X = theano.tensor.dtensor4()
    with pytest.raises(ValueError, match="pad=.* needs ignore_border=True"):
        pool_2d(X, ws=(2, 2), pad=(1, 1))
    with pytest.raises(ValueError, match="mode='median'"):
        pool_2d(X, ws=(2, 2), mode="median")
