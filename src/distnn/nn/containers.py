"""Containers: Sequential (the model) and the two graph blocks, Add and Concat.

A built top-level ``Sequential`` owns two flat contiguous buffers, one of parameters and
one of gradients; every layer's ``params``/``grads`` entries are views into them, laid out
in forward order. Collectives and optimizers work on whole buffers or contiguous slices.
"""
from __future__ import annotations

from typing import Callable, Iterable, Sequence

import numpy as np

from ..kernels import planner as plan
from ..kernels.backend import compiled
from .activations import ReLU
from .base import Layer, check_input
from .model import ModelMethods
from .normalization import BatchNormalization, link_bn_relu
from .sums import _add, _sum_fresh, _sum_into

GradHook = Callable[[Layer], None]
LayerHook = Callable[[str, Layer], None]


def _as_layers(branch) -> list[Layer]:
    if branch is None:
        return []
    if isinstance(branch, Layer):
        return [branch]
    return list(branch)


class _Chain(Layer):
    """Layers applied one after another; shared by Sequential and the block branches."""

    def __init__(self, layers: Iterable[Layer] = (), name: str | None = None):
        super().__init__(name)
        self.layers: list[Layer] = list(layers)

    def sublayers(self) -> list[Layer]:
        return self.layers

    def _build(self, input_shape, rng):
        shape = input_shape
        for layer in self.layers:
            shape = layer.build(shape, rng=rng, dtype=self.dtype)
        link_bn_relu(self.layers)  # a BatchNormalization + ReLU pair runs as one pass
        link_add_relu(self.layers)  # and so does an Add + ReLU pair (compiled path)
        return shape

    def forward(self, x, training=False):
        for layer in self.layers:
            x = layer.forward(x, training)
        return x

    def backward(self, dy):
        for layer in reversed(self.layers):
            dy = layer.backward(dy)
        return dy

    def onnx_node(self, g, x):
        from .onnx_export import emit
        for layer in self.layers:
            x = emit(g, layer, x)
        return x

    def torch_module(self):
        from torch import nn

        from .torch_export import convert
        return nn.Sequential(*(convert(layer) for layer in self.layers))


class _Block(Layer):
    """Parallel branches fed the same input; subclasses combine their outputs."""

    def __init__(self, *branches, name: str | None = None):
        super().__init__(name)
        if len(branches) < 2:
            raise ValueError(f"{type(self).__name__} needs at least 2 branches, "
                             f"got {len(branches)}")
        self.branches = [_Chain(_as_layers(b), name=f"{self.name}/branch{i}")
                         for i, b in enumerate(branches)]

    def sublayers(self):
        return self.branches

    def _build_branches(self, input_shape, rng) -> list[tuple[int, ...]]:
        return [b.build(input_shape, rng=rng, dtype=self.dtype) for b in self.branches]

    _merge = ""  # the ONNX op where the branches meet (the reader builds blocks itself)

    def onnx_node(self, g, x):
        outs = [branch.onnx_node(g, x) for branch in self.branches]
        if self._merge == "Concat":
            return g.node("Concat", outs, self, axis=1)
        y = outs[0]
        for other in outs[1:]:
            y = g.node("Add", [y, other], self)
        return y

    def torch_module(self):
        from torch import nn

        from . import torch_export
        branches = [b.torch_module() if b.layers else nn.Identity() for b in self.branches]
        block = torch_export.ConcatBlock if self._merge == "Concat" else torch_export.AddBlock
        return block(branches)


