"""A built model as an ONNX graph (opset 17), written with the ``onnx`` package.

``to_onnx(model, path)`` asks each layer for its own node(s) (``Layer.onnx_node``, declared
in the layer's family module; blocks write their branches and the ``Add`` or ``Concat``
where they meet) and writes the graph of its *inference*: batch norm with its
running statistics, no dropout. The input is ``input`` (batch, *input_shape) with a free
batch axis, the output ``output`` (batch, *output_shape). Weights are written as float32
whatever the model's dtype (onnxruntime runs convolutions in float32 only).

Needs the optional extra: ``pip install 'distnn[onnx]'``.
"""
from __future__ import annotations

import os
import numpy as np

from .base import Layer, layer_classes

__all__ = ["OPSET", "to_onnx", "onnx_model", "require_onnx", "layer_kind", "emit", "exportable"]

OPSET = 17
EXTRA = "pip install 'distnn[onnx]'"


def require_onnx(what: str):
    """The ``onnx`` module, or ImportError with one line naming ``what`` and the extra."""
    try:
        import onnx
    except ImportError:
        raise ImportError(f"{what} needs the onnx package: {EXTRA}") from None
    return onnx


class _Graph:
    """Nodes and initializers being written; fresh tensor names."""

    def __init__(self, helper, numpy_helper):
        self.helper, self.numpy_helper = helper, numpy_helper
        self.nodes: list = []
        self.inits: list = []
        self.count = 0

    def name(self, base: str) -> str:
        self.count += 1
        return f"{base}_{self.count}"

    def const(self, layer: Layer, key: str, value: np.ndarray) -> str:
        name = f"{layer.name}/{key}"
        self.inits.append(self.numpy_helper.from_array(
            np.ascontiguousarray(value, dtype=np.float32), name))
        return name

    def node(self, op: str, inputs: list[str], layer: Layer | None = None, **attrs) -> str:
        out = self.name(layer.name if layer is not None else op.lower())
        self.nodes.append(self.helper.make_node(op, inputs, [out], name=out, **attrs))
        return out


def layer_kind(layer) -> str | None:
    """The class name of a distnn layer (``"Conv2D"``), None for a class defined outside
    ``distnn.nn`` (a user's subclass may compute something else: it is refused rather than
    exported wrongly)."""
    cls = type(layer)
    return cls.__name__ if cls.__module__.startswith("distnn.nn.") else None


def exportable(what: str) -> list[str]:
    """The names of distnn's layer classes that declare ``what`` (nn/base.py)."""
    return sorted(c.__name__ for c in layer_classes() if c.declares(what)
                  and not c.__name__.startswith("_"))


def emit(g: _Graph, layer: Layer, x: str) -> str:
    """Write ``layer`` into ``g`` through its own declaration; its output tensor's name."""
    if layer_kind(layer) is None or not type(layer).declares("onnx_node"):
        raise ValueError(f"to_onnx: layer {layer.name!r} ({type(layer).__name__}) has no "
                         f"ONNX form; the exportable layers are {exportable('onnx_node')}")
    return layer.onnx_node(g, x)


def onnx_model(model, *, name: str | None = None):
    """The ``onnx.ModelProto`` of a built model's inference (see the module doc)."""
    onnx = require_onnx("to_onnx")
    from onnx import TensorProto, helper, numpy_helper
    if not getattr(model, "built", False):
        raise ValueError("to_onnx: the model is not built; call model.build(input_shape)")
    g = _Graph(helper, numpy_helper)
    out = emit(g, model, "input")
    if out == "input":  # an empty or all-identity model: ONNX needs one node
        out = g.node("Identity", ["input"])
    g.nodes.append(helper.make_node("Identity", [out], ["output"], name="output"))
    graph = helper.make_graph(
        g.nodes, name or model.name,
        [helper.make_tensor_value_info("input", TensorProto.FLOAT,
                                       ["batch", *model.input_shape])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT,
                                       ["batch", *model.output_shape])],
        initializer=g.inits)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="distnn")
    proto.ir_version = min(proto.ir_version, 8)  # readable by onnxruntime >= 1.14
    onnx.checker.check_model(proto)
    return proto


def to_onnx(model, path: str | os.PathLike, *, name: str | None = None) -> str:
    """Write ``model`` (built, distnn layers) to ``path`` as ONNX; returns the path."""
    from ..fileio import atomic_open
    proto = onnx_model(model, name=name)
    with atomic_open(os.fspath(path)) as f:
        f.write(proto.SerializeToString())
    return os.fspath(path)
