"""The layer contract every distnn layer follows.

A layer is declared without input sizes; ``build(input_shape, rng=..., dtype=...)`` creates
its parameters once the per-sample input shape is known and returns the per-sample output
shape. ``forward(x, training)`` returns y and caches only what backward needs;
``backward(dy)`` returns dx (or None when ``need_dx`` is False) and *overwrites* the
arrays in ``grads`` in place (``grads[k][...] = ...`` or ``out=grads[k]``), never rebinding
them: once a model is built, ``params``/``grads`` entries are views into the model's flat
buffers (see ``Sequential``).
"""
from __future__ import annotations

from typing import Any, Callable, Iterator

import numpy as np

from .init import get_initializer

class Layer:
    """Base class of all layers.

    Attributes:
        params: trainable arrays by name (``"w"``, ``"b"``, ``"gamma"`` ...).
        grads: arrays with the same keys and shapes as ``params``.
        buffers: non-trainable state saved with the weights (BatchNorm running stats).
        input_shape / output_shape: per-sample shapes (no batch axis), set by ``build``.
        need_dx: when False, ``backward`` may skip computing dx and return None
            (set by containers on the first layer of a model).
    """

    def __init__(self, name: str | None = None):
        # Unnamed layers get "<type>_<k>" names per model at build time (Sequential), so
        # the same architecture always gets the same names (save/load relies on it).
        self.name = name or type(self).__name__.lower()
        self.auto_named = name is None
        self.params: dict[str, np.ndarray] = {}
        self.grads: dict[str, np.ndarray] = {}
        self.buffers: dict[str, np.ndarray] = {}
        self.input_shape: tuple[int, ...] | None = None
        self.output_shape: tuple[int, ...] | None = None
        self.dtype = np.dtype(np.float32)
        self.need_dx = True
        self.built = False

    # -- building -----------------------------------------------------------------------
    def build(self, input_shape: tuple[int, ...], *, rng: np.random.Generator,
              dtype=np.float32) -> tuple[int, ...]:
        """Create parameters for per-sample ``input_shape``; return the output shape."""
        self.input_shape = tuple(int(s) for s in input_shape)
        self.dtype = np.dtype(dtype)
        self.output_shape = tuple(self._build(self.input_shape, rng))
        self.built = True
        return self.output_shape

    def _build(self, input_shape: tuple[int, ...], rng: np.random.Generator) -> tuple[int, ...]:
        """Subclasses create params here and return the output shape."""
        return input_shape

    def add_param(self, name: str, shape: tuple[int, ...], initializer, rng: np.random.Generator,
                  fan_in: int = 1, fan_out: int = 1) -> np.ndarray:
        init = get_initializer(initializer)
        value = np.ascontiguousarray(init(tuple(shape), fan_in, fan_out, rng, self.dtype),
                                     dtype=self.dtype)
        self.params[name] = value
        self.grads[name] = np.zeros_like(value)
        return value

    # -- computation --------------------------------------------------------------------
    def forward(self, x: np.ndarray, training: bool = False) -> np.ndarray:
        raise NotImplementedError

    def backward(self, dy: np.ndarray) -> np.ndarray | None:
        raise NotImplementedError

    def __call__(self, x: np.ndarray, training: bool = False) -> np.ndarray:
        return self.forward(x, training)

    # -- declarations: this layer in other formats ----------------------------------------
    # A layer declares its ONNX node(s), its torch counterpart and the ONNX ops it reads
    # back here, in its own family module: nn/onnx_export.py, nn/torch_export.py and
    # models/onnx_import.py only dispatch to these, so adding a layer touches one file.
    onnx_ops: tuple[str, ...] = ()  # ONNX op types ``from_onnx`` converts

    def onnx_node(self, g, x: str) -> str:
        """Write this layer's inference into the ONNX graph being built ``g`` (nn/onnx_export.py's
        ``_Graph``: ``g.node(op, inputs, layer, **attrs)``, ``g.const(layer, key, array)``)
        fed by the tensor named ``x``; return the name of its output tensor."""
        raise NotImplementedError

    def torch_module(self):
        """A ``torch.nn.Module`` computing this layer's inference with its weights copied
        (torch is imported by the caller, nn/torch_export.py)."""
        raise NotImplementedError

    @classmethod
    def from_onnx(cls, g, node, attrs: dict):
        """The layer for the ONNX ``node`` (an op in ``onnx_ops``) of the graph being read
        ``g`` (models/onnx_import.py's ``_Graph``: ``g.const(node, i)``, ``g.refuse(node,
        why)``): ``(layer, arrays)``, arrays by parameter key, or ``(None, {})`` for the
        identity."""
        raise NotImplementedError

    onnx_patterns: tuple[str, ...] = ()  # ONNX ops that may start a ``from_onnx_pattern``

    @classmethod
    def from_onnx_pattern(cls, g, node):
        """This layer from several ONNX nodes starting at ``node`` (an op in
        ``onnx_patterns``), e.g. the reshapes, matrix products and softmax an exporter
        writes for one attention: ``(layer, arrays, tensor)`` with the name of the tensor
        where those nodes end, or None where ``node`` starts no such pattern (the reader
        then tries ``from_onnx`` of the op's class). ``g`` as in ``from_onnx``, plus
        ``g.consumers[tensor]`` (the nodes reading a tensor)."""
        return None

    @classmethod
    def declares(cls, what: str) -> bool:
        """Whether this class declares ``what`` ("onnx_node", "torch_module", "from_onnx",
        "from_onnx_pattern")
        itself or through a distnn base class, rather than leaving Layer's default."""
        return getattr(cls, what).__qualname__ != f"Layer.{what}"

    # -- introspection ------------------------------------------------------------------
    def sublayers(self) -> list["Layer"]:
        """Direct children (containers and blocks override)."""
        return []

    def walk(self) -> Iterator["Layer"]:
        """This layer and all nested layers, depth first, in forward order."""
        yield self
        for child in self.sublayers():
            yield from child.walk()

    @property
    def num_params(self) -> int:
        return int(sum(p.size for p in self.params.values()))

    def describe(self) -> str:
        """Short text of the layer's options for the summary table."""
        return ""

    def __repr__(self) -> str:
        extra = self.describe()
        return f"{type(self).__name__}({extra})" if extra else f"{type(self).__name__}()"


