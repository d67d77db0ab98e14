"""Embedding layers: token embeddings, positions (learned and sinusoidal) and the tied
output projection.

Token ids reach a model as an array of any dtype (``Sequential`` casts its input to the
model's float dtype, which holds every id below 2**24 exactly): ``Embedding`` accepts
integer values only and checks them against its vocabulary. An ``Embedding`` is the first
layer of its model: it has no gradient with respect to its input and returns None from
``backward``.

Tied input and output embeddings (GPT-2, nanoGPT): ``TiedDense(embedding)`` computes the
logits ``x @ w.T`` with the ``Embedding``'s own weight and keeps no copy of it. Its
weight gradient goes into the same entry of the model's flat gradient buffer as the
embedding's: ``TiedDense.backward`` hands ``dy`` and ``x`` to ``Embedding.logits_backward``,
which keeps the product in the embedding's own state, and ``Embedding.backward`` (the last
backward of the model, as the first layer) writes the sum of both parts into its gradient.
No layer writes another's fields, and the gradient is final (for the gradient hooks of the
distributed layer) when the embedding's backward returns.
"""
from __future__ import annotations

import numpy as np

from .base import Layer, check_features, torch_family


def embedding_normal(shape, fan_in, fan_out, rng, dtype):
    """N(0, 0.02**2): GPT-2's and nanoGPT's initial token and position embeddings."""
    return (0.02 * rng.standard_normal(size=shape)).astype(dtype)


def _scatter_rows(out: np.ndarray, ids: np.ndarray, rows: np.ndarray) -> None:
    """out[i] += sum of rows[j] where ids[j] == i: rows sorted by id and summed per run
    (np.add.reduceat), about 2x faster than np.add.at on a (4096, 128) batch of tokens."""
    if ids.size == 0:
        return
    order = np.argsort(ids, kind="stable")
    sorted_ids = ids[order]
    starts = np.flatnonzero(np.concatenate(([True], sorted_ids[1:] != sorted_ids[:-1])))
    out[sorted_ids[starts]] += np.add.reduceat(rows[order], starts, axis=0)


