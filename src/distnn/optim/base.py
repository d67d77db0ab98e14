"""The ``Optimizer`` base class (parameter pairs, state buffers, lr, step count,
(de)serialisation), the validators of hyper-parameters, and ``SGD``. RMSprop, the Adam
family, Adadelta and the registry are in ``optimizers``.

The optimizer is the one owner of the learning rate. ``scheduled_lr`` is the rate the
schedules set (``ReduceLROnPlateau``, ``ReduceLREveryNEpochs``; a user may set it too,
through ``lr``) and the one a checkpoint keeps; ``lr_scale`` is a warm-up's factor (1
otherwise; ``WarmUp`` sets it before every batch); a step uses ``lr``, their product.

``clip_grad_norm`` (None or a number > 0) clips the gradients a step receives to that
global L2 norm first (``optim.groups.clip_grad_norm_``). Under a distributed optimizer
the step runs after the all-reduce (and after a compression's decoding), so every rank
clips the same summed gradient; ``grad_norm`` is the norm the last step measured.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from . import functional as F


Pair = tuple[np.ndarray, np.ndarray]


def _number(owner: str, name: str, value: Any, *, low: float = 0.0, high: float | None = None,
            low_open: bool = False, high_open: bool = False) -> float:
    """value as a float checked against [low, high] (ends open as told), or a ValueError
    that names the argument, the rule and the value."""
    lo = "(" if low_open else "["
    hi = ")" if high_open else "]"
    rule = (f"in {lo}{low:g}, {high:g}{hi}" if high is not None
            else f"{'>' if low_open else '>='} {low:g}")
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{owner}: {name} must be a number {rule}, got {value!r}") from None
    ok = math.isfinite(x) and (x > low if low_open else x >= low)
    if high is not None:
        ok = ok and (x < high if high_open else x <= high)
    if not ok:
        raise ValueError(f"{owner}: {name} must be a finite number {rule}, got {value!r}")
    return x


def _flag(owner: str, name: str, value: Any) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{owner}: {name} must be True or False, got {value!r}")
    return bool(value)


def _betas(owner: str, name: str, betas: Any) -> tuple[float, float]:
    try:
        b1, b2 = betas
    except (TypeError, ValueError):
        raise ValueError(f"{owner}: {name} must be a pair (beta1, beta2), got {betas!r}") from None
    return (_number(owner, f"{name}[0]", b1, high=1.0, high_open=True),
            _number(owner, f"{name}[1]", b2, high=1.0, high_open=True))


def _positive(owner: str, name: str, value: Any) -> float:
    return _number(owner, name, value, low_open=True)


def _unit(owner: str, name: str, value: Any) -> float:
    return _number(owner, name, value, high=1.0)


def _resolve_params(owner: str, params: Any) -> tuple[Any, list[Pair]]:
    """(model or None, [(p, g), ...]) from a built model or (p, g) pairs, validated."""
    if hasattr(params, "parameters_flat") and hasattr(params, "gradients_flat"):
        return params, [(params.parameters_flat(), params.gradients_flat())]
    if (isinstance(params, tuple) and len(params) == 2
            and all(isinstance(a, np.ndarray) for a in params)):
        params = [params]
    try:
        pairs = [tuple(pair) for pair in params]
    except TypeError:
        raise ValueError(f"{owner}: params must be a built model or a list of "
                         f"(param_array, grad_array) pairs, got {type(params).__name__}") from None
    if not pairs:
        raise ValueError(f"{owner}: params is empty; pass a built model or at least one "
                         "(param_array, grad_array) pair")
    for i, pair in enumerate(pairs):
        if len(pair) != 2 or not all(isinstance(a, np.ndarray) for a in pair):
            raise ValueError(f"{owner}: params[{i}] must be a (param_array, grad_array) pair "
                             f"of numpy arrays, got {tuple(type(a).__name__ for a in pair)}")
        p, g = pair
        if p.dtype.kind != "f":
            raise ValueError(f"{owner}: params[{i}] has dtype {p.dtype}; parameters must be "
                             "float32 or float64 arrays")
        if g.shape != p.shape or g.dtype != p.dtype:
            raise ValueError(f"{owner}: params[{i}]: the gradient has shape {g.shape} and dtype "
                             f"{g.dtype} but the parameter has shape {p.shape} and dtype "
                             f"{p.dtype}; they must agree")
        if not p.flags.writeable:
            raise ValueError(f"{owner}: params[{i}] is read-only; the optimizer updates "
                             "parameters in place")
    return None, pairs


class _Hyper:
    """A hyper-parameter attribute: readable, fixed after construction."""

    def __init__(self, name: str):
        self.name = name

    def __get__(self, obj, cls=None):
        return self if obj is None else obj._hp[self.name]

    def __set__(self, obj, value):
        raise AttributeError(f"{type(obj).__name__}.{self.name} is fixed at construction; "
                             "only lr may change between steps (build a new optimizer, or "
                             "use load_state_dict)")


class Optimizer:
    """Base class: parameter pairs, state buffers, lr, step count and (de)serialisation.

    Subclasses declare ``name`` (registry key) and ``_spec`` (hyper-parameter name ->
    validator; each becomes a read-only attribute) and implement ``_state_keys``, ``_update``
    and, where needed, ``_cross_check`` and ``_scratch_count``.
    """

    name = ""
    _spec: dict[str, Any] = {}

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        for key in cls._spec:
            setattr(cls, key, _Hyper(key))

    def __init__(self, params: Any, lr: float, **hyper: Any):
        owner = type(self).__name__
        self._model, self._pairs = _resolve_params(owner, params)
        self._lr_scale = 1.0
        self.lr = lr
        self._clip: float | None = None
        self.grad_norm: float | None = None
        self._hp = self._check(hyper)
        self.iterations = 0
        keys = self._state_keys(self._hp)
        self.state: list[dict[str, np.ndarray]] = [
            {k: np.zeros_like(p) for k in keys} for p, _ in self._pairs]
        self._scratch: list[list[np.ndarray]] = []

    # -- subclass hooks -----------------------------------------------------------------
    @classmethod
    def _check(cls, hp: dict[str, Any]) -> dict[str, Any]:
        """Validated copy of the hyper-parameters (all of ``_spec``, nothing else)."""
        o = cls.__name__
        unknown = sorted(set(hp) - set(cls._spec))
        if unknown:
            raise ValueError(f"{o}: unknown hyper-parameters {unknown}; valid ones are lr, "
                             f"{', '.join(cls._spec)}")
        missing = [k for k in cls._spec if k not in hp]
        if missing:
            raise ValueError(f"{o}: hyper-parameters {missing} are missing")
        out = {k: check(o, k, hp[k]) for k, check in cls._spec.items()}
        cls._cross_check(out)
        return out

    @classmethod
    def _cross_check(cls, hp: dict[str, Any]) -> None:
        """Rules that tie hyper-parameters together; raise ValueError."""

    @staticmethod
    def _state_keys(hp: dict[str, Any]) -> tuple[str, ...]:
        return ()

    def _scratch_count(self) -> int:
        return 1

    def _update(self, p: np.ndarray, g: np.ndarray, state: dict[str, np.ndarray],
                scratch: list[np.ndarray], step: int) -> None:
        raise NotImplementedError

    def _after_load(self) -> None:
        """Called at the end of load_state_dict (reset caches derived from the state)."""

    # -- public API ---------------------------------------------------------------------
    @property
    def lr(self) -> float:
        """The learning rate of the next step: ``scheduled_lr * lr_scale`` (``scheduled_lr``
        itself outside a warm-up). Setting it sets ``scheduled_lr``; it may change between
        steps."""
        return self._lr * self._lr_scale

    @lr.setter
    def lr(self, value: float) -> None:
        self._lr = _number(type(self).__name__, "lr", value)

    @property
    def scheduled_lr(self) -> float:
        """The learning rate that LR schedules read and set and checkpoints keep (the rate
        of every step outside a warm-up)."""
        return self._lr

    @scheduled_lr.setter
    def scheduled_lr(self, value: float) -> None:
        self._lr = _number(type(self).__name__, "scheduled_lr", value)

    @property
    def lr_scale(self) -> float:
        """The factor a warm-up applies to ``scheduled_lr`` (1 outside a warm-up)."""
        return self._lr_scale

    @lr_scale.setter
    def lr_scale(self, value: float) -> None:
        self._lr_scale = _number(type(self).__name__, "lr_scale", value)

    @property
    def clip_grad_norm(self) -> float | None:
        """The global gradient norm each step clips to first (None: no clipping)."""
        return self._clip

    @clip_grad_norm.setter
    def clip_grad_norm(self, value: float | None) -> None:
        self._clip = None if value is None else _positive(type(self).__name__,
                                                          "clip_grad_norm", value)

    def hyperparameters(self) -> dict[str, Any]:
        """The hyper-parameters other than lr, by name."""
        return dict(self._hp)

    def param_pairs(self) -> list[Pair]:
        """The (param, grad) arrays this optimizer updates (re-read from a model)."""
        if self._model is None:
            return self._pairs
        pairs = [(self._model.parameters_flat(), self._model.gradients_flat())]
        if pairs[0][0].shape != self._pairs[0][0].shape:
            raise RuntimeError(f"{type(self).__name__}: the model's parameter buffer changed "
                               f"shape from {self._pairs[0][0].shape} to {pairs[0][0].shape}; "
                               "build a new optimizer for the new model")
        self._pairs = pairs
        return pairs

    def step(self) -> None:
        """Update every parameter array in place from its gradient."""
        pairs = self.param_pairs()
        if len(self._scratch) != len(pairs):
            n = self._scratch_count()
            self._scratch = [[np.empty_like(p) for _ in range(n)] for p, _ in pairs]
        if self._clip is not None:
            from .groups import clip_grad_norm_
            self.grad_norm = clip_grad_norm_([g for _, g in pairs], self._clip)
        step = self.iterations + 1
        for (p, g), state, scratch in zip(pairs, self.state, self._scratch):
            self._update_pieces(p, g, state, scratch, step)
        self.iterations = step

    def _update_pieces(self, p, g, state, scratch, step) -> None:
        """``_update`` over contiguous pieces of a long flat buffer, one per kernel thread
        (every update rule here is elementwise: the same numbers as one call). vgg11bn's
        SGD step (9.7M parameters) took 6.3 ms on one thread while the other waited."""
        from .. import kernels  # the kernels' threads (fn(0, n) on the NumPy backend)
        arrays = [p, g, *state.values(), *scratch]
        if p.ndim != 1 or any(a.ndim != 1 or a.shape != p.shape for a in arrays):
            self._update(p, g, state, scratch, step)
            return

        def piece(a, b):
            self._update(p[a:b], g[a:b], {k: v[a:b] for k, v in state.items()},
                         [s[a:b] for s in scratch], step)

        kernels.pieces(p.size, piece)

    def zero_grad(self) -> None:
        """Set every gradient array to zero (layers overwrite gradients anyway)."""
        for _, g in self.param_pairs():
            g.fill(0)

    def state_arrays(self) -> list[np.ndarray]:
        """The live state buffers, in a fixed order (broadcast them in place to sync ranks)."""
        keys = self._state_keys(self._hp)
        return [state[k] for state in self.state for k in keys]

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume exactly: name, lr (``scheduled_lr``: a warm-up's
        factor is set again by the warm-up), iterations, hyper-parameters and copies of the
        state arrays (``state[i][key]`` for parameter array i)."""
        return {"optimizer": self.name, "lr": self.scheduled_lr, "iterations": self.iterations,
                "hyperparameters": self.hyperparameters(),
                "state": [{k: a.copy() for k, a in state.items()} for state in self.state]}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        """Restore a ``state_dict()``; state arrays are copied into this optimizer's buffers.

        Raises:
            ValueError: the dict is for another optimizer, lacks a key, or its state does not
                match this optimizer's parameter arrays (number, names or shapes).
        """
        owner = type(self).__name__
        required = ("optimizer", "lr", "iterations", "hyperparameters", "state")
        missing = [k for k in required if k not in d]
        if missing:
            raise ValueError(f"{owner}.load_state_dict: the state dict lacks {missing}; pass "
                             "what state_dict() returned")
        if d["optimizer"] != self.name:
            raise ValueError(f"{owner}.load_state_dict: the state dict is for optimizer "
                             f"{d['optimizer']!r}, this one is {self.name!r}")
        hp = self._check(dict(d["hyperparameters"]))
        keys = self._state_keys(hp)
        states = list(d["state"])
        if len(states) != len(self._pairs):
            raise ValueError(f"{owner}.load_state_dict: the state dict holds state for "
                             f"{len(states)} parameter arrays, this optimizer has "
                             f"{len(self._pairs)}")
        for i, (state, (p, _)) in enumerate(zip(states, self._pairs)):
            if set(state) != set(keys):
                raise ValueError(f"{owner}.load_state_dict: state[{i}] has keys "
                                 f"{sorted(state)}, expected {sorted(keys)} for "
                                 f"hyper-parameters {hp}")
            for k in keys:
                shape = np.shape(state[k])
                if shape != p.shape:
                    raise ValueError(f"{owner}.load_state_dict: state[{i}][{k!r}] has shape "
                                     f"{shape}, expected {p.shape} (the shape of parameter "
                                     f"array {i})")
        iterations = d["iterations"]
        if isinstance(iterations, bool) or int(iterations) != iterations or iterations < 0:
            raise ValueError(f"{owner}.load_state_dict: iterations must be an integer >= 0, "
                             f"got {iterations!r}")
        self.scheduled_lr = d["lr"]
        self._hp = hp
        new_state = []
        for state, old, (p, _) in zip(states, self.state, self._pairs):
            fresh = {}
            for k in keys:
                buf = old.get(k)
                if buf is None:
                    buf = np.empty_like(p)
                np.copyto(buf, state[k], casting="same_kind")
                fresh[k] = buf
            new_state.append(fresh)
        self.state = new_state
        self.iterations = int(iterations)
        self._scratch = []
        self._after_load()

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self._hp.items())
        return f"{type(self).__name__}(lr={self.scheduled_lr!r}, {args})"