def layer_classes() -> list[type[Layer]]:
    """Every layer class defined in ``distnn.nn`` (the family modules must be imported,
    as ``import distnn.nn`` does), in a stable order: the exporters and the ONNX reader
    find the layers' declarations through it."""
    found, todo = [], [Layer]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub not in found and sub.__module__.startswith("distnn.nn."):
                found.append(sub)
                todo.append(sub)
    return sorted(found, key=lambda c: (c.__module__, c.__qualname__))


def torch_family(define: Callable[[Any], dict[str, type]]) -> Callable[[], dict[str, type]]:
    """A family's torch module classes, ``define(torch)``'s dict, defined at first use and
    kept (torch is optional: importing a layer module does not import it)."""
    kept: dict[str, type] = {}

    def classes() -> dict[str, type]:
        if not kept:
            import torch
            kept.update(define(torch))
        return kept
    classes.__doc__ = define.__doc__
    return classes


def check_input(layer: Layer, x: np.ndarray) -> None:
    """Raise a clear error when x does not have the per-sample shape the layer was built for."""
    if layer.input_shape is not None and tuple(x.shape[1:]) != layer.input_shape:
        raise ValueError(
            f"layer {layer.name!r} ({type(layer).__name__}) expects input of shape "
            f"(batch, {', '.join(map(str, layer.input_shape))}) but got {tuple(x.shape)}; "
            "check the model's input_shape and the dataset's sample shape"
        )


def check_features(layer: Layer, x: np.ndarray) -> None:
    """As ``check_input``, for layers applied token by token (a transformer's): x must have
    the built rank and last (feature) axis, but the axes between, a sequence's length, may
    be shorter or longer than at build, so that one model runs sequences of any length
    (the layers that hold positions check the length themselves)."""
    shape = layer.input_shape
    if shape is not None and (x.ndim != len(shape) + 1 or x.shape[-1] != shape[-1]):
        raise ValueError(
            f"layer {layer.name!r} ({type(layer).__name__}) expects input of shape "
            f"(batch, {', '.join(['...'] * (len(shape) - 1) + [str(shape[-1])])}) but got "
            f"{tuple(x.shape)}; check the model's input_shape and the dataset's sample shape"
        )