class Embedding(Layer):
    """Token embedding: each id of the input becomes row ``id`` of the weight ``w``.

    Args:
        vocab_size: number of token ids (the ids are 0 .. vocab_size - 1).
        dim: width of each embedding.
        padding_idx: an id whose row starts at zero and gets no gradient from the lookup
            (as in ``torch.nn.Embedding``; a ``TiedDense``'s logits still train it, as
            they do a tied torch model's), e.g. the padding token of batched sequences.
        embeddings_initializer: a name of ``distnn.nn.init`` or a callable; default
            ``embedding_normal`` (N(0, 0.02**2)).

    Shape: (N, T) integer ids -> (N, T, dim) (any per-sample shape: (N, ...) ->
    (N, ..., dim)); ``w`` is (vocab_size, dim). The sequence length may differ from the one
    the model was built for.

    Example:
        emb = Embedding(256, 128)
        Sequential([emb, PositionalEmbedding(), ..., TiedDense(emb)], input_shape=(64,))
    """

    def __init__(self, vocab_size: int, dim: int, padding_idx: int | None = None,
                 embeddings_initializer=embedding_normal, name: str | None = None):
        super().__init__(name)
        if int(vocab_size) <= 0 or int(dim) <= 0:
            raise ValueError(f"Embedding: vocab_size and dim must be positive integers, got "
                             f"vocab_size={vocab_size!r}, dim={dim!r}")
        if padding_idx is not None and not 0 <= int(padding_idx) < int(vocab_size):
            raise ValueError(f"Embedding: padding_idx must be an id in [0, {vocab_size}), got "
                             f"{padding_idx!r}")
        self.vocab_size, self.dim = int(vocab_size), int(dim)
        self.padding_idx = None if padding_idx is None else int(padding_idx)
        self.embeddings_initializer = embeddings_initializer
        self._tied_dw: np.ndarray | None = None

    def _build(self, input_shape, rng):
        w = self.add_param("w", (self.vocab_size, self.dim), self.embeddings_initializer, rng,
                           fan_in=self.vocab_size, fan_out=self.dim)
        if self.padding_idx is not None:
            w[self.padding_idx] = 0
        return input_shape + (self.dim,)

    def token_ids(self, x: np.ndarray) -> np.ndarray:
        """x as int64 ids, or ValueError naming this layer and the value at fault."""
        if x.ndim != len(self.input_shape) + 1:
            raise ValueError(f"layer {self.name!r} (Embedding) expects token ids of shape "
                             f"(batch, {', '.join(['T'] * len(self.input_shape))}) but got "
                             f"{tuple(x.shape)}")
        ids = x.astype(np.int64)
        if x.dtype.kind == "f" and not np.array_equal(ids, x):
            bad = x[ids != x].flat[0]
            raise ValueError(f"layer {self.name!r} (Embedding) takes token ids, whole numbers, "
                             f"but got the value {bad!r}; feed the tokenizer's ids, not "
                             "features")
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
            bad = ids.min() if ids.min() < 0 else ids.max()
            raise ValueError(f"layer {self.name!r} (Embedding): token id {int(bad)} is outside "
                             f"its vocabulary of {self.vocab_size} ids (0 .. "
                             f"{self.vocab_size - 1}); build the model with a vocab_size "
                             "above the largest id of the data, or check the tokenizer")
        return ids

    def forward(self, x, training=False):
        self._ids = self.token_ids(x)
        self._tied_dw = None  # a TiedDense's part of the coming backward, if any
        return self.params["w"][self._ids]

    def backward(self, dy):
        dw = self.grads["w"]
        dw[...] = 0 if self._tied_dw is None else self._tied_dw
        self._tied_dw = None
        ids, rows = self._ids.reshape(-1), dy.reshape(-1, self.dim)
        if self.padding_idx is not None:  # read, but not learned through the lookup
            keep = ids != self.padding_idx
            ids, rows = ids[keep], rows[keep]
        _scatter_rows(dw, ids, rows)
        return None

    # -- the tied output projection (TiedDense) -----------------------------------------
    def logits(self, x: np.ndarray) -> np.ndarray:
        """x @ w.T over the last axis: (N, ..., dim) -> (N, ..., vocab_size)."""
        return (x.reshape(-1, self.dim) @ self.params["w"].T).reshape(
            x.shape[:-1] + (self.vocab_size,))

    def logits_backward(self, dy: np.ndarray, x: np.ndarray) -> np.ndarray:
        """The input gradient of ``logits(x)``; its weight gradient dy.T @ x is kept and added
        to ``w``'s gradient by this layer's next ``backward`` (see the module doc)."""
        dy2 = dy.reshape(-1, self.vocab_size)
        dw = dy2.T @ x.reshape(-1, self.dim)  # the padding row too, as a tied torch model's
        self._tied_dw = dw if self._tied_dw is None else self._tied_dw + dw
        return (dy2 @ self.params["w"]).reshape(x.shape)

    # -- declarations -------------------------------------------------------------------
    onnx_ops = ("Gather",)

    def onnx_node(self, g, x):
        ids = g.node("Cast", [x], self, to=7)  # INT64: the model's input is declared float
        return g.node("Gather", [g.const(self, "w", self.params["w"]), ids], self, axis=0)

    def torch_module(self):
        import torch
        module = _torch_classes()["TokenEmbedding"](self.vocab_size, self.dim,
                                                    padding_idx=self.padding_idx)
        module.weight.data = torch.tensor(self.params["w"])
        return module

    @classmethod
    def from_onnx(cls, g, node, attrs):
        w = g.const(node, 0)
        if w is None or w.ndim != 2 or attrs.get("axis", 0) != 0:
            g.refuse(node, "a Gather that is not rows of a constant matrix (an embedding)")
        return cls(w.shape[0], w.shape[1]), {"w": w}

    def describe(self):
        pad = "" if self.padding_idx is None else f", padding_idx={self.padding_idx}"
        return f"vocab_size={self.vocab_size}, dim={self.dim}{pad}"