class SGD(Optimizer):
    """Stochastic gradient descent with optional (Nesterov) momentum and weight decay
    (torch.optim.SGD).

    Args:
        params: a built model, or a list of (param_array, grad_array) pairs.
        lr: learning rate, >= 0.
        momentum: momentum factor, >= 0 (0: plain SGD).
        nesterov: Nesterov momentum; needs momentum > 0 and dampening == 0.
        weight_decay: L2 penalty added to the gradient, >= 0.
        dampening: dampening of the momentum, in [0, 1].

    Example:
        opt = SGD(model, lr=0.01, momentum=0.9, nesterov=True)
        model.backward(dy); opt.step()
    """

    name = "sgd"
    _spec = {"momentum": _number, "nesterov": _flag, "weight_decay": _number,
             "dampening": _unit}

    def __init__(self, params: Any, lr: float = 0.01, momentum: float = 0.0,
                 nesterov: bool = False, weight_decay: float = 0.0, dampening: float = 0.0):
        super().__init__(params, lr, momentum=momentum, nesterov=nesterov,
                         weight_decay=weight_decay, dampening=dampening)

    @classmethod
    def _cross_check(cls, hp):
        if hp["nesterov"] and (hp["momentum"] <= 0 or hp["dampening"] != 0):
            raise ValueError(f"{cls.__name__}: nesterov=True needs momentum > 0 and dampening "
                             f"== 0, got momentum={hp['momentum']}, dampening="
                             f"{hp['dampening']}; set momentum (e.g. 0.9) or nesterov=False")

    @staticmethod
    def _state_keys(hp):
        return ("momentum_buffer",) if hp["momentum"] != 0 else ()

    def _update(self, p, g, state, scratch, step):
        F.sgd_update_(p, g, state.get("momentum_buffer"), lr=self.lr, first_step=step == 1,
                      scratch=scratch, **self._hp)
