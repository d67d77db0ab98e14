"""Transformer blocks: the pre-LN encoder block and the decoder-only (GPT) block.

Both take the keyword ``key_padding_mask=`` (N, T), True at padding, in ``forward`` and
pass it to their attention; a ``PaddingMask`` container (nn/sequence.py) gives it from the
token ids, outside one they run unmasked.
"""
from __future__ import annotations

import numpy as np

from .activations import GELU, ReLU, SiLU
from .attention import MultiHeadAttention
from .base import Layer, check_features, torch_family
from .core import Dense, Dropout
from .normalization import LayerNormalization

# name -> (the distnn layer, its counterpart for torch.nn.TransformerEncoderLayer)
FEED_FORWARD_ACTIVATIONS = {
    "relu": (ReLU, lambda nn: "relu"),
    "gelu": (GELU, lambda nn: "gelu"),
    # not an nn.GELU: TransformerEncoderLayer's inference fast path takes any nn.GELU for
    # the exact one
    "gelu_tanh": (lambda: GELU("tanh"), lambda nn: _torch_classes()["TanhGELU"]()),
    "silu": (SiLU, lambda nn: nn.SiLU()),
}


def _emit(g, layer: Layer, x: str) -> str:
    """A sublayer's ONNX nodes: its declaration, else the exporter's table (ReLU)."""
    if type(layer).declares("onnx_node"):
        return layer.onnx_node(g, x)
    from .onnx_export import EMITTERS, layer_kind
    return EMITTERS[layer_kind(layer)](g, layer, x)


class _PreLNBlock(Layer):
    """x + drop(attn(ln1(x))), then h + drop(ff2(drop(act(ff1(ln2(h)))))): the pre-LN block
    of GPT-2 and of ``torch.nn.TransformerEncoderLayer(norm_first=True)``."""

    def __init__(self, num_heads: int, ff_dim: int, dropout: float, activation: str,
                 causal: bool, epsilon: float, name: str | None):
        super().__init__(name)
        if int(ff_dim) <= 0:
            raise ValueError(f"{type(self).__name__}: ff_dim must be a positive integer, got "
                             f"{ff_dim!r}")
        if activation not in FEED_FORWARD_ACTIVATIONS:
            raise ValueError(f"{type(self).__name__}: activation={activation!r} is not known; "
                             f"choose one of {sorted(FEED_FORWARD_ACTIVATIONS)}")
        self.num_heads, self.ff_dim = int(num_heads), int(ff_dim)
        self.dropout, self.activation, self.causal = float(dropout), activation, bool(causal)
        self.epsilon = float(epsilon)
        self.ln1 = LayerNormalization(epsilon)
        self.attn = MultiHeadAttention(num_heads, causal=causal, dropout=dropout)
        self.drop1 = Dropout(dropout)
        self.ln2 = LayerNormalization(epsilon)
        self.ff1 = Dense(ff_dim)
        self.act = FEED_FORWARD_ACTIVATIONS[activation][0]()
        self.drop2 = Dropout(dropout)
        self.ff2 = Dense(1)  # its width is the input's, known at build
        self.drop3 = Dropout(dropout)
        self._ff = [self.ff1, self.act, self.drop2, self.ff2, self.drop3]

    def sublayers(self):
        return [self.ln1, self.attn, self.drop1, self.ln2] + self._ff

    def _build(self, input_shape, rng):
        if len(input_shape) != 2:
            raise ValueError(f"{type(self).__name__} {self.name!r} needs per-sample input "
                             f"(length, embed) but got {input_shape}")
        self.ff2.units = input_shape[1]
        shape = input_shape
        for layer in self.sublayers():
            shape = layer.build(shape, rng=rng, dtype=self.dtype)
        return shape

    def forward(self, x, training=False, key_padding_mask=None):
        check_features(self, x)
        a = self.attn.forward(self.ln1.forward(x, training), training,
                              key_padding_mask=key_padding_mask)
        h = x + self.drop1.forward(a, training)
        b = self.ln2.forward(h, training)
        for layer in self._ff:
            b = layer.forward(b, training)
        b += h  # b is new: the last Dense's output or its dropped copy
        return b

    def backward(self, dy):
        db = dy
        for layer in reversed(self._ff):
            db = layer.backward(db)
        dh = self.ln2.backward(db)
        dh += dy
        da = self.attn.backward(self.drop1.backward(dh))
        self.ln1.need_dx = self.need_dx  # the block's dx is the only use of ln1's
        dx = self.ln1.backward(da)
        if dx is None:
            return None
        dx += dh
        return dx

    def _ff_inference(self, h):
        b = self.ln2.forward(h)
        for layer in self._ff:
            b = layer.forward(b)
        return b + h

    # -- declarations -------------------------------------------------------------------
    def onnx_node(self, g, x):
        a = self.attn.onnx_node(g, self.ln1.onnx_node(g, x))
        h = g.node("Add", [x, a], self)
        b = self.ln2.onnx_node(g, h)
        for layer in (self.ff1, self.act, self.ff2):  # dropout: the identity in inference
            b = _emit(g, layer, b)
        return g.node("Add", [h, b], self)

    def torch_module(self):
        import torch
        nn = torch.nn
        e = self.input_shape[1]
        layer = nn.TransformerEncoderLayer(
            e, self.num_heads, self.ff_dim, self.dropout,
            activation=FEED_FORWARD_ACTIVATIONS[self.activation][1](nn),
            layer_norm_eps=self.epsilon, batch_first=True, norm_first=True)
        layer = layer.to(torch.float64 if self.dtype == np.float64 else torch.float32)
        layer.self_attn.load_state_dict(self.attn.torch_module().mha.state_dict())
        for mine, theirs in ((self.ln1, layer.norm1), (self.ln2, layer.norm2),
                             (self.ff1, layer.linear1), (self.ff2, layer.linear2)):
            theirs.load_state_dict(mine.torch_module().state_dict())
        return _torch_classes()["Block"](layer, self.causal)

    def describe(self):
        extra = [f"num_heads={self.num_heads}", f"ff_dim={self.ff_dim}",
                 f"activation={self.activation!r}"]
        return ", ".join(extra + ([f"dropout={self.dropout}"] if self.dropout else []))