class TiedDense(Layer):
    """The output projection tied to an ``Embedding``: logits = x @ embedding.w.T (+ b).

    It reads the embedding's weight and keeps none of its own; the weight's gradient is
    accumulated into the embedding's (see the module doc). The embedding must come before
    this layer in the same model.

    Args:
        embedding: the (input) ``Embedding`` whose weight is shared.
        use_bias: add a bias of its own, (vocab_size,).

    Shape: (N, ..., dim) -> (N, ..., vocab_size).

    Example:
        emb = Embedding(256, 128); layers = [emb, ..., LayerNormalization(), TiedDense(emb)]
    """

    def __init__(self, embedding: Embedding, use_bias: bool = False, name: str | None = None):
        super().__init__(name)
        if not isinstance(embedding, Embedding):
            raise ValueError(f"TiedDense: embedding must be an Embedding layer, got "
                             f"{type(embedding).__name__}")
        self.embedding = embedding  # a reference, not a sublayer: its weight is its own
        self.use_bias = bool(use_bias)

    def _build(self, input_shape, rng):
        emb = self.embedding
        if not emb.built:
            raise ValueError(f"TiedDense layer {self.name!r}: its Embedding {emb.name!r} is not "
                             "built yet; put the Embedding earlier in the same model")
        if input_shape[-1] != emb.dim:
            raise ValueError(f"TiedDense layer {self.name!r} needs features of width {emb.dim} "
                             f"(its Embedding's dim) but got per-sample shape {input_shape}")
        if self.use_bias:
            self.add_param("b", (emb.vocab_size,), "zeros", rng)
        return input_shape[:-1] + (emb.vocab_size,)

    def forward(self, x, training=False):
        check_features(self, x)
        self._x = x
        y = self.embedding.logits(x)
        if self.use_bias:
            y += self.params["b"]
        return y

    def backward(self, dy):
        if self.use_bias:
            np.sum(dy.reshape(-1, dy.shape[-1]), axis=0, out=self.grads["b"])
        return self.embedding.logits_backward(dy, self._x)

    def onnx_node(self, g, x):
        name = f"{self.embedding.name}/w"  # the Gather's initializer: tied in the file too
        w = name if any(t.name == name for t in g.inits) else g.const(
            self.embedding, "w", self.embedding.params["w"])
        y = g.node("MatMul", [x, g.node("Transpose", [w], self, perm=[1, 0])], self)
        return g.node("Add", [y, g.const(self, "b", self.params["b"])], self) \
            if self.use_bias else y

    def torch_module(self):
        import torch
        w = self.embedding.params["w"]  # copied: torch_export converts layer by layer
        lin = torch.nn.Linear(w.shape[1], w.shape[0], bias=self.use_bias)
        lin.weight.data = torch.tensor(w)
        if self.use_bias:
            lin.bias.data = torch.tensor(self.params["b"])
        return lin

    def describe(self):
        return f"tied to {self.embedding.name}" + (", use_bias" if self.use_bias else "")


class PositionalEmbedding(Layer):
    """Learned positions: y[:, t] = x[:, t] + w[t] (GPT-2's position embedding).

    Args:
        max_len: the longest sequence; default the sequence length the model is built for.
        initializer: for ``w``; default ``embedding_normal``.

    Shape: (N, T, dim) -> (N, T, dim) for any T <= max_len; ``w`` is (max_len, dim).

    Example:
        [Embedding(256, 128), PositionalEmbedding(), ...]
    """

    def __init__(self, max_len: int | None = None, initializer=embedding_normal,
                 name: str | None = None):
        super().__init__(name)
        if max_len is not None and int(max_len) <= 0:
            raise ValueError(f"PositionalEmbedding: max_len must be a positive integer, got "
                             f"{max_len!r}")
        self.max_len = None if max_len is None else int(max_len)
        self.initializer = initializer

    def _build(self, input_shape, rng):
        _need_sequence(self, input_shape)
        t, d = input_shape
        self.max_len = self.max_len or t
        _check_length(self, t)
        self.add_param("w", (self.max_len, d), self.initializer, rng, fan_in=self.max_len,
                       fan_out=d)
        return input_shape

    def forward(self, x, training=False):
        check_features(self, x)
        _check_length(self, x.shape[1])
        return x + self.params["w"][:x.shape[1]]

    def backward(self, dy):
        dw = self.grads["w"]
        t = dy.shape[1]
        np.sum(dy, axis=0, out=dw[:t])
        dw[t:] = 0
        return dy if self.need_dx else None

    def onnx_node(self, g, x):
        return g.node("Add", [x, g.const(self, "w", self.params["w"][:self.input_shape[0]])],
                      self)

    def torch_module(self):
        import torch
        module = _torch_classes()["AddPositions"](self.max_len, self.input_shape[1])
        module.weight.data = torch.tensor(self.params["w"])
        return module

    def describe(self):
        return f"max_len={self.max_len}"


