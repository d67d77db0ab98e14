"""Sequence layers around the transformer blocks: image patches, a class token, pooling,
and the padding mask.

Padding masks. A batch of sequences of different lengths is padded with one token id. The
container ``PaddingMask(layers, padding_idx)`` takes the token ids as its input, computes
the key padding mask ``ids == padding_idx`` (N, T), True at padding, and passes it as the
keyword ``key_padding_mask=`` to every one of its layers whose ``forward`` takes that
argument (``MultiHeadAttention``, the blocks of nn/transformer.py, ``SequencePool``), which
pass it on to their own attention. The mask travels as an argument of one forward: no layer
stores it into another, and each keeps what its own backward needs. Outside a
``PaddingMask`` the same layers run unmasked. Padded positions still get outputs (their
queries attend to the real tokens); ``SequencePool("mean")`` leaves them out of the mean,
and a loss should. A ``PaddingMask`` has no ONNX or torch form (the export refuses it).
"""
from __future__ import annotations

import inspect

import numpy as np

from .base import Layer, check_features, torch_family, check_input
from .containers import _Chain
from .embedding import Embedding


def _ints(g, layer: Layer, key: str, values) -> str:
    name = f"{layer.name}/{key}"
    g.inits.append(g.numpy_helper.from_array(np.asarray(values, np.int64), name))
    return name


