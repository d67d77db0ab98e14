"""Containers: Sequential (the model) and the two graph blocks, Add and Concat.

A built top-level ``Sequential`` owns two flat contiguous buffers, one of parameters and
one of gradients; every layer's ``params``/``grads`` entries are views into them, laid out
in forward order. Collectives and optimizers work on whole buffers or contiguous slices.
"""
from __future__ import annotations

from typing import Callable, Iterable, Sequence

import numpy as np

from . import fusion
from .base import Layer, check_input
from .model import ModelMethods
from .normalization import BatchNormalization
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

    _each_layer: Callable[[Layer], None] | None = None  # Sequential.build(each_layer=)

    def __init__(self, layers: Iterable[Layer] = (), name: str | None = None):
        super().__init__(name)
        self.layers: list[Layer] = list(layers)

    def sublayers(self) -> list[Layer]:
        return self.layers

    def _build(self, input_shape, rng):
        shape = input_shape
        for layer in self.layers:
            shape = layer.build(shape, rng=rng, dtype=self.dtype)
            if self._each_layer is not None:
                self._each_layer(layer)
        fusion.link_all(self.layers)  # BatchNormalization/Add + ReLU pairs as one pass
        return shape

    def forward(self, x, training=False):
        return fusion.forward_steps(self.layers, x, training)

    def backward(self, dy):
        return fusion.backward_steps(self.layers, dy)

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
        fused_relu: the ``ReLU`` right after this block in a chain (linked by nn/fusion.py
            when built), else None. Where the fusion applies (``fusion.add_relu_applies``:
            the compiled backend and the planner's "add_relu"; two branches, contiguous
            outputs) the pair runs fused: forward max(sum, 0) in one pass (in training,
            where branch 0 ends in a batch norm, that batch norm's pass, after branch 1),
            the chain having the ReLU pass it on; backward this block masks dy (the ReLU
            passes it on) into a new array for its branches and sums their gradients into
            it, masked in the same pass by the ReLU of the fused pair before it
            (``upstream``), if its input is that pair's output (``masked_upstream``: the
            chain then gives that pair its gradient through ``backward_masked``). The same
            bits as unfused; ``set_add_relu_fusion(model, False)`` undoes the link.

    Example:
        Add([Conv2D(16, 3, padding="same"), BatchNormalization()], [])  # x + f(x)
    """

    _merge = "Add"
    relu_fusion = "add_relu"  # the planner's name for this block + the ReLU after it

    def __init__(self, *branches, name: str | None = None):
        super().__init__(*branches, name=name)
        self.fused_relu: Layer | None = None
        self._upstream: Add | None = None  # a fused Add whose ReLU's output feeds this one
        self._relu_y = None  # the fused forward's output: the ReLU's mask for backward
        self._x = None  # the input, where it is the upstream pair's fused output
        self.masked_upstream = False  # the last dx came masked by the upstream pair's ReLU

    def fuse_relu(self, relu: Layer | None, upstream: Add | None = None) -> None:
        """Take the ReLU after this block into its pass (None: run apart); ``upstream``:
        the fused Add + ReLU pair whose output is this block's input."""
        self.fused_relu, self._upstream = relu, upstream
        self._relu_y = self._x = None
        self.masked_upstream = False

    @property
    def upstream(self) -> Add | None:
        return self._upstream

    @property
    def rectified(self) -> bool:
        """Whether the last forward ran fused: its output is already max(sum, 0)."""
        return self._relu_y is not None

    @property
    def rectified_output(self):
        """The last fused forward's output (None where it ran apart)."""
        return self._relu_y

    def _build(self, input_shape, rng):
        shapes = self._build_branches(input_shape, rng)
        if any(s != shapes[0] for s in shapes):
            raise ValueError(f"Add block {self.name!r}: branch output shapes differ: {shapes}")
        return shapes[0]

    def forward(self, x, training=False):
        check_input(self, x)
        up = self._upstream
        fed = up.rectified_output if up is not None else None
        self._x = x if fed is not None and x is fed else None
        self._relu_y, outs = self._fused(x, training)
        if outs is None:
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
        branches = self.branches
        if (self.fused_relu is None or len(branches) != 2
                or not fusion.add_relu_applies(x.dtype)):
            return None, [b.forward(x, training) for b in branches]
        bn = branches[0].layers[-1] if branches[0].layers else None
        if training and type(bn) is BatchNormalization:
            r = branches[1].forward(x, training)
            x = fusion.forward_steps(branches[0].layers[:-1], x, training)
            y = bn.forward_add_relu(x, r)
            if y is not None:
                return y, None
            outs = [bn.forward(x, training), r]
        else:
            outs = [b.forward(x, training) for b in branches]
        y = fusion.add_relu(*outs)
        return (None, outs) if y is None else (y, None)

    def backward(self, dy):
        # fused: the ReLU passed dy on unmasked
        return self._backward(dy, masked=False)

    def backward_masked(self, g):
        """``backward`` of a fused pair whose dy the fused block after it already masked
        with this pair's ReLU (in its sum: g, which this block may overwrite)."""
        return self._backward(g, masked=True)

    def _backward(self, dy, masked: bool):
        self.masked_upstream = False
        y = self._relu_y
        if y is None:
            return _sum_fresh([b.backward(dy) for b in self.branches])
        g = dy if masked else fusion.relu_mask(dy, y)
        up, x = self._upstream, self._x
        mask = x if up is not None and up.rectified_output is x else None
        dx, self.masked_upstream = _sum_into(g, [b.backward(g) for b in self.branches], mask)
        return dx


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

    def build(self, input_shape, *, rng=None, dtype=None,
              each_layer: Callable[[Layer], None] | None = None):
        """Build every layer for per-sample ``input_shape`` (weights drawn from ``rng`` in
        layer order) and lay their parameters and gradients out in the flat buffers.

        With ``each_layer`` the model is built without flat buffers (a rank that keeps a
        slice of them only: ``distnn.distributed.build_sliced``): ``each_layer(layer)``
        sees each top-level layer's initial values just after it is built, then its
        parameters and gradients become read-only NaN placeholders of their shapes, so
        at most one layer's values are alive at a time; ``parameters_flat()`` is empty.
        """
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
        if each_layer is not None:
            def take(layer):
                each_layer(layer)
                nan = np.full((), np.nan, dtype=dtype)
                for sub in layer.walk():
                    for key, p in sub.params.items():
                        sub.params[key] = sub.grads[key] = np.broadcast_to(nan, p.shape)
            self._each_layer = take
        try:
            out = super().build(input_shape, rng=rng, dtype=dtype)
        finally:
            self._each_layer = None
        if self.layers:
            self.layers[0].need_dx = False
        self._flatten(allocate=each_layer is None)
        return out

    def _flatten(self, allocate: bool = True) -> None:
        """Move every parameter and gradient into one flat buffer each; keep views (with
        ``allocate`` False: the layout only, empty buffers, the layers' placeholders kept)."""
        entries = [(layer, key) for layer in self.walk() for key in layer.params]
        total = sum(layer.params[key].size for layer, key in entries) if allocate else 0
        self._params_flat = np.empty(total, dtype=self.dtype)
        self._grads_flat = np.zeros(total, dtype=self.dtype)
        self._layout: list[tuple[Layer, str, int, int]] = []
        self._has_params = {top for top in self.layers if any(l.params for l in top.walk())}
        offset = 0
        for layer, key in entries:
            p = layer.params[key]
            n = p.size
            if not allocate:
                self._layout.append((layer, key, offset, n))
                offset += n
                continue
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

        def call_hooks(layer):
            if layer in self._has_params:
                for hook in before:
                    hook("forward", layer)
        return fusion.forward_steps(self.layers, x, training, call_hooks)

    def backward(self, dy):
        """Backpropagate dy through all layers; after each top-level layer's backward the
        registered grad hooks are called with that layer (its gradients are then final),
        and before it the layer hooks, with ("backward", layer)."""
        hooks, before = self.grad_hooks, self.layer_hooks

        def call_before(layer):
            if before and layer in self._has_params:
                for hook in before:
                    hook("backward", layer)

        def call_after(layer):
            if hooks and layer in self._has_params:
                for hook in hooks:
                    hook(layer)
        return fusion.backward_steps(self.layers, dy, call_before, call_after)

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
