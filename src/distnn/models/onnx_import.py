"""``--model FILE.onnx``: a distnn model built from an ONNX graph of the layers distnn has.

The graph must be a chain of distnn's layers from its one input to its output, where a
tensor read by several nodes starts parallel branches that meet again in one ``Add``
(``Sum``) or ``Concat`` node: a residual or dense block (``nn.Add``/``nn.Concat``; a branch
that goes straight to the meeting node is the identity). The ops:

==========================  ===============================================================
ONNX                        distnn
==========================  ===============================================================
Conv (any group)            Conv2D (weights and bias copied; explicit or SAME/VALID pads)
Gemm; MatMul (+ Add bias)   Dense (transB handled, alpha/beta folded in)
BatchNormalization          BatchNormalization (running statistics, epsilon, momentum)
Relu LeakyRelu Sigmoid      ReLU LeakyReLU Sigmoid Tanh Softmax (last axis)
Tanh Softmax
MaxPool AveragePool         MaxPool2D AvgPool2D (symmetric pads, no ceil mode)
GlobalAveragePool;          GlobalAvgPool2D
ReduceMean over H, W
Flatten; Reshape to (N, -1) Flatten
Dropout                     Dropout (its ratio); Identity: nothing
Add Sum Concat (axis 1)     the Add / Concat block where branches meet
LayerNormalization          LayerNormalization (last axis)
Transpose (1, 0, 2) ...     MultiHeadAttention: the whole subgraph torch.onnx.export writes
Softmax ... Transpose back  for a batch-first nn.MultiheadAttention (nn/attention_onnx.py)
==========================  ===============================================================

A layer may also read a pattern of several nodes (``Layer.from_onnx_pattern``, tried
before ``from_onnx`` at the ops in its ``onnx_patterns``): that is how a
``torch.nn.TransformerEncoder`` imports (attention, Add residuals, Dense, LayerNormalization).

Any other op is refused with one line naming the file, the op and the node. Needs the
optional extra: ``pip install 'distnn[onnx]'``.
"""
from __future__ import annotations

import os
from collections import defaultdict

import numpy as np

from ..nn import Add, Concat, Dense, GlobalAvgPool2D, Sequential
from ..nn.base import layer_classes
__all__ = ["ModelFileError", "load_onnx_model", "sequential_from_onnx", "SUPPORTED_OPS"]


class ModelFileError(ValueError):
    """An ONNX file distnn cannot read or build (one line naming the file and the op);
    ``models.files`` raises it again as its own ``ModelFileError``."""

MERGES = ("Add", "Sum", "Concat")
PADS = "pads"  # a convolution's uneven ONNX pads, (top, bottom, left, right): Conv2D.from_onnx


class _Graph:
    """The nodes, constants and consumers of an ONNX graph."""

    def __init__(self, proto, label: str):
        from onnx import numpy_helper
        self.label = label
        g = proto.graph
        self.consts = {t.name: numpy_helper.to_array(t) for t in g.initializer}
        self.nodes = []
        for node in g.node:
            if node.op_type == "Constant":
                attr = {a.name: a for a in node.attribute}
                if "value" not in attr:
                    self.refuse(node, "a Constant that is not a tensor")
                self.consts[node.output[0]] = numpy_helper.to_array(attr["value"].t)
            else:
                self.nodes.append(node)
        self.consumers: dict[str, list] = defaultdict(list)
        for node in self.nodes:
            for name in dict.fromkeys(self.data_inputs(node)):
                self.consumers[name].append(node)
        inputs = [i.name for i in g.input if i.name not in self.consts]
        if len(inputs) != 1:
            raise ModelFileError(f"--model {label!r}: the graph has {len(inputs)} inputs "
                                 f"{inputs}; distnn models have one")
        self.input = inputs[0]
        self.output = g.output[0].name

    @staticmethod
    def attrs(node) -> dict:
        return _attrs(node)

    def data_inputs(self, node) -> list[str]:
        return [i for i in node.input if i and i not in self.consts]

    def const(self, node, index: int) -> np.ndarray | None:
        if index >= len(node.input) or not node.input[index]:
            return None
        name = node.input[index]
        if name not in self.consts:
            self.refuse(node, f"input {index} ({name!r}) computed in the graph, not a constant")
        return self.consts[name]

    @staticmethod
    def auto_pad(attrs) -> str:
        """A node's ``auto_pad`` attribute as text (NOTSET when absent)."""
        pad = attrs.get("auto_pad", b"NOTSET")
        return pad.decode() if isinstance(pad, bytes) else str(pad)

    def refuse(self, node, why: str):
        raise ModelFileError(f"--model {self.label!r}: ONNX op {node.op_type!r} (node "
                             f"{node.name or node.output[0]!r}): {why}")