class Patchify(Layer):
    """Images to a sequence of flattened patches: (C, H, W) -> (H/p * W/p, C*p*p), patches
    in row-major order, each flattened channel first (as ``Conv2D(dim, p, strides=p)``'s
    weight is); a ``Dense(dim)`` after it is ViT's patch embedding.

    Args:
        patch_size: side p of the square patches; must divide H and W.
    """

    def __init__(self, patch_size: int, name: str | None = None):
        super().__init__(name)
        if int(patch_size) <= 0:
            raise ValueError(f"Patchify: patch_size must be a positive integer, got "
                             f"{patch_size!r}")
        self.patch_size = int(patch_size)

    def _build(self, input_shape, rng):
        p = self.patch_size
        if len(input_shape) != 3 or input_shape[1] % p or input_shape[2] % p:
            raise ValueError(f"Patchify layer {self.name!r}: per-sample input must be (C, H, W) "
                             f"with H and W multiples of patch_size={p}, got {input_shape}")
        c, h, w = input_shape
        self._grid = (c, h // p, p, w // p, p)
        return ((h // p) * (w // p), c * p * p)

    def forward(self, x, training=False):
        check_input(self, x)
        c, gh, p, gw, _ = self._grid
        return np.ascontiguousarray(x.reshape(-1, c, gh, p, gw, p).transpose(
            0, 2, 4, 1, 3, 5)).reshape((-1,) + self.output_shape)

    def backward(self, dy):
        if not self.need_dx:
            return None
        c, gh, p, gw, _ = self._grid
        return np.ascontiguousarray(dy.reshape(-1, gh, gw, c, p, p).transpose(
            0, 3, 1, 4, 2, 5)).reshape((-1,) + self.input_shape)

    def onnx_node(self, g, x):
        c, gh, p, gw, _ = self._grid
        y = g.node("Reshape", [x, _ints(g, self, "grid", [-1, c, gh, p, gw, p])], self)
        y = g.node("Transpose", [y], self, perm=[0, 2, 4, 1, 3, 5])
        return g.node("Reshape", [y, _ints(g, self, "tokens", [-1, *self.output_shape])],
                      self)

    def torch_module(self):
        return _torch_classes()["Patchify"](self._grid, self.output_shape)

    def describe(self):
        return f"patch_size={self.patch_size}"


class ClassToken(Layer):
    """Prepends a learned token to the sequence (ViT's class token): (N, T, E) ->
    (N, T + 1, E); the parameter ``token`` is (E,), zero at the start (as torchvision's)."""

    def _build(self, input_shape, rng):
        if len(input_shape) != 2:
            raise ValueError(f"ClassToken layer {self.name!r} needs per-sample input "
                             f"(length, embed) but got {input_shape}")
        self.add_param("token", (input_shape[1],), "zeros", rng)
        return (input_shape[0] + 1, input_shape[1])

    def forward(self, x, training=False):
        check_features(self, x)
        y = np.empty((x.shape[0], x.shape[1] + 1, x.shape[2]), x.dtype)
        y[:, 0] = self.params["token"]
        y[:, 1:] = x
        return y

    def backward(self, dy):
        np.sum(dy[:, 0], axis=0, out=self.grads["token"])
        return np.ascontiguousarray(dy[:, 1:]) if self.need_dx else None

    def onnx_node(self, g, x):
        e = self.input_shape[1]
        token = g.const(self, "token", self.params["token"].reshape(1, 1, e))
        batch = g.node("Shape", [x], self, start=0, end=1)
        shape = g.node("Concat", [batch, _ints(g, self, "token_shape", [1, e])], self, axis=0)
        return g.node("Concat", [g.node("Expand", [token, shape], self), x], self, axis=1)

    def torch_module(self):
        import torch
        module = _torch_classes()["ClassToken"](self.input_shape[1])
        module.token.data = torch.tensor(self.params["token"])
        return module


class SequencePool(Layer):
    """A sequence to one vector: (N, T, E) -> (N, E).

    Args:
        mode: "mean" over the positions (those that are not padding under a
            ``PaddingMask``) or "cls", the first position (after a ``ClassToken``).
    """

    def __init__(self, mode: str = "mean", name: str | None = None):
        super().__init__(name)
        if mode not in ("mean", "cls"):
            raise ValueError(f"SequencePool: mode must be 'mean' or 'cls', got {mode!r}")
        self.mode = mode

    def _build(self, input_shape, rng):
        if len(input_shape) != 2:
            raise ValueError(f"SequencePool layer {self.name!r} needs per-sample input "
                             f"(length, embed) but got {input_shape}")
        return (input_shape[1],)

    def forward(self, x, training=False, key_padding_mask=None):
        check_features(self, x)
        self._t = x.shape[1]
        if self.mode == "cls":
            return x[:, 0].copy()
        if key_padding_mask is None:
            self._weights = None
            return x.mean(axis=1)
        keep = ~np.asarray(key_padding_mask, bool)
        # an all-padding row averages nothing and gives 0
        w = keep / np.maximum(keep.sum(axis=1, keepdims=True), 1)
        self._weights = w.astype(x.dtype)[:, :, None]
        return np.sum(x * self._weights, axis=1)

    def backward(self, dy):
        if not self.need_dx:
            return None
        n, e = dy.shape
        if self.mode == "cls":
            dx = np.zeros((n, self._t, e), dy.dtype)
            dx[:, 0] = dy
            return dx
        if self._weights is None:
            return np.repeat((dy / self._t)[:, None, :], self._t, axis=1)
        return dy[:, None, :] * self._weights

    def onnx_node(self, g, x):
        if self.mode == "cls":
            return g.node("Gather", [x, _ints(g, self, "first", 0)], self, axis=1)
        return g.node("ReduceMean", [x], self, axes=[1], keepdims=0)

    def torch_module(self):
        return _torch_classes()["SequencePool"](self.mode)

    def describe(self):
        return f"mode={self.mode!r}"


class PaddingMask(_Chain):
    """Layers over padded token ids, each given the key padding mask (see the module doc).

    Args:
        layers: the layers, first an ``Embedding``.
        padding_idx: the padding id; default the first layer's (an ``Embedding`` with a
            ``padding_idx``).

    Shape: (N, T) token ids -> what its last layer gives.

    Example:
        PaddingMask([Embedding(256, 64, padding_idx=0), PositionalEmbedding(),
                     TransformerEncoderBlock(4, 128), SequencePool("mean")])
    """

    def __init__(self, layers, padding_idx: int | None = None, name: str | None = None):
        super().__init__(layers, name=name)
        first = self.layers[0] if self.layers else None
        if padding_idx is None:
            if not isinstance(first, Embedding) or first.padding_idx is None:
                raise ValueError("PaddingMask: give padding_idx, or make the first layer an "
                                 "Embedding with a padding_idx")
            padding_idx = first.padding_idx
        self.padding_idx = int(padding_idx)

    def _build(self, input_shape, rng):
        if len(input_shape) != 1:
            raise ValueError(f"PaddingMask {self.name!r} needs per-sample token ids (T,), got "
                             f"{input_shape}")
        shape = super()._build(input_shape, rng)
        self._takes_mask = ["key_padding_mask" in inspect.signature(layer.forward).parameters
                            for layer in self.layers]
        return shape

    def forward(self, x, training=False):
        mask = np.asarray(x == self.padding_idx)
        for layer, takes in zip(self.layers, self._takes_mask):
            x = (layer.forward(x, training, key_padding_mask=mask) if takes
                 else layer.forward(x, training))
        return x

    def describe(self):
        return f"padding_idx={self.padding_idx}"

    # A chain's ONNX and torch forms would drop the mask: none is declared, so the
    # exporters refuse this container by name (nn/base.py).
    onnx_node = Layer.onnx_node
    torch_module = Layer.torch_module


@torch_family
def _torch_classes(torch) -> dict[str, type]:
    """This family's torch modules, defined at first use (torch is optional)."""
    nn = torch.nn

    class Patchify(nn.Module):
        def __init__(self, grid, out_shape):
            super().__init__()
            self.grid, self.out_shape = tuple(grid), tuple(out_shape)

        def forward(self, x):
            c, gh, p, gw, _ = self.grid
            y = x.reshape(-1, c, gh, p, gw, p).permute(0, 2, 4, 1, 3, 5)
            return y.reshape(-1, *self.out_shape)

    class ClassToken(nn.Module):
        def __init__(self, dim: int):
            super().__init__()
            self.token = nn.Parameter(torch.zeros(dim))

        def forward(self, x):
            return torch.cat([self.token.expand(x.shape[0], 1, -1), x], dim=1)

    class SequencePool(nn.Module):
        def __init__(self, mode: str):
            super().__init__()
            self.mode = mode

        def forward(self, x):
            return x[:, 0] if self.mode == "cls" else x.mean(dim=1)

    return dict(Patchify=Patchify, ClassToken=ClassToken, SequencePool=SequencePool)