def sinusoids(length: int, dim: int, dtype=np.float64) -> np.ndarray:
    """The (length, dim) table of "Attention is all you need": sin(t / 10000**(2i/dim)) at
    column 2i, cos at 2i + 1."""
    t = np.arange(length, dtype=np.float64)[:, None]
    freq = np.exp(-np.log(10000.0) * np.arange(0, dim, 2, dtype=np.float64) / dim)
    table = np.zeros((length, dim))
    table[:, 0::2] = np.sin(t * freq)
    table[:, 1::2] = np.cos(t * freq[:dim // 2])
    return table.astype(dtype)


class SinusoidalPositionalEmbedding(Layer):
    """Fixed positions: y[:, t] = x[:, t] + sinusoids(T, dim)[t]; no parameters.

    Args:
        max_len: the longest sequence; default the length the model is built for.

    Shape: (N, T, dim) -> (N, T, dim) for any T <= max_len.
    """

    def __init__(self, max_len: int | None = None, name: str | None = None):
        super().__init__(name)
        self.max_len = None if max_len is None else int(max_len)

    def _build(self, input_shape, rng):
        _need_sequence(self, input_shape)
        self.max_len = self.max_len or input_shape[0]
        _check_length(self, input_shape[0])
        self._table = sinusoids(self.max_len, input_shape[1], self.dtype)
        return input_shape

    def forward(self, x, training=False):
        check_features(self, x)
        _check_length(self, x.shape[1])
        return x + self._table[:x.shape[1]]

    def backward(self, dy):
        return dy if self.need_dx else None

    def onnx_node(self, g, x):
        return g.node("Add", [x, g.const(self, "table", self._table[:self.input_shape[0]])],
                      self)

    def torch_module(self):
        import torch
        module = _torch_classes()["AddPositions"](self.max_len, self.input_shape[1])
        module.weight.requires_grad_(False)
        module.weight.data = torch.tensor(self._table)
        return module

    def describe(self):
        return f"max_len={self.max_len}"


def _need_sequence(layer: Layer, input_shape) -> None:
    if len(input_shape) != 2:
        raise ValueError(f"{type(layer).__name__} layer {layer.name!r} needs per-sample input "
                         f"(T, dim), a sequence of vectors, but got {input_shape}; put an "
                         "Embedding before it")


def _check_length(layer: Layer, length: int) -> None:
    if length > layer.max_len:
        raise ValueError(f"{type(layer).__name__} layer {layer.name!r} holds {layer.max_len} "
                         f"positions but got a sequence of {length}; crop the sequences to "
                         f"{layer.max_len} tokens or build it with max_len >= {length}")


@torch_family
def _torch_classes(torch) -> dict[str, type]:
    """The torch modules of this family, defined at first use (torch is optional)."""
    class TokenEmbedding(torch.nn.Embedding):
        """``nn.Embedding`` taking ids of any dtype, as distnn's ``Embedding``."""

        def forward(self, x):
            return super().forward(x.long())

    class AddPositions(torch.nn.Module):
        """x + weight[:T] for (N, T, dim) input (learned or fixed positions)."""

        def __init__(self, max_len: int, dim: int):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(max_len, dim))

        def forward(self, x):
            return x + self.weight[:x.shape[1]]

    return dict(TokenEmbedding=TokenEmbedding, AddPositions=AddPositions)
