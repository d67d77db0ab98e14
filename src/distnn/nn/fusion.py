"""Fusion of a layer and the ReLU after it, decided in one place: this pass over a built
model's chains links each pair the kernel planner fuses (``planner.fuses`` by name), and
runs the chains so that a linked ReLU passes its partner's already rectified output on.

A layer that can take the ReLU after it into its own pass declares the planner's name for
that fusion (``relu_fusion``: ``BatchNormalization`` "bn_relu", ``Add`` "add_relu"), and
answers ``fuse_relu(relu, ...)`` (the link) and ``rectified`` (whether its last output is
already max(., 0)). No layer writes another's fields: the chain (``forward_steps``) calls
the ReLU's ``pass_on``, and hands a fused ``Add`` the gradient that the fused block after
it already masked (``backward_steps``). Results are bit for bit those of the layers apart.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from ..kernels import planner as plan
from ..kernels.backend import compiled
from .activations import ReLU
from .base import Layer

LayerCall = Callable[[Layer], None]


def link(layers: Sequence[Layer], fusion: str, enabled: bool = True) -> None:
    """Link, in one chain (in order), every layer declaring ``fusion`` that the planner
    fuses for its dtype and that a ReLU directly follows; ``enabled=False`` unlinks them.
    A fused ``Add`` is also told of the fused Add + ReLU pair right before it, whose ReLU
    mask it may apply in its sum of gradients."""
    layers = list(layers)
    for i, layer in enumerate(layers):
        if getattr(type(layer), "relu_fusion", None) != fusion:
            continue
        nxt = layers[i + 1] if i + 1 < len(layers) else None
        relu = nxt if (enabled and type(nxt) is ReLU
                       and plan.fuses(fusion, layer.dtype or np.float32)) else None
        if fusion != "add_relu":
            layer.fuse_relu(relu)
            continue
        up = layers[i - 2] if i >= 2 else None
        linked = getattr(up, "fused_relu", None) is layers[i - 1] and type(up) is type(layer)
        layer.fuse_relu(relu, up if linked else None)


def set_fusion(model: Layer, fusion: str, enabled: bool) -> None:
    """Fuse or unfuse every pair of kind ``fusion`` (a planner name) of a built model."""
    for layer in model.walk():
        chain = getattr(layer, "layers", None)
        if isinstance(chain, list):
            link(chain, fusion, enabled)


def set_bn_relu_fusion(model: Layer, enabled: bool) -> None:
    """Fuse (True, the default after building) or unfuse every BatchNormalization + ReLU
    pair of a built model; results are the same either way."""
    set_fusion(model, "bn_relu", enabled)


def set_add_relu_fusion(model: Layer, enabled: bool) -> None:
    """Fuse (True, the default after building) or unfuse every Add + ReLU pair of a built
    model; results are the same either way."""
    set_fusion(model, "add_relu", enabled)


def link_all(layers: Sequence[Layer]) -> None:
    """Every fusion of one chain, as building it links them."""
    for fusion in plan.FUSIONS:
        link(layers, fusion)


# -- running a chain --------------------------------------------------------------------
def forward_steps(layers: Sequence[Layer], x: np.ndarray, training: bool,
                  before: LayerCall | None = None) -> np.ndarray:
    """The layers in order; a ReLU linked to the layer before it passes that layer's
    output on where it is already rectified. ``before(layer)`` runs before each."""
    prev = None
    for layer in layers:
        if before is not None:
            before(layer)
        if getattr(prev, "fused_relu", None) is layer and prev.rectified:
            x = layer.pass_on(x)
        else:
            x = layer.forward(x, training)
        prev = layer
    return x


def backward_steps(layers: Sequence[Layer], dy: np.ndarray,
                   before: LayerCall | None = None,
                   after: LayerCall | None = None) -> np.ndarray | None:
    """Backward through the layers in reverse; a fused ``Add`` whose gradient the fused
    block after it already masked with its ReLU gets it as such (``backward_masked``)."""
    masked = None  # the fused Add the last block masked its dx for
    for layer in reversed(layers):
        if before is not None:
            before(layer)
        dy = layer.backward_masked(dy) if layer is masked else layer.backward(dy)
        if after is not None:
            after(layer)
        if getattr(layer, "masked_upstream", False):
            masked = layer.upstream
        elif layer is not getattr(masked, "fused_relu", None):
            masked = None
    return dy


# -- the Add + ReLU kernels -------------------------------------------------------------
def add_relu_applies(dtype) -> bool:
    """Whether an Add + ReLU pair runs fused for this dtype: a compiled backend, and the
    planner fusing it (``planner.fuses("add_relu", ...)``, its switch read at run time)."""
    return compiled() is not None and plan.fuses("add_relu", dtype)


def add_relu(a: np.ndarray, b: np.ndarray) -> np.ndarray | None:
    """max(a + b, 0) in one compiled pass into a new array; None where the kernel does not
    take these arrays (shapes or dtypes differ, empty or not contiguous)."""
    if not (a.shape == b.shape and a.dtype == b.dtype and a.size and a.flags.c_contiguous
            and b.flags.c_contiguous):
        return None
    y = np.empty_like(a)
    compiled().add_relu(a, b, y)
    return y


def relu_mask(dy: np.ndarray, y: np.ndarray) -> np.ndarray:
    """dy * (y > 0) into a new array (the compiled kernel where it takes the arrays)."""
    fast = compiled()
    if (fast is not None and dy.shape == y.shape and dy.dtype == y.dtype
            and dy.flags.c_contiguous and y.flags.c_contiguous):
        g = np.empty_like(dy)
        fast.relu_backward(dy, y, g)
        return g
    return dy * (y > 0)
