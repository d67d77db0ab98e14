"""TorchModel: a ``torch.nn.Module`` behind distnn's model interface.

The trainer, the training rules, distnn's optimizers, ``DistributedOptimizer``,
checkpoints, weights files, evaluate and predict all use a model through the interface of
``distnn.nn.Sequential``: ``forward(x, training)`` returning NumPy logits,
``backward(dlogits)``, one flat parameter buffer and one flat gradient buffer,
``layer_ranges()`` and ``grad_hooks`` for the bucketed all-reduce, ``walk()`` and
``named_arrays()`` for state. ``TorchModel`` gives a torch module that interface:

* every parameter's ``.data`` and ``.grad`` are views into two flat NumPy buffers (in the
  order of ``module.named_modules()``), so distnn's optimizers, collectives and
  checkpoints work on them with no torch code and no copies;
* a *unit* is a submodule that owns parameters or buffers directly; it plays the part of
  a layer (``params``/``grads``/``buffers`` dicts of NumPy views, a name = its module path);
* a post-accumulate-grad hook per parameter calls ``grad_hooks`` with a unit once all its
  parameters have their gradient, so the all-reduce of a bucket starts during backward.
"""
from __future__ import annotations

from typing import Callable, Iterator, Sequence

import numpy as np
import torch

from ..nn.model import ModelMethods

_TORCH_DTYPES = {np.dtype(np.float32): torch.float32, np.dtype(np.float64): torch.float64}


class TorchUnit:
    """A submodule that owns parameters or buffers directly: a "layer" of a TorchModel."""

    def __init__(self, owner: "TorchModel", path: str, module: torch.nn.Module):
        self.owner = owner
        self.path = path
        self.name = path or "module"
        self.module = module
        self.params: dict[str, np.ndarray] = {}
        self.grads: dict[str, np.ndarray] = {}
        self.output_shape: tuple[int, ...] | None = None
        self.input_shape: tuple[int, ...] | None = None
        self._reducer = None

    @property
    def buffers(self) -> dict[str, np.ndarray]:
        """Buffers (e.g. BatchNorm running statistics) as NumPy views, read afresh: a
        module may rebind a buffer attribute."""
        return {k: b.numpy() for k, b in self.module.named_buffers(recurse=False)
                if b is not None}

    @property
    def stat_reducer(self):
        """None, or the reducer ``distributed.sync_batchnorm`` set: then this unit's
        BatchNorm computes statistics over the global batch (``SyncBatchNorm``). Only
        BatchNorm units have it (``hasattr`` is False on the others)."""
        if not _is_batchnorm(self.module):
            raise AttributeError("stat_reducer")
        return self._reducer

    @stat_reducer.setter
    def stat_reducer(self, reducer) -> None:
        from .batchnorm import SyncBatchNorm, convert_sync_batchnorm
        if not _is_batchnorm(self.module):
            raise AttributeError(f"unit {self.name!r} ({type(self.module).__name__}) is not "
                                 "a batch normalization")
        self._reducer = reducer
        comm = getattr(reducer, "comm", None)
        if isinstance(self.module, SyncBatchNorm):
            self.module.comm = comm
        elif reducer is not None:
            self.owner._replace(self, convert_sync_batchnorm(self.module, comm))

    def sublayers(self) -> list:
        return []

    def walk(self) -> Iterator["TorchUnit"]:
        yield self

    @property
    def num_params(self) -> int:
        return int(sum(p.size for p in self.params.values()))

    def describe(self) -> str:
        text = repr(self.module).split("\n")[0]
        return text if len(text) < 60 else text[:57] + "..."

    def forward(self, x, training=False):
        raise RuntimeError(f"unit {self.name!r} of a TorchModel runs inside the module's "
                           "forward; call TorchModel.forward")

    backward = forward

    def __repr__(self) -> str:
        return f"TorchUnit({self.name!r}, {type(self.module).__name__})"


def _is_batchnorm(module) -> bool:
    return isinstance(module, torch.nn.modules.batchnorm._BatchNorm)