def _attrs(node) -> dict:
    """A node's attributes; floats rounded to float32's 7 digits (0.9, not 0.8999999762)."""
    from onnx import helper
    values = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    return {k: float(f"{v:.7g}") if isinstance(v, float) else v for k, v in values.items()}


def _readers() -> dict[str, type]:
    """ONNX op -> the distnn layer class that declares it reads it (``onnx_ops``)."""
    readers: dict[str, type] = {}
    for cls in layer_classes():
        for op in cls.__dict__.get("onnx_ops", ()):
            if op in readers:
                raise RuntimeError(f"ONNX op {op} is declared by both {readers[op].__name__} "
                                   f"and {cls.__name__}")
            readers[op] = cls
    return readers


def _patterns() -> dict[str, list[type]]:
    """ONNX op -> the layer classes whose ``from_onnx_pattern`` may start at it."""
    patterns: dict[str, list[type]] = defaultdict(list)
    for cls in layer_classes():
        for op in cls.__dict__.get("onnx_patterns", ()):
            patterns[op].append(cls)
    return dict(patterns)


READERS = _readers()
PATTERNS = _patterns()
SUPPORTED_OPS = tuple(sorted({*READERS, *PATTERNS, *MERGES, "Identity"}))


class _Builder:
    """Walks the graph from its input into distnn layers; ``arrays`` keeps each layer's
    weights until the model is built."""

    def __init__(self, g: _Graph):
        self.g = g
        self.arrays: list[tuple[object, dict]] = []

    def convert(self, node, layers: list) -> str:
        """Append the layer(s) of ``node`` (and of the nodes a pattern starting there takes
        in) to ``layers``; the tensor the walk goes on from."""
        g = self.g
        for cls in PATTERNS.get(node.op_type, ()):
            found = cls.from_onnx_pattern(g, node)
            if found is not None:
                layer, arrays, out = found
                layers.append(layer)
                self.arrays.append((layer, arrays))
                return out
        if node.op_type == "Add" and len(g.data_inputs(node)) == 1:  # a bias
            bias = g.const(node, 1 if node.input[0] in g.data_inputs(node) else 0)
            last = layers[-1] if layers else None
            if not isinstance(last, Dense) or last.use_bias:
                g.refuse(node, "adding a constant other than a MatMul's bias")
            last.use_bias = True
            next(a for l, a in self.arrays if l is last)["b"] = np.broadcast_to(
                bias, (last.units,))
            return node.output[0]
        if (node.op_type in ("Flatten", "Reshape") and layers
                and isinstance(layers[-1], GlobalAvgPool2D)):
            return node.output[0]  # distnn's global pool already gives (batch, channels)
        if node.op_type == "Identity":
            return node.output[0]
        cls = READERS.get(node.op_type)
        if cls is None:
            g.refuse(node, f"distnn has no such layer; it reads {', '.join(SUPPORTED_OPS)}")
        layer, arrays = cls.from_onnx(g, node, _attrs(node))
        if layer is not None:
            layers.append(layer)
            self.arrays.append((layer, arrays))
        return node.output[0]

    def chain(self, t: str, layers: list | None = None):
        """Layers from tensor ``t`` on (appended to ``layers``): (layers, last tensor, the
        merging node it stops at or None at the graph's output)."""
        g = self.g
        layers = [] if layers is None else layers
        while True:
            readers = g.consumers.get(t, [])
            if t == g.output or not readers:
                if t != g.output:
                    raise ModelFileError(f"--model {g.label!r}: tensor {t!r} leads nowhere "
                                         "(not the graph's output)")
                return layers, t, None
            if len(readers) == 1:
                node = readers[0]
                if len(g.data_inputs(node)) > 1:
                    return layers, t, node
                t = self.convert(node, layers)
                continue
            t = self.block(t, readers, layers)

    def block(self, t: str, readers: list, layers: list) -> str:
        g = self.g
        ends = []
        for node in readers:
            if len(g.data_inputs(node)) > 1:
                ends.append(([], t, node))
                continue
            branch = []
            ends.append(self.chain(self.convert(node, branch), branch))
        merge = ends[0][2]
        inputs = g.data_inputs(merge) if merge is not None else []
        if (merge is None or merge.op_type not in MERGES or any(e[2] is not merge for e in ends)
                or sorted(inputs) != sorted(e[1] for e in ends)):
            raise ModelFileError(f"--model {g.label!r}: tensor {t!r} feeds {len(readers)} "
                                 "nodes whose paths do not meet in one Add or Concat node; "
                                 "distnn builds chains of residual/concatenation blocks only")
        order = sorted(ends, key=lambda e: inputs.index(e[1]))
        branches = [e[0] for e in order]
        if merge.op_type == "Concat":
            if int(_attrs(merge).get("axis", 1)) != 1:
                g.refuse(merge, "concatenation along an axis other than the channels")
            layers.append(Concat(*branches))
        else:
            layers.append(Add(*branches))
        return merge.output[0]