class Add(_Block):
    """Sum of parallel branches (residual blocks). An empty branch is the identity.

    Args:
        *branches: each a layer or a list of layers; ``[]`` or ``None`` is the identity.

    Attributes:
        fused_relu: the ``ReLU`` right after this block in a chain (linked when built),
            else None. Where ``kernels.planner.fuse_add_relu`` allows (compiled backend, two
            branches, contiguous outputs) the pair runs fused: forward max(sum, 0) in one
            pass (in training, where branch 0 ends in a batch norm, that batch norm's pass,
            after branch 1), the ReLU passing it on; backward this block masks dy (the
            ReLU passes it on) into a new array for its branches and sums their gradients
            into it, masked in the same pass by the ReLU of a fused pair before it, if its
            input is that pair's output (that pair then skips its mask). The same bits as unfused;
            ``set_add_relu_fusion(model, False)`` undoes the link.

    Example:
        Add([Conv2D(16, 3, padding="same"), BatchNormalization()], [])  # x + f(x)
    """

    _merge = "Add"

    def __init__(self, *branches, name: str | None = None):
        super().__init__(*branches, name=name)
        self.fused_relu: Layer | None = None
        self._upstream: Add | None = None  # a fused Add whose ReLU's output feeds this one
        self._relu_y = None  # the fused forward's output: the ReLU's mask for backward
        self._x = None  # the input, where it is the upstream pair's fused output
        self._premasked = None  # dy that the block after this one already masked

    def _build(self, input_shape, rng):
        shapes = self._build_branches(input_shape, rng)
        if any(s != shapes[0] for s in shapes):
            raise ValueError(f"Add block {self.name!r}: branch output shapes differ: {shapes}")
        return shapes[0]

    def forward(self, x, training=False):
        check_input(self, x)
        up = self._upstream
        self._x = x if up is not None and up._relu_y is not None and x is up._relu_y else None
        self._premasked = None
        self._relu_y, outs = self._fused(x, training)
        if outs is None:
            self.fused_relu._rectified = self._relu_y  # the ReLU passes this array on
            return self._relu_y
        # Branch outputs may be arrays their last layer caches for backward: never add into
        # them in place; the first sum makes a fresh array that later ones accumulate into.
        y = _add(outs[0], outs[1])
        for out in outs[2:]:
            y += out
        return y

    def _fused(self, x, training):
        """(max(sum, 0), None) where the fusion applies, else (None, the branch outputs). In
        training, where branch 0 ends in a batch norm, branch 1 runs first, and that batch
        norm writes the sum and the ReLU in its own pass (``forward_add_relu``)."""
        fast, branches = compiled(), self.branches
        if (self.fused_relu is None or fast is None or len(branches) != 2
                or not plan.fuse_add_relu(x.dtype)):
            return None, [b.forward(x, training) for b in branches]
        bn = branches[0].layers[-1] if branches[0].layers else None
        if training and type(bn) is BatchNormalization:
            r = branches[1].forward(x, training)
            for layer in branches[0].layers[:-1]:
                x = layer.forward(x, training)
            y = bn.forward_add_relu(x, r)
            if y is not None:
                return y, None
            outs = [bn.forward(x, training), r]
        else:
            outs = [b.forward(x, training) for b in branches]
        a, b = outs
        if not (a.shape == b.shape and a.dtype == b.dtype and a.size and a.flags.c_contiguous
                and b.flags.c_contiguous):
            return None, outs
        y = np.empty_like(a)
        fast.add_relu(a, b, y)
        return y, None

    def backward(self, dy):
        y = self._relu_y
        if y is None:
            return _sum_fresh([b.backward(dy) for b in self.branches])
        # fused: the ReLU passed dy on unmasked, unless the fused block after this one
        # masked it in its sum (dy is then that sum, which this block may overwrite)
        fast = compiled()
        if dy is self._premasked:
            g = dy
        elif (fast is not None and dy.shape == y.shape and dy.dtype == y.dtype
                and dy.flags.c_contiguous and y.flags.c_contiguous):
            g = np.empty_like(dy)
            fast.relu_backward(dy, y, g)
        else:
            g = dy * (y > 0)
        up, x, self._premasked = self._upstream, self._x, None
        mask = x if up is not None and up._relu_y is x else None
        dx, masked = _sum_into(g, [b.backward(g) for b in self.branches], mask)
        if masked:
            up._premasked = dx
        return dx