class TorchModel(ModelMethods):
    """A torch module presented as a distnn model (see the module doc).

    Args:
        module: the ``torch.nn.Module``; it is converted to ``dtype`` and its parameters
            become views of the flat buffers (keep using the module: it is the same object).
        input_shape: per-sample input shape (no batch axis); one dry forward of one zero
            sample checks it and finds the output shape.
        dtype: float32 or float64.
        name: the model's name (summary, checkpoints).

    Example:
        model = TorchModel(torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 10)),
                           (1, 28, 28))
        Trainer(model, SGD(model, lr=0.1)).fit(splits.train, epochs=1)
    """

    def __init__(self, module: torch.nn.Module, input_shape: Sequence[int], *,
                 dtype=np.float32, name: str | None = None):
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"TorchModel wraps a torch.nn.Module, got {type(module).__name__}")
        self.dtype = np.dtype(dtype)
        if self.dtype not in _TORCH_DTYPES:
            raise ValueError(f"dtype={self.dtype} is not supported; use float32 or float64")
        self.module = module.to(_TORCH_DTYPES[self.dtype])
        self.name = name or type(module).__name__.lower()
        self.input_shape = tuple(int(s) for s in input_shape)
        self.params: dict[str, np.ndarray] = {}
        self.buffers: dict[str, np.ndarray] = {}
        self.grad_hooks: list[Callable] = []
        self.built = True
        self._out: torch.Tensor | None = None
        self._flatten()
        self.output_shape = self._dry_run()

    # -- layout -------------------------------------------------------------------------
    def _flatten(self) -> None:
        units, seen = [], set()
        entries: list[tuple[TorchUnit, str, torch.nn.Parameter]] = []
        for path, mod in self.module.named_modules():
            own = [(k, p) for k, p in mod.named_parameters(recurse=False)
                   if p is not None and id(p) not in seen and p.requires_grad]
            has_buffers = any(b is not None for _, b in mod.named_buffers(recurse=False))
            if not own and not has_buffers:
                continue
            unit = TorchUnit(self, path, mod)
            units.append(unit)
            for k, p in own:
                seen.add(id(p))
                entries.append((unit, k, p))
        total = sum(p.numel() for _, _, p in entries)
        self._params_flat = np.empty(total, dtype=self.dtype)
        self._grads_flat = np.zeros(total, dtype=self.dtype)
        flat_p = torch.from_numpy(self._params_flat)
        flat_g = torch.from_numpy(self._grads_flat)
        self._ranges: dict[int, list[int]] = {}
        self._param_unit: list[int] = []
        self._grad_ptrs: list[int] = []
        offset = 0
        with torch.no_grad():
            for unit, key, p in entries:
                n = p.numel()
                view = flat_p[offset:offset + n].view_as(p)
                view.copy_(p.data)
                p.data = view
                p.grad = flat_g[offset:offset + n].view_as(p)
                unit.params[key] = self._params_flat[offset:offset + n].reshape(p.shape)
                unit.grads[key] = self._grads_flat[offset:offset + n].reshape(p.shape)
                lo_hi = self._ranges.setdefault(id(unit), [offset, offset + n])
                lo_hi[1] = offset + n
                offset += n
        self.layers = units
        self._with_params = [u for u in units if u.params]
        index = {id(u): i for i, u in enumerate(self._with_params)}
        self._counts = [len(u.params) for u in self._with_params]
        self._pending = list(self._counts)
        self._params = [p for _, _, p in entries]
        self._param_offsets = [0] + list(np.cumsum([p.numel() for p in self._params])[:-1])
        for j, (unit, _, p) in enumerate(entries):
            self._param_unit.append(index[id(unit)])
            self._grad_ptrs.append(p.grad.data_ptr())
            p.register_post_accumulate_grad_hook(lambda param, j=j: self._on_grad(j, param))

    def _replace(self, unit: TorchUnit, new: torch.nn.Module) -> None:
        """Put ``new`` where ``unit.module`` is (SyncBatchNorm conversion keeps tensors)."""
        if not unit.path:
            self.module = new
        else:
            parent_path, _, attr = unit.path.rpartition(".")
            parent = self.module.get_submodule(parent_path) if parent_path else self.module
            setattr(parent, attr, new)
        unit.module = new

    def _dry_run(self) -> tuple[int, ...]:
        shapes: dict[str, tuple[int, ...]] = {}
        handles = [u.module.register_forward_hook(
            lambda m, i, o, u=u: shapes.__setitem__(u.name, tuple(getattr(o, "shape", ())[1:])))
            for u in self.layers]
        was_training = self.module.training
        try:
            self.module.eval()
            with torch.no_grad():
                x = torch.zeros((1,) + self.input_shape, dtype=_TORCH_DTYPES[self.dtype])
                try:
                    out = self.module(x)
                except Exception as exc:
                    raise ValueError(f"model {self.name!r} cannot run on inputs of shape "
                                     f"(batch, {', '.join(map(str, self.input_shape))}): "
                                     f"{type(exc).__name__}: {exc}; check the dataset's "
                                     "sample shape and the module's first layer") from None
        finally:
            for h in handles:
                h.remove()
            self.module.train(was_training)
        if not isinstance(out, torch.Tensor) or out.dim() < 2:
            raise ValueError(f"model {self.name!r} must return a tensor of shape (batch, "
                             f"outputs), got {type(out).__name__} "
                             f"{tuple(getattr(out, 'shape', ()))}")
        for u in self.layers:
            u.output_shape = shapes.get(u.name)
        return tuple(out.shape[1:])

    # -- gradient hooks -----------------------------------------------------------------
    def _on_grad(self, j: int, p: torch.Tensor) -> None:
        if p.grad is None or p.grad.data_ptr() != self._grad_ptrs[j]:
            # Other code replaced the gradient: put it back into the flat buffer.
            g = p.grad
            start, n = self._param_offsets[j], p.numel()
            view = torch.from_numpy(self._grads_flat[start:start + n]).view_as(p)
            with torch.no_grad():
                view.copy_(g) if g is not None else view.zero_()
            p.grad = view
        i = self._param_unit[j]
        self._pending[i] -= 1
        if self._pending[i] == 0 and self.grad_hooks:
            unit = self._with_params[i]
            for hook in self.grad_hooks:
                hook(unit)

    # -- the distnn model interface -----------------------------------------------------
    def parameters_flat(self) -> np.ndarray:
        return self._params_flat

    def gradients_flat(self) -> np.ndarray:
        return self._grads_flat

    def layer_ranges(self) -> list[tuple[TorchUnit, int, int]]:
        """(unit, start, stop) of every unit with parameters, in flat-buffer order."""
        return [(u, *self._ranges[id(u)]) for u in self._with_params]

    def sublayers(self) -> list[TorchUnit]:
        return self.layers

    def walk(self) -> Iterator:
        yield self
        yield from self.layers

    def forward(self, x: np.ndarray, training: bool = False) -> np.ndarray:
        """NumPy logits of the module for a NumPy batch. With ``training`` the graph is
        kept for ``backward``."""
        x = np.ascontiguousarray(x, dtype=self.dtype)
        if tuple(x.shape[1:]) != self.input_shape:
            raise ValueError(f"model {self.name!r} expects input of shape (batch, "
                             f"{', '.join(map(str, self.input_shape))}) but got "
                             f"{tuple(x.shape)}; check the model's input_shape and the "
                             "dataset's sample shape")
        xt = torch.from_numpy(x)
        self.module.train(training)
        if training:
            out = self.module(xt)
            self._out = out
            return out.detach().numpy()
        self._out = None
        with torch.no_grad():
            return self.module(xt).numpy()

    def backward(self, dy: np.ndarray) -> None:
        """Backpropagate ``dy`` (gradient of the loss w.r.t. the logits of the last
        ``forward(training=True)``); the flat gradient buffer is overwritten."""
        if self._out is None:
            raise RuntimeError(f"model {self.name!r}: backward() needs a forward(x, "
                               "training=True) first")
        self._grads_flat[...] = 0
        self._pending = list(self._counts)
        out, self._out = self._out, None
        out.backward(torch.from_numpy(np.ascontiguousarray(dy, dtype=self.dtype)))
        return None

    def __call__(self, x, training=False):
        return self.forward(x, training)

    @property
    def num_params(self) -> int:
        return int(self._params_flat.size)

    def summary(self) -> str:
        rows = [("Module", "Type", "#Params", "Output shape", "Parameters")]
        for u in self.layers:
            shapes = ", ".join(f"{k}{tuple(v.shape)}" for k, v in u.params.items())
            rows.append((u.name, type(u.module).__name__, f"{u.num_params:,}",
                         str(u.output_shape), shapes or "-"))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        line = "+" + "+".join("-" * (w + 2) for w in widths) + "+"

        def fmt(r):
            return "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"

        n = self._params_flat.size
        return "\n".join([f"torch module {type(self.module).__name__} ({self.name})", line,
                          fmt(rows[0]), line.replace("-", "=")] + [fmt(r) for r in rows[1:]]
                         + [line, f"Total parameters: {n:,} ({n * self.dtype.itemsize / 2**20:.2f}"
                            f" MiB, {self.dtype.name}); input shape {self.input_shape}, output "
                            f"shape {self.output_shape}"])

    def __repr__(self) -> str:
        return (f"TorchModel({type(self.module).__name__}, input_shape={self.input_shape}, "
                f"{self._params_flat.size} parameters, {self.dtype.name})")