def sequential_from_onnx(proto, *, input_shape, dtype=np.float32, label: str = "model.onnx",
                         name: str | None = None) -> Sequential:
    """A built ``Sequential`` with the weights of the ONNX ``proto`` for samples of
    ``input_shape`` (``ModelFileError`` naming ``label`` for what distnn cannot build)."""
    g = _Graph(proto, label)
    builder = _Builder(g)
    layers, _, stop = builder.chain(g.input)
    if stop is not None:
        g.refuse(stop, "its inputs come from outside the branches that reach it")
    model = Sequential(layers, name=name or os.path.splitext(os.path.basename(label))[0])
    try:
        model.build(tuple(input_shape), rng=0, dtype=dtype)
    except ValueError as exc:
        raise ModelFileError(f"--model {label!r}: {exc}") from None
    for layer, arrays in builder.arrays:
        for key, value in arrays.items():
            if key == PADS:
                if layer._pads != value:
                    raise ModelFileError(
                        f"--model {label!r}: layer {layer.name!r}: pads (top, bottom, left, "
                        f"right) {value} differ before and after, and not as distnn's "
                        f"'same' ({layer._pads}); distnn pads symmetrically otherwise")
                continue
            target = layer.params.get(key, layer.buffers.get(key))
            if target is None or target.size != np.size(value):
                raise ModelFileError(
                    f"--model {label!r}: layer {layer.name!r} ({type(layer).__name__}) "
                    f"needs {key} of shape {None if target is None else target.shape}, the "
                    f"file has {np.shape(value)}; is the input shape {tuple(input_shape)} "
                    "the one the model was made for?")
            target[...] = np.reshape(value, target.shape)
    return model


def load_onnx_model(path: str, *, input_shape, dtype=np.float32) -> Sequential:
    """The distnn model of the ONNX file ``path`` (``--model FILE.onnx``)."""
    try:
        import onnx
    except ImportError:
        raise ModelFileError(f"--model {path!r}: reading ONNX needs the onnx package: "
                             "pip install 'distnn[onnx]'") from None
    if not os.path.isfile(path):
        raise ModelFileError(f"--model {path!r}: file does not exist (looked in "
                             f"{os.getcwd()})")
    try:
        proto = onnx.load(path)
        if not proto.graph.node:
            raise ValueError("no graph nodes")
    except Exception as exc:
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ModelFileError(f"--model {path!r}: not an ONNX model ({why})") from None
    return sequential_from_onnx(proto, input_shape=input_shape, dtype=dtype, label=path)
