"""``TorchState``: the elastic state of a PyTorch job (Horovod's ``TorchState``): modules,
optimizers and ``ElasticSampler``s by their state dicts, anything else as a plain object.

Each kind has a handler that keeps a deep copy of the value's ``state_dict()`` at
``save()``, loads it back at ``restore()``, and makes rank 0's the everyone's at ``sync()``
(``broadcast_parameters``, ``broadcast_optimizer_state``, ``broadcast_object``). Committed
state travels to the next world as ``torch.save`` bytes.
"""
from __future__ import annotations

import copy
import io
from typing import Any

import torch

from ..functions import broadcast_object, broadcast_optimizer_state, broadcast_parameters
from .sampler import ElasticSampler
from .state import ObjectState

__all__ = ["TorchState"]


class _Handler:
    """Keeps one value's committed ``state_dict`` (deep copy)."""

    def __init__(self, value):
        self.value = value
        self.saved = copy.deepcopy(value.state_dict())

    def save(self) -> None:
        self.saved = copy.deepcopy(self.value.state_dict())

    def restore(self) -> None:
        self.value.load_state_dict(copy.deepcopy(self.saved))

    def set_value(self, value) -> None:
        self.value = value
        self.save()


class _ModelHandler(_Handler):
    def sync(self) -> None:
        broadcast_parameters(self.value.state_dict(), root_rank=0)


class _OptimizerHandler(_Handler):
    def sync(self) -> None:
        broadcast_optimizer_state(self.value, root_rank=0)


class _SamplerHandler(_Handler):
    def sync(self) -> None:
        self.value.load_state_dict(broadcast_object(self.value.state_dict(), 0))


_HANDLERS = [(torch.nn.Module, _ModelHandler), (torch.optim.Optimizer, _OptimizerHandler),
             (ElasticSampler, _SamplerHandler)]


def _handler(value) -> _Handler | None:
    # (hvd.DistributedOptimizer is a subclass of the optimizer's class)
    for kind, handler in _HANDLERS:
        if isinstance(value, kind):
            return handler(value)
    return None


class TorchState(ObjectState):
    """State of a PyTorch job, kept in memory across resets (Horovod's ``TorchState``).

    Args:
        model: a ``torch.nn.Module`` (optional).
        optimizer: a torch optimizer or ``hvd.DistributedOptimizer`` (optional).
        kwargs: more values, as attributes: modules, optimizers and ``ElasticSampler``s
            are kept by their state dicts, anything else (``epoch=0``, ``batch=0``) as a
            deep copy.

    Example:
        state = hvd.elastic.TorchState(model, optimizer, epoch=0, batch=0)
        train(state)   # a function decorated with @hvd.elastic.run
    """

    def __init__(self, model: torch.nn.Module | None = None, optimizer: Any = None,
                 **kwargs):
        kwargs.update(model=model, optimizer=optimizer)
        handlers, plain = {}, {}
        for name, value in kwargs.items():
            h = _handler(value) if value is not None else None
            if h is None:
                plain[name] = value
            else:
                handlers[name] = h
        object.__setattr__(self, "_handlers", handlers)
        for name, h in handlers.items():
            object.__setattr__(self, name, h.value)
        super().__init__(**plain)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self.__dict__.get("_handlers", {}):
            self._handlers[name].set_value(value)
        object.__setattr__(self, name, value)

    def save(self) -> None:
        for h in self._handlers.values():
            h.save()
        super().save()

    def restore(self) -> None:
        for h in self._handlers.values():
            h.restore()
        super().restore()

    def sync(self) -> None:
        for h in self._handlers.values():
            h.sync()
        super().sync()

    def _dumps(self) -> bytes:
        buf = io.BytesIO()
        torch.save({"handlers": {n: h.saved for n, h in self._handlers.items()},
                    "objects": self._saved_state}, buf)
        return buf.getvalue()

    def _loads(self, payload: bytes) -> None:
        data = torch.load(io.BytesIO(payload), weights_only=False)
        for name, saved in data["handlers"].items():
            if name in self._handlers:
                self._handlers[name].saved = saved
        self._saved_state = data["objects"]
        self.restore()
