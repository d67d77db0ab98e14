"""Optimizer classes: they hold the state (moment buffers, step count, learning rate); the
math lives in the pure functions of ``distnn.optim.functional``.

An optimizer updates parameter arrays in place from their gradient arrays. Give it a built
model (anything with ``parameters_flat()`` and ``gradients_flat()``: one update over the
whole flat buffer) or a list of ``(param_array, grad_array)`` pairs. Each algorithm matches
the torch.optim class of the same name, with torch's defaults and state names.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from . import functional as F
from . import groups
from .base import SGD, Optimizer, _betas, _flag, _number, _positive, _unit


class RMSprop(Optimizer):
    """RMSprop (torch.optim.RMSprop), optionally centered and with momentum.

    Args:
        params: a built model, or a list of (param_array, grad_array) pairs.
        lr: learning rate, >= 0.
        alpha: smoothing constant of the squared-gradient average, in [0, 1].
        eps: added to the denominator, > 0.
        weight_decay: L2 penalty added to the gradient, >= 0.
        momentum: momentum factor, >= 0.
        centered: normalise by the estimated variance of the gradient.

    Example:
        opt = RMSprop(model, lr=1e-3, momentum=0.9)
    """

    name = "rmsprop"
    _spec = {"alpha": _unit, "eps": _positive, "weight_decay": _number, "momentum": _number,
             "centered": _flag}

    def __init__(self, params: Any, lr: float = 0.01, alpha: float = 0.99, eps: float = 1e-8,
                 weight_decay: float = 0.0, momentum: float = 0.0, centered: bool = False):
        super().__init__(params, lr, alpha=alpha, eps=eps, weight_decay=weight_decay,
                         momentum=momentum, centered=centered)

    @staticmethod
    def _state_keys(hp):
        return (("square_avg",) + (("momentum_buffer",) if hp["momentum"] > 0 else ())
                + (("grad_avg",) if hp["centered"] else ()))

    def _scratch_count(self):
        return F.scratch_count("rmsprop", weight_decay=self.weight_decay)

    def _update(self, p, g, state, scratch, step):
        F.rmsprop_update_(p, g, state["square_avg"], state.get("momentum_buffer"),
                          state.get("grad_avg"), lr=self.lr, scratch=scratch, **self._hp)


class Adam(Optimizer):
    """Adam (torch.optim.Adam): bias-corrected first and second moment estimates, optional
    AMSGrad; weight decay is an L2 penalty added to the gradient (see ``AdamW``).

    Args:
        params: a built model, or a list of (param_array, grad_array) pairs.
        lr: learning rate, >= 0.
        betas: decay rates (beta1, beta2) of the moment estimates, each in [0, 1).
        eps: added to the denominator, > 0.
        weight_decay: >= 0.
        amsgrad: use the running maximum of the second moment (AMSGrad).

    Example:
        opt = Adam(model, lr=1e-3, betas=(0.9, 0.999))
    """

    name = "adam"
    _spec = {"betas": _betas, "eps": _positive, "weight_decay": _number, "amsgrad": _flag}
    _decoupled = False

    def __init__(self, params: Any, lr: float = 1e-3,
                 betas: Sequence[float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, amsgrad: bool = False):
        super().__init__(params, lr, betas=betas, eps=eps, weight_decay=weight_decay,
                         amsgrad=amsgrad)

    @staticmethod
    def _state_keys(hp):
        return ("exp_avg", "exp_avg_sq") + (("max_exp_avg_sq",) if hp["amsgrad"] else ())

    def _update(self, p, g, state, scratch, step):
        beta1, beta2 = self.betas
        F.adam_update_(p, g, state["exp_avg"], state["exp_avg_sq"], state.get("max_exp_avg_sq"),
                       step=step, lr=self.lr, beta1=beta1, beta2=beta2, eps=self.eps,
                       weight_decay=self.weight_decay, amsgrad=self.amsgrad,
                       decoupled_weight_decay=self._decoupled, scratch=scratch)


class AdamW(Adam):
    """AdamW (torch.optim.AdamW): Adam with decoupled weight decay, p *= 1 - lr * weight_decay
    before each Adam update, in two parameter groups: for a model, only the parameters
    ``decay`` picks take the decay (default ``optim.groups.decays``: weight matrices and
    kernels, not biases, norms or embeddings); the others (and every parameter, with
    ``decay=None`` or (param, grad) pairs) form the other group. Other arguments as
    ``Adam``; weight_decay defaults to 1e-2.

    Args:
        decay: "auto" (``optim.groups.decays``), None (every parameter decays, as torch's
            AdamW over ``model.parameters()``) or ``decay(layer, key, array) -> bool``.

    Attributes:
        param_groups: [{"name", "weight_decay", "params": ["<layer>/<key>", ...]}] of a
            model (one group of everything for (param, grad) pairs).

    Example:
        opt = AdamW(model, lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
    """

    name = "adamw"
    _decoupled = True

    def __init__(self, params: Any, lr: float = 1e-3,
                 betas: Sequence[float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, amsgrad: bool = False, *, decay: Any = "auto"):
        super().__init__(params, lr, betas=betas, eps=eps, weight_decay=weight_decay,
                         amsgrad=amsgrad)
        if decay == "auto":
            decay = groups.decays
        elif decay is not None and not callable(decay):
            raise ValueError(f"AdamW: decay must be 'auto', None or a callable "
                             f"decay(layer, key, array) -> bool, got {decay!r}")
        self._rule = decay
        self._ranges = (groups.decay_ranges(self._model, decay) if self._model is not None
                        else None)

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        if self._model is None or not hasattr(self._model, "walk"):
            return [{"name": "decay", "weight_decay": self.weight_decay,
                     "params": [f"params[{i}]" for i in range(len(self._pairs))]}]
        named = groups.named_groups(self._model, self._rule)
        return [{"name": "decay", "weight_decay": self.weight_decay, "params": named["decay"]},
                {"name": "no_decay", "weight_decay": 0.0, "params": named["no_decay"]}]

    def step(self) -> None:
        if self.weight_decay:
            factor = 1.0 - self.lr * self.weight_decay
            for i, (p, _) in enumerate(self.param_pairs()):
                if self._ranges is None:
                    np.multiply(p, p.dtype.type(factor), out=p)
                    continue
                for a, b in self._ranges if i == 0 else ():
                    np.multiply(p[a:b], p.dtype.type(factor), out=p[a:b])
        super().step()

    def _update(self, p, g, state, scratch, step):
        beta1, beta2 = self.betas
        # the decay of step() is the whole of it: none inside the Adam update
        F.adam_update_(p, g, state["exp_avg"], state["exp_avg_sq"], state.get("max_exp_avg_sq"),
                       step=step, lr=self.lr, beta1=beta1, beta2=beta2, eps=self.eps,
                       weight_decay=0.0, amsgrad=self.amsgrad, decoupled_weight_decay=True,
                       scratch=scratch)


class Nadam(Optimizer):
    """NAdam (torch.optim.NAdam): Adam with Nesterov momentum and torch's momentum-decay
    schedule mu_t = beta1 * (1 - 0.5 * 0.96^(t * momentum_decay)).

    Args:
        params: a built model, or a list of (param_array, grad_array) pairs.
        lr: learning rate, >= 0 (torch's default 2e-3).
        betas: (beta1, beta2), each in [0, 1).
        eps: added to the denominator, > 0.
        weight_decay: >= 0.
        momentum_decay: >= 0.
        decoupled_weight_decay: decay the parameters as AdamW does instead of adding an L2
            penalty to the gradient.

    Example:
        opt = Nadam(model, lr=2e-3)
    """

    name = "nadam"
    _spec = {"betas": _betas, "eps": _positive, "weight_decay": _number,
             "momentum_decay": _number, "decoupled_weight_decay": _flag}

    def __init__(self, params: Any, lr: float = 2e-3, betas: Sequence[float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, momentum_decay: float = 4e-3,
                 decoupled_weight_decay: bool = False):
        super().__init__(params, lr, betas=betas, eps=eps, weight_decay=weight_decay,
                         momentum_decay=momentum_decay,
                         decoupled_weight_decay=decoupled_weight_decay)
        self._mu = (0, 1.0)  # (iterations, product of mu_1..mu_iterations)
        self._mu_before = 1.0

    @staticmethod
    def _state_keys(hp):
        return ("exp_avg", "exp_avg_sq")

    def _scratch_count(self):
        return F.scratch_count("nadam")

    @property
    def mu_product(self) -> float:
        """Product of the momentum schedule mu_1..mu_t over the steps t taken so far. It is
        derived from ``iterations`` (rebuilt in the same order when that was set from outside,
        e.g. by a state load or a broadcast), so it is no state of its own."""
        done, product = self._mu
        if done != self.iterations:
            beta1, decay = self.betas[0], self.momentum_decay
            product = 1.0
            for t in range(1, self.iterations + 1):
                product *= F.nadam_momentum(t, beta1, decay)
            self._mu = (self.iterations, product)
        return product

    def step(self) -> None:
        self._mu_before = self.mu_product  # every array is updated from the same product
        super().step()
        self._mu = (self.iterations, self._mu_before * F.nadam_momentum(
            self.iterations, self.betas[0], self.momentum_decay))

    def _update(self, p, g, state, scratch, step):
        beta1, beta2 = self.betas
        F.nadam_update_(p, g, state["exp_avg"], state["exp_avg_sq"], step=step,
                        mu_product=self._mu_before, lr=self.lr, beta1=beta1, beta2=beta2,
                        eps=self.eps, weight_decay=self.weight_decay,
                        momentum_decay=self.momentum_decay,
                        decoupled_weight_decay=self.decoupled_weight_decay, scratch=scratch)

    def _after_load(self):
        self._mu = (0, 1.0)


class Adadelta(Optimizer):
    """Adadelta (torch.optim.Adadelta).

    Args:
        params: a built model, or a list of (param_array, grad_array) pairs.
        lr: scale of the update, >= 0 (torch's default 1.0).
        rho: decay rate of the running averages, in [0, 1].
        eps: added inside the square roots, > 0.
        weight_decay: L2 penalty added to the gradient, >= 0.

    Example:
        opt = Adadelta(model, lr=1.0, rho=0.9)
    """

    name = "adadelta"
    _spec = {"rho": _unit, "eps": _positive, "weight_decay": _number}

    def __init__(self, params: Any, lr: float = 1.0, rho: float = 0.9, eps: float = 1e-6,
                 weight_decay: float = 0.0):
        super().__init__(params, lr, rho=rho, eps=eps, weight_decay=weight_decay)

    @staticmethod
    def _state_keys(hp):
        return ("square_avg", "acc_delta")

    def _scratch_count(self):
        return F.scratch_count("adadelta")

    def _update(self, p, g, state, scratch, step):
        F.adadelta_update_(p, g, state["square_avg"], state["acc_delta"], lr=self.lr,
                           scratch=scratch, **self._hp)


OPTIMIZERS: dict[str, type[Optimizer]] = {
    "sgd": SGD, "rmsprop": RMSprop, "adam": Adam, "adamw": AdamW, "nadam": Nadam,
    "adadelta": Adadelta,
}


def get_optimizer(name: str, params: Any, **kwargs: Any) -> Optimizer:
    """Build the optimizer registered as ``name`` (case-insensitive) over ``params``.

    Example:
        opt = get_optimizer("adam", model, lr=1e-3)
    """
    key = str(name).lower()
    if key not in OPTIMIZERS:
        raise ValueError(f"optimizer {name!r} is unknown; valid choices: "
                         f"{', '.join(sorted(OPTIMIZERS))}")
    cls = OPTIMIZERS[key]
    unknown = sorted(set(kwargs) - set(cls._spec) - {"lr"})
    if unknown:
        raise ValueError(f"{cls.__name__}: unknown hyper-parameters {unknown}; valid ones are "
                         f"lr, {', '.join(cls._spec)}")
    return cls(params, **kwargs)


__all__ = ["Optimizer", "SGD", "RMSprop", "Adam", "AdamW", "Nadam", "Adadelta", "OPTIMIZERS",
           "get_optimizer"]