def link_add_relu(layers, enabled: bool = True) -> None:
    """Link every Add block in ``layers`` (one chain, in order) that is directly followed
    by a ReLU, so that the pair may run fused; ``enabled=False`` unlinks them."""
    layers = list(layers)
    for i, block in enumerate(layers):
        if type(block) is Add:
            nxt = layers[i + 1] if i + 1 < len(layers) else None
            block.fused_relu = nxt if enabled and type(nxt) is ReLU else None
            block._relu_y = block._x = block._premasked = None
            if type(nxt) is ReLU:
                nxt._rectified = None
            up = layers[i - 2] if i >= 2 else None  # a fused pair feeding this block
            block._upstream = up if type(up) is Add and up.fused_relu is layers[i - 1] else None


def set_add_relu_fusion(model: Layer, enabled: bool) -> None:
    """Fuse (True, the default after building) or unfuse every Add + ReLU pair of a built
    model; results are the same either way."""
    for layer in model.walk():
        chain = getattr(layer, "layers", None)
        if isinstance(chain, list):
            link_add_relu(chain, enabled)


class Concat(_Block):
    """Concatenation of parallel branches along the channel axis (axis 1).

    Args:
        *branches: each a layer or a list of layers; ``[]`` is the identity.

    Example:
        Concat([], [BatchNormalization(), ReLU(), Conv2D(32, 3, padding="same")])  # DenseNet
    """

    _merge = "Concat"

    def _build(self, input_shape, rng):
        shapes = self._build_branches(input_shape, rng)
        if any(s[1:] != shapes[0][1:] for s in shapes):
            raise ValueError(
                f"Concat block {self.name!r}: branches must agree on all but the channel axis: "
                f"{shapes}")
        self._splits = np.cumsum([s[0] for s in shapes])[:-1]
        return (int(sum(s[0] for s in shapes)),) + tuple(shapes[0][1:])

    def forward(self, x, training=False):
        check_input(self, x)
        return np.concatenate([b.forward(x, training) for b in self.branches], axis=1)

    def backward(self, dy):
        return _sum_fresh([b.backward(np.ascontiguousarray(part))
                           for b, part in zip(self.branches, np.split(dy, self._splits, axis=1))])


