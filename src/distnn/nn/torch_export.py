"""A built model as a ``torch.nn.Module``, layer for layer, with its weights copied.

``to_torch(model)`` returns an ``nn.Sequential`` in evaluation mode (batch norm on its
running statistics, dropout off) in the model's dtype: ``Conv2D`` -> ``nn.Conv2d`` (with
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

from .onnx_export import CHAINS, layer_kind

try:
    import torch
    from torch import nn
except ImportError:  # the module still imports; to_torch says what to install
    torch = nn = None

__all__ = ["to_torch", "save_torch"]

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


def _tensor(a: np.ndarray):
    return torch.from_numpy(np.array(a, copy=True))


def _conv(layer):
    f, c, kh, kw = layer.params["w"].shape
    pt, pb, pl, pr = layer._pads
    even = pt == pb and pl == pr
    conv = nn.Conv2d(c, f, (kh, kw), stride=layer.strides, dilation=layer.dilation,
                     padding=(pt, pl) if even else 0, bias=layer.use_bias)
    conv.weight.data = _tensor(layer.params["w"])
    if layer.use_bias:
        conv.bias.data = _tensor(layer.params["b"])
    return conv if even else nn.Sequential(nn.ZeroPad2d((pl, pr, pt, pb)), conv)


def _batchnorm(layer):
    c = layer.params["gamma"].shape[0]
    spatial = len(layer.input_shape) - 1
    cls = {0: nn.BatchNorm1d, 1: nn.BatchNorm1d, 2: nn.BatchNorm2d, 3: nn.BatchNorm3d}[spatial]
    bn = cls(c, eps=layer.epsilon, momentum=1.0 - layer.momentum)
    bn.weight.data = _tensor(layer.params["gamma"])
    bn.bias.data = _tensor(layer.params["beta"])
    bn.running_mean.data = _tensor(layer.buffers["running_mean"])
    bn.running_var.data = _tensor(layer.buffers["running_var"])
    return bn


def _block(layer):
    branches = [_chain(b.layers) if b.layers else nn.Identity() for b in layer.branches]
    return (ConcatBlock if layer_kind(layer) == "Concat" else AddBlock)(branches)


# Layer class name -> module maker (by name, as the ONNX writers: see layer_kind).
_MODULES = {
    "Conv2D": _conv, "BatchNormalization": _batchnorm,
    "Flatten": lambda layer: nn.Flatten(),
    "Dropout": lambda layer: nn.Dropout(layer.rate),
    "ReLU": lambda layer: nn.ReLU(),
    "LeakyReLU": lambda layer: nn.LeakyReLU(layer.alpha),
    "Sigmoid": lambda layer: nn.Sigmoid(), "Tanh": lambda layer: nn.Tanh(),
    "Softmax": lambda layer: nn.Softmax(dim=-1),
    "MaxPool2D": lambda layer: nn.MaxPool2d(layer.pool_size, layer.strides, layer.padding),
    "AvgPool2D": lambda layer: nn.AvgPool2d(layer.pool_size, layer.strides, layer.padding,
                                            count_include_pad=True),
    "GlobalAvgPool2D": lambda layer: nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten()),
    "Add": _block, "Concat": _block,
}


def _chain(layers):
    modules = []
    for layer in layers:
        kind = layer_kind(layer)
        if kind in CHAINS:
            modules.append(_chain(layer.layers))
            continue
        make = _MODULES.get(kind)
        if make is None and type(layer).declares("torch_module"):  # the layer's own
            make = lambda layer: layer.torch_module()  # noqa: E731
        if make is None:
            raise ValueError(f"to_torch: layer {layer.name!r} ({type(layer).__name__}) has "
                             f"no PyTorch form; the convertible layers are {sorted(_MODULES)}")
        modules.append(make(layer))
    return nn.Sequential(*modules)


def to_torch(model):
    """A ``torch.nn.Sequential`` computing ``model``'s inference (see the module doc)."""
    if torch is None:
        raise ImportError("to_torch needs torch: pip install 'distnn[torch]'")
    if not getattr(model, "built", False):
        raise ValueError("to_torch: the model is not built; call model.build(input_shape)")
    module = _chain(model.layers)
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