class TransformerEncoderBlock(_PreLNBlock):
    """Pre-LN transformer encoder block (``torch.nn.TransformerEncoderLayer(norm_first=True,
    batch_first=True)``, the same weights give the same forward and backward).

    Args:
        num_heads: attention heads; must divide the embedding width.
        ff_dim: width of the feed-forward hidden layer.
        dropout: after the attention and the feed-forward, between the feed-forward's
            layers, and on the attention weights (torch's one ``dropout``).
        activation: of the feed-forward: "relu", "gelu", "gelu_tanh" or "silu".
        causal: each position attends only to itself and those before.
        epsilon: of both layer norms.

    Shape: (N, T, E) -> (N, T, E) for any T; takes ``key_padding_mask`` (see the module
    doc). Sublayers (in the flat buffers' order): ln1, attn, ln2, ff1, ff2.

    Example:
        [Patchify(7), Dense(64), ClassToken(), PositionalEmbedding(),
         TransformerEncoderBlock(4, 128), ...]  # nn/sequence.py's patches and class token
    """

    def __init__(self, num_heads: int, ff_dim: int, dropout: float = 0.0,
                 activation: str = "relu", causal: bool = False, epsilon: float = 1e-5,
                 name: str | None = None):
        super().__init__(num_heads, ff_dim, dropout, activation, causal, epsilon, name)


class TransformerDecoderBlock(_PreLNBlock):
    """Decoder-only (GPT) block: pre-LN, causal self-attention, then the feed-forward;
    the same computation as ``TransformerEncoderBlock(..., causal=True)``, plus ``decode``
    for generation with a key/value cache.

    Args:
        num_heads, ff_dim, dropout, epsilon: as ``TransformerEncoderBlock``.
        activation: default "gelu" (GPT-2's is "gelu_tanh").

    Shape: (N, T, E) -> (N, T, E) for any T.

    Example:
        emb = Embedding(256, 128)
        [emb, PositionalEmbedding(), *[TransformerDecoderBlock(4, 512) for _ in range(4)],
         LayerNormalization(), TiedDense(emb)]
    """

    def __init__(self, num_heads: int, ff_dim: int, dropout: float = 0.0,
                 activation: str = "gelu", epsilon: float = 1e-5, name: str | None = None):
        super().__init__(num_heads, ff_dim, dropout, activation, True, epsilon, name)

    def decode(self, x_new: np.ndarray, cache) -> np.ndarray:
        """Inference outputs (N, t, E) of t new positions after those in ``cache`` (a
        ``distnn.nn.attention.KVCache``, one per block), which gets their keys and values."""
        check_features(self, x_new)
        h = x_new + self.attn.decode(self.ln1.forward(x_new), cache)
        return self._ff_inference(h)


@torch_family
def _torch_classes(torch) -> dict[str, type]:
    """The blocks' torch modules, defined at first use (torch is optional)."""
    nn = torch.nn

    class Block(nn.Module):
        """An ``nn.TransformerEncoderLayer`` as ``self.layer``, with the causal mask."""

        def __init__(self, layer, causal: bool):
            super().__init__()
            self.layer, self.causal = layer, causal

        def forward(self, x, key_padding_mask=None):
            mask = None
            if self.causal:  # bool, as the padding mask: True where attention is barred
                n = x.shape[1]
                mask = torch.ones(n, n, dtype=torch.bool, device=x.device).triu(1)
            return self.layer(x, src_mask=mask, src_key_padding_mask=key_padding_mask,
                              is_causal=self.causal)

    class TanhGELU(nn.Module):
        def forward(self, x):
            return nn.functional.gelu(x, approximate="tanh")

    return dict(Block=Block, TanhGELU=TanhGELU)
