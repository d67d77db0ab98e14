"""A built model as a ``torch.nn.Module``, layer for layer, with its weights copied.

``to_torch(model)`` returns an ``nn.Sequential`` in evaluation mode (batch norm on its
running statistics, dropout off) in the model's dtype, each layer's module made by the
layer itself (``Layer.torch_module``, in its family module): ``Conv2D`` -> ``nn.Conv2d`` (with
an ``nn.ZeroPad2d`` before it where distnn's padding is not the same on both sides, as
"same" with an even kernel), ``Dense`` -> ``nn.Linear`` (its weight is ``w.T``),
``BatchNormalization`` -> ``nn.BatchNorm2d``/``1d`` (PyTorch's momentum is 1 - distnn's),
the pools, activations, ``Flatten``, ``Dropout``, and ``Add``/``Concat`` blocks as the
modules ``AddBlock``/``ConcatBlock`` below (an empty branch is ``nn.Identity``).
``save_torch`` writes it as TorchScript, which ``torch.jit.load`` reads without distnn.

Needs torch (``pip install 'distnn[torch]'``).
"""
from __future__ import annotations

import os

import numpy as np

from .onnx_export import exportable, layer_kind

try:
    import torch
    from torch import nn
except ImportError:  # the module still imports; to_torch says what to install
    torch = nn = None

__all__ = ["to_torch", "save_torch", "convert", "tensor"]

if nn is not None:
    class AddBlock(nn.Module):
        """Sum of parallel branches fed the same input (distnn's ``Add``)."""

        def __init__(self, branches):
            super().__init__()
            self.branches = nn.ModuleList(branches)

        def forward(self, x):
            outs = [b(x) for b in self.branches]
            y = outs[0]
            for out in outs[1:]:
                y = y + out
            return y

    class ConcatBlock(nn.Module):
        """Channel concatenation of parallel branches (distnn's ``Concat``)."""

        def __init__(self, branches):
            super().__init__()
            self.branches = nn.ModuleList(branches)

        def forward(self, x):
            return torch.cat([b(x) for b in self.branches], dim=1)


def tensor(a: np.ndarray):
    """A torch tensor holding a copy of ``a`` (the layers' ``torch_module`` use it)."""
    return torch.from_numpy(np.array(a, copy=True))


def convert(layer):
    """``layer``'s torch module through its own declaration (``Layer.torch_module``)."""
    if layer_kind(layer) is None or not type(layer).declares("torch_module"):
        raise ValueError(f"to_torch: layer {layer.name!r} ({type(layer).__name__}) has "
                         f"no PyTorch form; the convertible layers are "
                         f"{exportable('torch_module')}")
    return layer.torch_module()


def to_torch(model):
    """A ``torch.nn.Sequential`` computing ``model``'s inference (see the module doc)."""
    if torch is None:
        raise ImportError("to_torch needs torch: pip install 'distnn[torch]'")
    if not getattr(model, "built", False):
        raise ValueError("to_torch: the model is not built; call model.build(input_shape)")
    module = convert(model)
    dtype = torch.float64 if np.dtype(model.dtype) == np.float64 else torch.float32
    return module.to(dtype).eval()


def save_torch(model, path: str | os.PathLike) -> str:
    """Write ``to_torch(model)`` as TorchScript (``torch.jit.load(path)`` reads it back
    with torch alone); returns the path."""
    import warnings

    from ..fileio import atomic_open
    module = to_torch(model)
    example = torch.zeros((2, *model.input_shape),
                          dtype=next(module.parameters(), torch.zeros(0)).dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TorchScript's deprecation notice
        scripted = torch.jit.trace(module, example)
    with atomic_open(os.fspath(path)) as f:
        torch.jit.save(scripted, f)
    return os.fspath(path)
