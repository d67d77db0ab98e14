"""Float64 central-difference gradient checks shared by the layer tests."""
from __future__ import annotations

import numpy as np


def central_difference(f, x: np.ndarray, index, eps: float = 1e-6) -> float:
    """The central difference of scalar f() along ``x[index]`` (perturbed in place, then
    restored)."""
    old = x[index]
    x[index] = old + eps
    fp = f()
    x[index] = old - eps
    fm = f()
    x[index] = old
    return (fp - fm) / (2 * eps)


def numerical_grad(f, x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """Central differences of scalar f() with respect to x (perturbed in place)."""
    grad = np.zeros_like(x)
    flat, gflat = x.reshape(-1), grad.reshape(-1)
    for i in range(flat.size):
        gflat[i] = central_difference(f, flat, i, eps)
    return grad


def rel_error(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a - b)) / max(1e-8, np.max(np.abs(a) + np.abs(b))))


def check_layer(layer, x: np.ndarray, *, training: bool = True, tol: float = 1e-6,
                seed: int = 0, reset=None) -> dict[str, float]:
    """Check dx and every parameter gradient of a built float64 layer at input x.

    The loss is sum(y * r) for a fixed random r, so dy = r. ``reset`` (optional) is called
    before every forward to restore any randomness (e.g. a Dropout generator).
    Returns the relative errors; asserts each is below tol.
    """
    assert x.dtype == np.float64
    r = np.random.default_rng(seed + 1).standard_normal(
        (x.shape[0],) + tuple(layer.output_shape))

    def loss():
        if reset is not None:
            reset()
        return float(np.sum(layer.forward(x, training) * r))

    if reset is not None:
        reset()
    layer.forward(x, training)
    dx = layer.backward(r.copy())
    analytic = {k: g.copy() for k, g in layer.grads.items()}
    errors = {}
    if dx is not None:
        errors["dx"] = rel_error(dx, numerical_grad(loss, x))
    for k, p in layer.params.items():
        errors[k] = rel_error(analytic[k], numerical_grad(loss, p))
    bad = {k: e for k, e in errors.items() if not e < tol}
    assert not bad, f"{type(layer).__name__} gradient mismatch (rel. error > {tol}): {bad}"
    return errors
