"""A Theano-MPI model class behind distnn's model interface, for its training rules.

Theano-MPI's ``ModelClass(config)`` owns its data (``model.data``, a DataClass with
``n_batch_train``/``n_batch_val``), compiles its own functions (``compile_iter_fns``) and
takes a whole training step in ``train_iter(count, recorder)`` (a ``theano.function``
whose ``updates`` apply its optimizer). What crosses MPI is ``model.params``, a list of
shared variables. ``ModelClassModel`` copies them into one flat buffer (a *unit* per
shared variable, as ``distnn.torch.TorchModel`` has one per module), so distnn's rules
exchange them as they exchange any model's weights:

* before a step the flat buffer holds the weights; after ``train_iter`` the step's move
  ``before - after`` is the "gradient" (``gradients_flat``) and ``DeltaStep`` (the
  optimizer the rule drives) applies it back, ``params -= grads``. Under ``data`` (BSP)
  the moves are summed over the ranks first, each scaled by 1/N: every rank takes the
  mean move, which for SGD with or without momentum is the step of one process on the
  global batch (the momenta are linear in the gradients);
* ``push()`` writes the flat buffer back into the shared variables (after every exchange).
"""
from __future__ import annotations

from typing import Any, Iterator

import numpy as np

MODEL_METHODS = ("compile_iter_fns", "train_iter", "val_iter")


class SharedUnit:
    """One shared variable of ``model.params``: a "layer" with one parameter, ``value``."""

    def __init__(self, name: str, variable):
        self.name = name
        self.variable = variable
        self.params: dict[str, np.ndarray] = {}
        self.grads: dict[str, np.ndarray] = {}
        self.buffers: dict[str, np.ndarray] = {}

    def sublayers(self) -> list:
        return []

    def walk(self) -> Iterator["SharedUnit"]:
        yield self


def is_model_class(obj) -> bool:
    """Whether ``obj`` (a class or an instance) has Theano-MPI's ModelClass methods."""
    return all(callable(getattr(obj, name, None)) for name in MODEL_METHODS)


class ModelClassModel:
    """``model.params`` of a Theano-MPI model instance as distnn's flat buffers.

    Args:
        instance: the ModelClass instance (built, ``compile_iter_fns`` called or not).

    Example:
        model = ModelClassModel(Cifar10_model(config)); model.pull()
    """

    def __init__(self, instance: Any):
        params = getattr(instance, "params", None)
        if not isinstance(params, (list, tuple)) or not params:
            raise ValueError(f"{type(instance).__name__}.params must be a non-empty list of "
                             f"shared variables (Theano-MPI's protocol), got {params!r}")
        values = []
        for i, p in enumerate(params):
            if not hasattr(p, "get_value") or not hasattr(p, "set_value"):
                raise ValueError(f"{type(instance).__name__}.params[{i}] is "
                                 f"{type(p).__name__}, not a shared variable "
                                 "(theano.shared(...))")
            values.append(np.asarray(p.get_value()))
        dtypes = {v.dtype for v in values}
        if len(dtypes) != 1:
            raise ValueError(f"{type(instance).__name__}.params mix dtypes "
                             f"{sorted(str(d) for d in dtypes)}; use one floatX for all")
        self.instance = instance
        self.dtype = values[0].dtype
        self.name = type(instance).__name__
        self.grad_hooks: list = []
        total = sum(v.size for v in values)
        self._params_flat = np.zeros(total, self.dtype)
        self._grads_flat = np.zeros(total, self.dtype)
        self.layers: list[SharedUnit] = []
        self._ranges: list[tuple[SharedUnit, int, int]] = []
        offset = 0
        for i, (p, v) in enumerate(zip(params, values)):
            name = f"{i}.{getattr(p, 'name', None) or 'param'}"
            unit = SharedUnit(name, p)
            lo, hi = offset, offset + v.size
            unit.params["value"] = self._params_flat[lo:hi].reshape(v.shape)
            unit.grads["value"] = self._grads_flat[lo:hi].reshape(v.shape)
            self.layers.append(unit)
            self._ranges.append((unit, lo, hi))
            offset = hi
        self.pull()

    # -- the model interface the rules use ---------------------------------------------
    def parameters_flat(self) -> np.ndarray:
        return self._params_flat

    def gradients_flat(self) -> np.ndarray:
        return self._grads_flat

    def layer_ranges(self) -> list[tuple[SharedUnit, int, int]]:
        return list(self._ranges)

    def sublayers(self) -> list[SharedUnit]:
        return list(self.layers)

    def walk(self) -> Iterator[SharedUnit]:
        yield from self.layers

    def named_arrays(self) -> dict[str, np.ndarray]:
        return {f"{u.name}/value": u.params["value"] for u in self.layers}

    def num_params(self) -> int:
        return int(self._params_flat.size)

    # -- the shared variables <-> the flat buffer --------------------------------------
    def pull(self) -> None:
        """The shared variables' values into the flat parameter buffer."""
        for unit in self.layers:
            unit.params["value"][...] = unit.variable.get_value(borrow=True)

    def push(self) -> None:
        """The flat parameter buffer into the shared variables."""
        for unit in self.layers:
            unit.variable.set_value(unit.params["value"].copy())

    def record_move(self, scale: float) -> None:
        """After ``train_iter``: the gradient buffer = ``scale * (before - after)``, the
        parameter buffer still holding ``before``; the grad hooks fire (the all-reduce of
        each bucket may start), last unit first as a backward pass would."""
        for unit in self.layers:
            after = unit.variable.get_value(borrow=True)
            np.subtract(unit.params["value"], after, out=unit.grads["value"])
        if scale != 1.0:
            self._grads_flat *= scale
        for unit in reversed(self.layers):
            for hook in self.grad_hooks:
                hook(unit)


class DeltaStep:
    """The optimizer a rule drives over a ``ModelClassModel``: ``params -= grads`` (the
    model class's own optimizer already made the move; this applies it, combined or not).
    It keeps no state."""

    lr = 1.0
    iterations = 0

    def __init__(self, model: ModelClassModel):
        self.model = model

    def step(self) -> None:
        self.model.parameters_flat()[...] -= self.model.gradients_flat()
        self.iterations += 1

    def zero_grad(self) -> None:
        self.model.gradients_flat()[...] = 0

    def state_arrays(self) -> list[np.ndarray]:
        return []

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass
