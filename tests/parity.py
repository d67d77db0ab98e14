"""Parity of distnn layers with their declared torch counterparts and ONNX nodes, shared by
the transformer layer tests: the same weights, float64, forward and backward."""
from __future__ import annotations

import numpy as np


def torch_parity(layer, x: np.ndarray, grads: dict, *, module=None, tol: float = 1e-10,
                 ids: bool = False, seed: int = 5) -> None:
    """Check ``layer`` (built, float64) against ``module`` (default its own
    ``torch_module()``): y, dx (unless ``ids``: token ids have none) and the gradient of each
    parameter, for the same dy. ``grads`` maps a distnn parameter key to (the torch
    parameter's name, a function of its grad giving distnn's layout)."""
    import torch
    module = (layer.torch_module() if module is None else module).double()
    y = layer.forward(x, training=True)
    dy = np.random.default_rng(seed).standard_normal(y.shape)
    dx = layer.backward(dy.copy())
    tx = torch.tensor(x, dtype=torch.long if ids else torch.float64, requires_grad=not ids)
    ty = module(tx)
    ty.backward(torch.tensor(dy))
    np.testing.assert_allclose(y, ty.detach().numpy(), rtol=tol, atol=tol, err_msg="forward")
    if not ids:
        np.testing.assert_allclose(dx, tx.grad.numpy(), rtol=tol, atol=tol, err_msg="dx")
    named = dict(module.named_parameters())
    assert set(grads) == set(layer.params), (set(grads), set(layer.params))
    for key, (name, to_distnn) in grads.items():
        np.testing.assert_allclose(layer.grads[key], to_distnn(named[name].grad.numpy()),
                                   rtol=tol, atol=tol, err_msg=f"grad of {key}")


def same(g):
    return g


def onnx_matches(model, x: np.ndarray, *, tol: float = 1e-5) -> list[str]:
    """Run ``model``'s ONNX graph (nn/onnx_export.py) in onnxruntime on ``x`` and compare with
    ``model.predict``; returns the graph's op types."""
    import onnxruntime as ort

    from distnn.nn.onnx_export import onnx_model
    proto = onnx_model(model)
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    got = session.run(["output"], {"input": x.astype(np.float32)})[0]
    want = model.predict(x)
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * scale, err_msg="onnxruntime")
    return [n.op_type for n in proto.graph.node]


def torch_export_matches(model, x: np.ndarray, *, tol: float = 1e-10) -> None:
    """``model.to_torch()`` (nn/torch_export.py) computes ``model.predict`` on ``x``."""
    import torch
    module = model.to_torch()
    with torch.inference_mode():
        got = module(torch.from_numpy(np.ascontiguousarray(x))).numpy()
    np.testing.assert_allclose(got, model.predict(x), rtol=tol, atol=tol, err_msg="to_torch")


def built(layer, shape, dtype=np.float64, seed=0):
    """``layer`` built for ``shape`` with its initializer drawn from ``seed``."""
    layer.build(shape, rng=np.random.default_rng(seed), dtype=dtype)
    return layer


def randomized(layer, seed=1):
    """``layer`` with every parameter drawn away from its initial value (magnitudes 0.5-1.5,
    random signs), so that no gradient check passes on a symmetric start."""
    rng = np.random.default_rng(seed)
    for p in layer.params.values():
        p[...] = rng.uniform(0.5, 1.5, p.shape) * rng.choice([-1, 1], p.shape)
    return layer


def perturb_batch_norms(model, rng, spread: float = 0.2, var=(0.5, 2.0)) -> None:
    """Non-trivial batch norms: running statistics and affine parameters away from 0/1."""
    from distnn.nn import BatchNormalization
    for layer in model.walk():
        if isinstance(layer, BatchNormalization):
            c = layer.buffers["running_mean"].shape
            layer.buffers["running_mean"][...] = rng.normal(0, spread, c)
            layer.buffers["running_var"][...] = rng.uniform(*var, c)
            layer.params["gamma"][...] = rng.uniform(0.5, 1.5, c)
            layer.params["beta"][...] = rng.normal(0, spread, c)