class Sequential(ModelMethods, _Chain):
    """A model: layers applied in order, with all parameters in one flat buffer.

    Args:
        layers: the layers, in forward order (blocks may be nested).
        input_shape: per-sample input shape (no batch axis); when given the model is
            built at once, else call ``build(input_shape)``.
        dtype: float32 (default) or float64.
        rng: generator (or seed) for the initial weights.

    Example:
        model = Sequential([Flatten(), Dense(128), ReLU(), Dense(10)], input_shape=(1, 28, 28))
        y = model.forward(x, training=True); model.backward(dy)
        model.parameters_flat()  # one contiguous array; layer params are views into it
    """

    def __init__(self, layers: Iterable[Layer] = (), input_shape: Sequence[int] | None = None,
                 dtype=np.float32, rng: np.random.Generator | int | None = None,
                 name: str | None = None):
        super().__init__(layers, name=name or "model")
        self._params_flat: np.ndarray | None = None
        self._grads_flat: np.ndarray | None = None
        self.grad_hooks: list[GradHook] = []
        # called as hook("forward", layer) / hook("backward", layer) just before each
        # top-level layer with parameters runs: where sharded parameters are gathered
        self.layer_hooks: list[LayerHook] = []
        self.dtype = np.dtype(dtype)
        if input_shape is not None:
            self.build(tuple(input_shape), rng=rng, dtype=dtype)

    def add(self, layer: Layer) -> "Sequential":
        if self.built:
            raise RuntimeError("cannot add layers to a built model")
        self.layers.append(layer)
        return self

    def build(self, input_shape, *, rng=None, dtype=None):
        dtype = self.dtype if dtype is None else np.dtype(dtype)
        if dtype not in (np.float32, np.float64):
            raise ValueError(f"dtype={dtype} is not supported; use float32 or float64")
        rng = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
        counts: dict[str, int] = {}
        for layer in self.walk():
            if layer is not self and layer.auto_named and not isinstance(layer, _Chain):
                base = type(layer).__name__.lower()
                layer.name = f"{base}_{counts.get(base, 0)}"
                counts[base] = counts.get(base, 0) + 1
        out = super().build(input_shape, rng=rng, dtype=dtype)
        if self.layers:
            self.layers[0].need_dx = False
        self._flatten()
        return out

    def _flatten(self) -> None:
        """Move every parameter and gradient into one flat buffer each; keep views."""
        entries = [(layer, key) for layer in self.walk() for key in layer.params]
        total = sum(layer.params[key].size for layer, key in entries)
        self._params_flat = np.empty(total, dtype=self.dtype)
        self._grads_flat = np.zeros(total, dtype=self.dtype)
        self._layout: list[tuple[Layer, str, int, int]] = []
        self._has_params = {top for top in self.layers if any(l.params for l in top.walk())}
        offset = 0
        for layer, key in entries:
            p = layer.params[key]
            n = p.size
            view = self._params_flat[offset:offset + n].reshape(p.shape)
            view[...] = p
            layer.params[key] = view
            layer.grads[key] = self._grads_flat[offset:offset + n].reshape(p.shape)
            self._layout.append((layer, key, offset, n))
            offset += n

    # -- flat buffers -------------------------------------------------------------------
    def parameters_flat(self) -> np.ndarray:
        self._require_built()
        return self._params_flat

    def gradients_flat(self) -> np.ndarray:
        self._require_built()
        return self._grads_flat

    def layer_ranges(self) -> list[tuple[Layer, int, int]]:
        """(top-level layer, start, stop) of each top-level layer that has parameters, in
        forward order; the slices [start, stop) of the flat buffers are that layer's."""
        self._require_built()
        ranges = []
        for top in self.layers:
            inside = {id(l) for l in top.walk()}
            spans = [(o, o + n) for l, _, o, n in self._layout if id(l) in inside]
            if spans:
                ranges.append((top, min(s for s, _ in spans), max(e for _, e in spans)))
        return ranges

    def _require_built(self):
        if not self.built:
            raise RuntimeError("the model is not built yet: pass input_shape= or call "
                               "model.build(input_shape)")

    # -- computation --------------------------------------------------------------------
    def forward(self, x, training=False):
        self._require_built()
        if x.dtype != self.dtype:
            x = x.astype(self.dtype)
        check_input(self, x)
        before = self.layer_hooks
        if not before:
            return super().forward(x, training)
        for layer in self.layers:
            if layer in self._has_params:
                for hook in before:
                    hook("forward", layer)
            x = layer.forward(x, training)
        return x

    def backward(self, dy):
        """Backpropagate dy through all layers; after each top-level layer's backward the
        registered grad hooks are called with that layer (its gradients are then final),
        and before it the layer hooks, with ("backward", layer)."""
        hooks, before = self.grad_hooks, self.layer_hooks
        for layer in reversed(self.layers):
            if before and layer in self._has_params:
                for hook in before:
                    hook("backward", layer)
            dy = layer.backward(dy)
            if hooks and layer in self._has_params:
                for hook in hooks:
                    hook(layer)
        return dy

    # -- interchange --------------------------------------------------------------------
    def to_onnx(self, path) -> str:
        """Write the model's inference as ONNX (opset 17) to ``path`` (nn/onnx_export.py)."""
        from .onnx_export import to_onnx
        return to_onnx(self, path)

    def to_torch(self):
        """The model as a ``torch.nn.Module`` in eval mode, weights copied
        (nn/torch_export.py)."""
        from .torch_export import to_torch
        return to_torch(self)

    # -- state --------------------------------------------------------------------------
    def summary(self) -> str:
        from .serialization import summary
        return summary(self)
