"""A built model as an ONNX graph (opset 17), written with the ``onnx`` package.

``to_onnx(model, path)`` walks the model layer by layer (blocks as branches that meet in
an ``Add`` or ``Concat``) and writes the graph of its *inference*: batch norm with its
running statistics, no dropout. The input is ``input`` (batch, *input_shape) with a free
batch axis, the output ``output`` (batch, *output_shape). Weights are written as float32
whatever the model's dtype (onnxruntime runs convolutions in float32 only).

Needs the optional extra: ``pip install 'distnn[onnx]'``.
"""
from __future__ import annotations

import os
from typing import Callable

import numpy as np

from .base import Layer

__all__ = ["OPSET", "to_onnx", "onnx_model", "require_onnx", "layer_kind"]

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
    ``distnn.nn``. The writers go by name: importing the layer modules here would make a
    cycle with ``Sequential``'s ``to_onnx``."""
    cls = type(layer)
    return cls.__name__ if cls.__module__.startswith("distnn.nn.") else None


CHAINS = ("Sequential", "_Chain")


def _conv(g: _Graph, layer, x: str) -> str:
    pt, pb, pl, pr = layer._pads
    inputs = [x, g.const(layer, "w", layer.params["w"])]
    if layer.use_bias:
        inputs.append(g.const(layer, "b", layer.params["b"]))
    return g.node("Conv", inputs, layer, kernel_shape=list(layer.kernel_size),
                  strides=list(layer.strides), dilations=list(layer.dilation),
                  pads=[pt, pl, pb, pr])


def _batchnorm(g: _Graph, layer, x: str) -> str:
    p, s = layer.params, layer.buffers
    inputs = [x, g.const(layer, "gamma", p["gamma"]), g.const(layer, "beta", p["beta"]),
              g.const(layer, "running_mean", s["running_mean"]),
              g.const(layer, "running_var", s["running_var"])]
    return g.node("BatchNormalization", inputs, layer, epsilon=layer.epsilon,
                  momentum=layer.momentum)


def _pool(op: str, **extra) -> Callable:
    def emit(g: _Graph, layer, x: str) -> str:
        ph, pw = layer.padding
        return g.node(op, [x], layer, kernel_shape=list(layer.pool_size),
                      strides=list(layer.strides), pads=[ph, pw, ph, pw], **extra)
    return emit


def _global_avg(g: _Graph, layer, x: str) -> str:
    return g.node("Flatten", [g.node("GlobalAveragePool", [x], layer)], layer, axis=1)


def _block(g: _Graph, layer, x: str) -> str:
    outs = [_emit_chain(g, branch.layers, x) for branch in layer.branches]
    if layer_kind(layer) == "Concat":
        return g.node("Concat", outs, layer, axis=1)
    y = outs[0]
    for other in outs[1:]:
        y = g.node("Add", [y, other], layer)
    return y


# Layer class name -> writer(graph, layer, input name) -> output name (exact classes: a
# subclass may compute something else and is refused rather than exported wrongly).
EMITTERS: dict[str, Callable] = {
    "Conv2D": _conv, "BatchNormalization": _batchnorm,
    "Flatten": lambda g, layer, x: g.node("Flatten", [x], layer, axis=1),
    "Dropout": lambda g, layer, x: x,  # inference: the identity
    "ReLU": lambda g, layer, x: g.node("Relu", [x], layer),
    "LeakyReLU": lambda g, layer, x: g.node("LeakyRelu", [x], layer, alpha=layer.alpha),
    "Sigmoid": lambda g, layer, x: g.node("Sigmoid", [x], layer),
    "Tanh": lambda g, layer, x: g.node("Tanh", [x], layer),
    "Softmax": lambda g, layer, x: g.node("Softmax", [x], layer, axis=-1),
    "MaxPool2D": _pool("MaxPool"), "AvgPool2D": _pool("AveragePool", count_include_pad=1),
    "GlobalAvgPool2D": _global_avg, "Add": _block, "Concat": _block,
}


def _emit_chain(g: _Graph, layers, x: str) -> str:
    for layer in layers:
        kind = layer_kind(layer)
        if kind in CHAINS:
            x = _emit_chain(g, layer.layers, x)
            continue
        emit = EMITTERS.get(kind)
        if emit is None and type(layer).declares("onnx_node"):  # the layer's own (nn/base.py)
            emit = lambda g, layer, x: layer.onnx_node(g, x)  # noqa: E731
        if emit is None:
            raise ValueError(f"to_onnx: layer {layer.name!r} ({type(layer).__name__}) has no "
                             f"ONNX form; the exportable layers are {sorted(EMITTERS)}")
        x = emit(g, layer, x)
    return x


def onnx_model(model, *, name: str | None = None):
    """The ``onnx.ModelProto`` of a built model's inference (see the module doc)."""
    onnx = require_onnx("to_onnx")
    from onnx import TensorProto, helper, numpy_helper
    if not getattr(model, "built", False):
        raise ValueError("to_onnx: the model is not built; call model.build(input_shape)")
    g = _Graph(helper, numpy_helper)
    out = _emit_chain(g, model.layers, "input")
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
