"""Pure in-place optimizer updates: the math of distnn's optimizers, one function each.

Every ``*_update_`` function updates the parameter array ``p`` and its state arrays in place
from the gradient ``g`` with the formulas of the torch.optim algorithm of the same name
(its single-tensor path, ``maximize=False``), so trajectories agree with torch to rounding.
``g`` is never written. Hyper-parameters are keyword-only numbers; arrays keep their dtype
(float32 stays float32: scalars are cast to Python floats, which NumPy treats as weak).

No function allocates a parameter-sized temporary when it is given ``scratch``: a sequence of
work arrays shaped like ``p`` (``scratch_count`` says how many an update needs); the ones
missing are allocated for that call. Everything is written with ``out=`` because in-place
NumPy ops run several times faster than ones that write a fresh large array.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

__all__ = [
    "sgd_update_", "rmsprop_update_", "adam_update_", "adamw_update_", "nadam_update_",
    "adadelta_update_", "nadam_momentum", "scratch_count",
]


def scratch_count(algorithm: str, *, weight_decay: float = 0.0,
                  decoupled_weight_decay: bool = False) -> int:
    """Number of parameter-shaped work arrays ``<algorithm>_update_`` uses (no allocation)."""
    coupled_decay = weight_decay != 0 and not decoupled_weight_decay
    counts = {"sgd": 1, "adam": 1, "adamw": 1, "nadam": 2, "adadelta": 2,
              "rmsprop": 1 + int(coupled_decay)}
    if algorithm not in counts:
        raise ValueError(f"algorithm={algorithm!r} is unknown; choose one of {sorted(counts)}")
    return counts[algorithm]


def _work(scratch: Sequence[np.ndarray], p: np.ndarray, n: int) -> list[np.ndarray]:
    return [scratch[i] if i < len(scratch) else np.empty_like(p) for i in range(n)]


def _decayed_grad(p: np.ndarray, g: np.ndarray, weight_decay: float, out: np.ndarray) -> np.ndarray:
    """out = g + weight_decay * p (torch's ``grad.add(param, alpha=weight_decay)``)."""
    np.multiply(p, weight_decay, out=out)
    return np.add(g, out, out=out)


def _lerp_(a: np.ndarray, b: np.ndarray, weight: float, s: np.ndarray) -> None:
    """a += weight * (b - a) (torch's ``a.lerp_(b, weight)``); s is a work array (may be b)."""
    np.subtract(b, a, out=s)
    np.multiply(s, weight, out=s)
    np.add(a, s, out=a)


def _decay_add_square_(avg: np.ndarray, d: np.ndarray, decay: float, s: np.ndarray) -> None:
    """avg = decay * avg + (1 - decay) * d * d; s is a work array (may be d)."""
    np.multiply(d, d, out=s)
    np.multiply(s, 1.0 - decay, out=s)
    np.multiply(avg, decay, out=avg)
    np.add(avg, s, out=avg)


def sgd_update_(p: np.ndarray, g: np.ndarray, momentum_buffer: np.ndarray | None = None, *,
                lr: float, momentum: float = 0.0, dampening: float = 0.0,
                nesterov: bool = False, weight_decay: float = 0.0, first_step: bool = False,
                scratch: Sequence[np.ndarray] = ()) -> None:
    """Stochastic gradient descent step (torch.optim.SGD).

    d = g + weight_decay * p; with momentum, buf = momentum * buf + (1 - dampening) * d
    (buf = d on the first step), then d = d + momentum * buf (nesterov) or d = buf;
    finally p -= lr * d.

    Args:
        p, g: parameters (updated) and gradients, same shape and dtype.
        momentum_buffer: state array like p; required when momentum != 0.
        first_step: True on the first step, where torch initialises buf to d.
        scratch: one work array like p.
    """
    lr, momentum, dampening, weight_decay = map(float, (lr, momentum, dampening, weight_decay))
    (s,) = _work(scratch, p, 1)
    d = _decayed_grad(p, g, weight_decay, s) if weight_decay != 0 else g
    if momentum != 0:
        buf = momentum_buffer
        if buf is None:
            raise ValueError("sgd_update_: momentum != 0 needs a momentum_buffer array like p")
        if first_step:
            np.copyto(buf, d)
        else:
            np.multiply(buf, momentum, out=buf)
            if dampening == 0:
                np.add(buf, d, out=buf)
            else:  # dampening excludes nesterov, so d is not needed after this
                np.multiply(d, 1.0 - dampening, out=s)
                np.add(buf, s, out=buf)
        if nesterov:
            if d is s:  # s holds d; apply p -= lr * d and p -= lr * momentum * buf in turn
                np.multiply(s, -lr, out=s)
                np.add(p, s, out=p)
                np.multiply(buf, -lr * momentum, out=s)
                np.add(p, s, out=p)
                return
            np.multiply(buf, momentum, out=s)
            d = np.add(d, s, out=s)
        else:
            d = buf
    np.multiply(d, -lr, out=s)
    np.add(p, s, out=p)


def rmsprop_update_(p: np.ndarray, g: np.ndarray, square_avg: np.ndarray,
                    momentum_buffer: np.ndarray | None = None,
                    grad_avg: np.ndarray | None = None, *, lr: float, alpha: float = 0.99,
                    eps: float = 1e-8, weight_decay: float = 0.0, momentum: float = 0.0,
                    centered: bool = False, scratch: Sequence[np.ndarray] = ()) -> None:
    """RMSprop step (torch.optim.RMSprop).

    d = g + weight_decay * p; v = alpha * v + (1 - alpha) * d²; with centered,
    ga = alpha * ga + (1 - alpha) * d and avg = sqrt(v - ga²) + eps, else avg = sqrt(v) + eps;
    with momentum, buf = momentum * buf + d / avg and p -= lr * buf, else p -= lr * d / avg.

    Args:
        square_avg: state v; momentum_buffer (momentum > 0) and grad_avg (centered): state
            arrays like p.
        scratch: one work array like p, two when weight_decay != 0.
    """
    lr, alpha, eps, weight_decay, momentum = map(float, (lr, alpha, eps, weight_decay, momentum))
    work = _work(scratch, p, 2 if weight_decay != 0 else 1)
    s = work[0]
    d = _decayed_grad(p, g, weight_decay, work[1]) if weight_decay != 0 else g
    _decay_add_square_(square_avg, d, alpha, s)
    if centered:
        if grad_avg is None:
            raise ValueError("rmsprop_update_: centered=True needs a grad_avg array like p")
        _lerp_(grad_avg, d, 1.0 - alpha, s)
        np.multiply(grad_avg, grad_avg, out=s)
        np.subtract(square_avg, s, out=s)
        np.sqrt(s, out=s)
    else:
        np.sqrt(square_avg, out=s)
    np.add(s, eps, out=s)
    np.divide(d, s, out=s)
    if momentum > 0:
        if momentum_buffer is None:
            raise ValueError("rmsprop_update_: momentum > 0 needs a momentum_buffer array like p")
        np.multiply(momentum_buffer, momentum, out=momentum_buffer)
        np.add(momentum_buffer, s, out=momentum_buffer)
        np.multiply(momentum_buffer, -lr, out=s)
    else:
        np.multiply(s, -lr, out=s)
    np.add(p, s, out=p)


def adam_update_(p: np.ndarray, g: np.ndarray, exp_avg: np.ndarray, exp_avg_sq: np.ndarray,
                 max_exp_avg_sq: np.ndarray | None = None, *, step: int, lr: float,
                 beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8,
                 weight_decay: float = 0.0, amsgrad: bool = False,
                 decoupled_weight_decay: bool = False,
                 scratch: Sequence[np.ndarray] = ()) -> None:
    """Adam step (torch.optim.Adam; with decoupled_weight_decay, torch.optim.AdamW).

    Decay: p *= 1 - lr * weight_decay (decoupled) or d = g + weight_decay * p (coupled).
    m = beta1 * m + (1 - beta1) * d; v = beta2 * v + (1 - beta2) * d²;
    with amsgrad vmax = max(vmax, v) replaces v below;
    p -= lr / (1 - beta1^step) * m / (sqrt(v) / sqrt(1 - beta2^step) + eps).

    Args:
        exp_avg, exp_avg_sq: state m and v; max_exp_avg_sq: state vmax (amsgrad).
        step: 1-based number of this step (bias correction).
        scratch: one work array like p.
    """
    if step < 1:
        raise ValueError(f"adam_update_: step must be >= 1 (1 on the first update), got {step}")
    lr, beta1, beta2, eps, weight_decay = map(float, (lr, beta1, beta2, eps, weight_decay))
    (s,) = _work(scratch, p, 1)
    coupled = weight_decay != 0 and not decoupled_weight_decay
    if weight_decay != 0 and decoupled_weight_decay:
        np.multiply(p, 1.0 - lr * weight_decay, out=p)
    # With coupled decay d = g + wd * p lives in s; it is rebuilt (bit-identical, p has not
    # moved yet) for the second moment rather than kept in a second work array.
    d = _decayed_grad(p, g, weight_decay, s) if coupled else g
    _lerp_(exp_avg, d, 1.0 - beta1, s)
    d = _decayed_grad(p, g, weight_decay, s) if coupled else g
    _decay_add_square_(exp_avg_sq, d, beta2, s)
    v = exp_avg_sq
    if amsgrad:
        if max_exp_avg_sq is None:
            raise ValueError("adam_update_: amsgrad=True needs a max_exp_avg_sq array like p")
        v = np.maximum(max_exp_avg_sq, exp_avg_sq, out=max_exp_avg_sq)
    step_size = lr / (1.0 - beta1 ** step)
    bias_correction2_sqrt = (1.0 - beta2 ** step) ** 0.5
    np.sqrt(v, out=s)
    np.divide(s, bias_correction2_sqrt, out=s)
    np.add(s, eps, out=s)
    np.divide(exp_avg, s, out=s)
    np.multiply(s, -step_size, out=s)
    np.add(p, s, out=p)


def adamw_update_(p: np.ndarray, g: np.ndarray, exp_avg: np.ndarray, exp_avg_sq: np.ndarray,
                  max_exp_avg_sq: np.ndarray | None = None, *, step: int, lr: float,
                  beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8,
                  weight_decay: float = 1e-2, amsgrad: bool = False,
                  scratch: Sequence[np.ndarray] = ()) -> None:
    """AdamW step (torch.optim.AdamW): Adam with decoupled weight decay
    p *= 1 - lr * weight_decay before the Adam update. Arguments as ``adam_update_``."""
    adam_update_(p, g, exp_avg, exp_avg_sq, max_exp_avg_sq, step=step, lr=lr, beta1=beta1,
                 beta2=beta2, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                 decoupled_weight_decay=True, scratch=scratch)


def nadam_momentum(step: int, beta1: float, momentum_decay: float) -> float:
    """mu_t = beta1 * (1 - 0.5 * 0.96^(t * momentum_decay)), torch's NAdam momentum schedule."""
    return beta1 * (1.0 - 0.5 * (0.96 ** (step * momentum_decay)))


def nadam_update_(p: np.ndarray, g: np.ndarray, exp_avg: np.ndarray, exp_avg_sq: np.ndarray, *,
                  step: int, mu_product: float, lr: float, beta1: float = 0.9,
                  beta2: float = 0.999, eps: float = 1e-8, weight_decay: float = 0.0,
                  momentum_decay: float = 4e-3, decoupled_weight_decay: bool = False,
                  scratch: Sequence[np.ndarray] = ()) -> float:
    """NAdam step (torch.optim.NAdam, momentum_decay schedule included); returns the new
    ``mu_product`` (the product of mu_1..mu_step; pass 1.0 before the first step).

    mu_t = nadam_momentum(t); m, v as Adam; denom = sqrt(v / (1 - beta2^t)) + eps;
    p -= lr (1 - mu_t) / (1 - prod mu_1..t) * d / denom
       + lr mu_{t+1} / (1 - prod mu_1..t+1) * m / denom.

    Args:
        step: 1-based number of this step.
        scratch: two work arrays like p.
    """
    if step < 1:
        raise ValueError(f"nadam_update_: step must be >= 1 (1 on the first update), got {step}")
    lr, beta1, beta2, eps, weight_decay, momentum_decay = map(
        float, (lr, beta1, beta2, eps, weight_decay, momentum_decay))
    s, t = _work(scratch, p, 2)
    d = g
    if weight_decay != 0:
        if decoupled_weight_decay:
            np.multiply(p, 1.0 - lr * weight_decay, out=p)
        else:
            d = _decayed_grad(p, g, weight_decay, t)
    mu = nadam_momentum(step, beta1, momentum_decay)
    mu_next = nadam_momentum(step + 1, beta1, momentum_decay)
    mu_product = float(mu_product) * mu
    mu_product_next = mu_product * mu_next
    _lerp_(exp_avg, d, 1.0 - beta1, s)
    _decay_add_square_(exp_avg_sq, d, beta2, s)
    np.divide(exp_avg_sq, 1.0 - beta2 ** step, out=s)
    np.sqrt(s, out=s)
    np.add(s, eps, out=s)
    np.divide(d, s, out=t)
    np.multiply(t, -lr * (1.0 - mu) / (1.0 - mu_product), out=t)
    np.add(p, t, out=p)
    np.divide(exp_avg, s, out=t)
    np.multiply(t, -lr * mu_next / (1.0 - mu_product_next), out=t)
    np.add(p, t, out=p)
    return mu_product


def adadelta_update_(p: np.ndarray, g: np.ndarray, square_avg: np.ndarray,
                     acc_delta: np.ndarray, *, lr: float = 1.0, rho: float = 0.9,
                     eps: float = 1e-6, weight_decay: float = 0.0,
                     scratch: Sequence[np.ndarray] = ()) -> None:
    """Adadelta step (torch.optim.Adadelta).

    d = g + weight_decay * p; v = rho * v + (1 - rho) * d²;
    delta = sqrt(u + eps) / sqrt(v + eps) * d; u = rho * u + (1 - rho) * delta²;
    p -= lr * delta.

    Args:
        square_avg, acc_delta: state v and u, like p.
        scratch: two work arrays like p.
    """
    lr, rho, eps, weight_decay = map(float, (lr, rho, eps, weight_decay))
    s, t = _work(scratch, p, 2)
    d = _decayed_grad(p, g, weight_decay, t) if weight_decay != 0 else g
    _decay_add_square_(square_avg, d, rho, s)
    np.add(square_avg, eps, out=s)
    np.sqrt(s, out=s)
    np.add(acc_delta, eps, out=t)
    np.sqrt(t, out=t)
    np.divide(t, s, out=t)
    # d was overwritten in t; rebuild it (p has not moved, so bit-identical) into s
    d = _decayed_grad(p, g, weight_decay, s) if weight_decay != 0 else g
    np.multiply(t, d, out=t)
    _decay_add_square_(acc_delta, t, rho, s)
    np.multiply(t, -lr, out=t)
    np.add(p, t, out=p)
