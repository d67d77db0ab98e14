"""Multi-head attention over (N, T, E) sequences, and its key/value cache for generation.

``MultiHeadAttention`` follows the layer contract for self-attention (``forward(x,
training)`` / ``backward(dy)``); cross-attention goes through ``attend(x, memory, ...)`` /
``attend_backward(dy) -> (dx, dmemory)``. The attention itself is
``distnn.kernels.attention``'s tiled kernel (memory linear in T, the score matrix never
stored); with attention dropout in training it is the kernel's whole-matrix reference
instead, with a keep mask drawn from the layer's own generator, because the tiled
backward recomputes probabilities and would need the same mask tile by tile.

The cache API (what a Transformer block threads through for generation):

    cache = KVCache()                      # one per attention layer, empty
    y = mha.decode(x_prompt, cache)        # (N, t, E): the prompt's outputs; cache holds t
    y = mha.decode(x_next, cache)          # (N, 1, E): the next position; cache holds t + 1

``decode`` is inference only and causal: the new positions attend to every cached one and
to the new ones before them, exactly what ``forward`` gives the same positions of the
whole sequence. ``KVCache.length`` is the number of cached positions; ``cache.k`` and
``cache.v`` are (N, H, length, E / H).
"""
from __future__ import annotations

import math

import numpy as np

from .. import kernels as K
from ..kernels.attention import (attention_backward, attention_forward,
                                 attention_reference, attention_reference_backward)
from .base import Layer

__all__ = ["MultiHeadAttention", "KVCache"]


class KVCache:
    """The keys and values of the positions one ``MultiHeadAttention`` has decoded so far
    (see the module doc); start empty, pass to ``decode`` at every step."""

    def __init__(self):
        self.k: np.ndarray | None = None
        self.v: np.ndarray | None = None

    @property
    def length(self) -> int:
        return 0 if self.k is None else self.k.shape[2]

    def append(self, k: np.ndarray, v: np.ndarray) -> None:
        """Add the keys and values (N, H, t, Dh) of t new positions."""
        if self.k is None:
            self.k, self.v = k, v
            return
        if k.shape[:2] != self.k.shape[:2]:
            raise ValueError(f"KVCache: new keys {k.shape} do not match the cached "
                             f"{self.k.shape} (batch, heads); use one cache per sequence batch")
        self.k = np.concatenate([self.k, k], axis=2)
        self.v = np.concatenate([self.v, v], axis=2)


class MultiHeadAttention(Layer):
    """Multi-head scaled dot-product attention (PyTorch's ``nn.MultiheadAttention``).

    y = concat_h(softmax(q_h k_h^T / sqrt(Dh) + mask) v_h) @ wo + bo, with q = x @ wq + bq,
    k = memory @ wk + bk, v = memory @ wv + bv (memory = x for self-attention), Dh = E / H.

    Args:
        num_heads: heads H; must divide the embedding size E.
        causal: position i attends only positions j <= i (self-attention; in
            cross-attention the mask is aligned to the end of the memory).
        dropout: probability of dropping an attention weight in training (after the
            softmax, as PyTorch); the layer's own generator draws the masks.
        use_bias: the four projection biases.
        kdim / vdim: feature sizes of the memory's keys and values in cross-attention
            (default E); ``vdim`` other than ``kdim`` needs ``value=`` in ``attend``.
        seed / rng: the dropout generator (default: spawned from the build generator).

    Shape: (N, T, E) -> (N, T, E); params ``wq`` (E, E), ``wk`` (kdim, E), ``wv`` (vdim,
    E), ``wo`` (E, E) (inputs times weights, as ``Dense``), ``bq``, ``bk``, ``bv``, ``bo``
    (E,). A ``key_padding_mask`` is bool (N, Tk), True where a key is padding.

    Example:
        mha = MultiHeadAttention(4, causal=True)
        mha.build((128, 64), rng=np.random.default_rng(0))
        y = mha.forward(x, training=True)            # x (N, 128, 64)
        dx = mha.backward(dy)
    """

    def __init__(self, num_heads: int, causal: bool = False, dropout: float = 0.0,
                 use_bias: bool = True, kdim: int | None = None, vdim: int | None = None,
                 seed: int | None = None, rng: np.random.Generator | None = None,
                 name: str | None = None):
        super().__init__(name)
        if int(num_heads) <= 0:
            raise ValueError(f"MultiHeadAttention: num_heads must be a positive integer, "
                             f"got {num_heads!r}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"MultiHeadAttention: dropout must be in [0, 1), got {dropout!r}")
        self.num_heads = int(num_heads)
        self.causal = bool(causal)
        self.dropout = float(dropout)
        self.use_bias = bool(use_bias)
        self.kdim, self.vdim = kdim, vdim
        self.rng = rng if rng is not None else (
            np.random.default_rng(seed) if seed is not None else None)

    def _build(self, input_shape, rng):
        if len(input_shape) != 2:
            raise ValueError(f"MultiHeadAttention {self.name!r} needs per-sample input "
                             f"(length, embed) but got {input_shape}")
        e = input_shape[1]
        if e % self.num_heads:
            raise ValueError(f"MultiHeadAttention {self.name!r}: embed size {e} is not a "
                             f"multiple of num_heads={self.num_heads}; change either")
        self.embed = e
        kdim = self.kdim or e
        vdim = self.vdim or kdim
        for key, fan_in in (("wq", e), ("wk", kdim), ("wv", vdim), ("wo", e)):
            self.add_param(key, (fan_in, e), "glorot_uniform", rng, fan_in=fan_in, fan_out=e)
        if self.use_bias:
            for key in ("bq", "bk", "bv", "bo"):
                self.add_param(key, (e,), "zeros", rng)
        if self.rng is None:
            self.rng = rng.spawn(1)[0]
        return input_shape

    # -- pieces ------------------------------------------------------------------------
    def _project(self, x, key):
        w = self.params["w" + key]
        y = K.matmul(x.reshape(-1, x.shape[2]), w)  # one 2-D GEMM, not a batch of them
        if self.use_bias:
            y += self.params["b" + key]
        return y.reshape(x.shape[0], x.shape[1], w.shape[1])

    def _unproject(self, d, key):
        """d (N, T, E) times w.T: the gradient of a projection's input."""
        w = self.params["w" + key]
        return K.matmul(d.reshape(-1, w.shape[1]), w.T).reshape(d.shape[0], d.shape[1],
                                                                 w.shape[0])

    def _heads(self, y):
        """(N, T, E) -> (N, H, T, Dh), contiguous."""
        n, t, e = y.shape
        return np.ascontiguousarray(
            y.reshape(n, t, self.num_heads, e // self.num_heads).transpose(0, 2, 1, 3))

    @staticmethod
    def _merge(y):
        """(N, H, T, Dh) -> (N, T, H * Dh)."""
        n, h, t, d = y.shape
        return np.ascontiguousarray(y.transpose(0, 2, 1, 3)).reshape(n, t, h * d)

    def _check(self, x, what="x", dim=None):
        dim = self.embed if dim is None else dim
        if x.ndim != 3 or x.shape[2] != dim:
            raise ValueError(f"layer {self.name!r} (MultiHeadAttention) expects {what} of "
                             f"shape (batch, length, {dim}) but got {tuple(x.shape)}")

    def _run(self, x, memory, value, training, key_padding_mask):
        self._check(x)
        self._check(memory, "memory", self.params["wk"].shape[0])
        self._check(value, "value", self.params["wv"].shape[0])
        if key_padding_mask is not None:
            key_padding_mask = np.asarray(key_padding_mask, dtype=bool)
        q = self._heads(self._project(x, "q"))
        k = self._heads(self._project(memory, "k"))
        v = self._heads(self._project(value, "v"))
        keep = None
        if training and self.dropout > 0:
            shape = q.shape[:3] + (k.shape[2],)
            keep = (self.rng.random(shape) >= self.dropout).astype(q.dtype)
            keep /= q.dtype.type(1.0 - self.dropout)
            o, p = attention_reference(q, k, v, causal=self.causal,
                                       key_padding_mask=key_padding_mask, dropout=keep)
            stats = p
        else:
            o, stats = attention_forward(q, k, v, causal=self.causal,
                                         key_padding_mask=key_padding_mask)
        om = self._merge(o)
        self._saved = (x, memory, value, q, k, v, o, stats, keep, om, key_padding_mask)
        return self._project(om, "o")

    def _run_backward(self, dy):
        x, memory, value, q, k, v, o, stats, keep, om, mask = self._saved
        e = self.embed
        g = self.grads
        dy2 = dy.reshape(-1, e)
        K.matmul(om.reshape(-1, e).T, dy2, out=g["wo"])
        if self.use_bias:
            np.sum(dy2, axis=0, out=g["bo"])
        do = self._heads(self._unproject(dy, "o"))
        if keep is not None:
            dq, dk, dv = attention_reference_backward(q, k, v, stats, do, dropout=keep)
        else:
            dq, dk, dv = attention_backward(q, k, v, o, stats, do, causal=self.causal,
                                            key_padding_mask=mask)
        dins = []
        for key, inp, d in (("q", x, dq), ("k", memory, dk), ("v", value, dv)):
            d = self._merge(d)
            d2 = d.reshape(-1, e)
            K.matmul(inp.reshape(-1, inp.shape[2]).T, d2, out=g["w" + key])
            if self.use_bias:
                np.sum(d2, axis=0, out=g["b" + key])
            dins.append(self._unproject(d, key))
        return dins

    # -- self-attention: the layer contract --------------------------------------------
    def forward(self, x: np.ndarray, training: bool = False,
                key_padding_mask: np.ndarray | None = None) -> np.ndarray:
        """Self-attention of x (N, T, E); any T (the built length is the export's)."""
        self._cross = False
        return self._run(x, x, x, training, key_padding_mask)

    def backward(self, dy: np.ndarray) -> np.ndarray | None:
        if self._cross:
            raise RuntimeError(f"layer {self.name!r}: the last pass was attend(); call "
                               "attend_backward(dy)")
        dq, dk, dv = self._run_backward(dy)
        if not self.need_dx:
            return None
        dq += dk
        dq += dv
        return dq

    # -- cross-attention ---------------------------------------------------------------
    def attend(self, x: np.ndarray, memory: np.ndarray, training: bool = False,
               key_padding_mask: np.ndarray | None = None,
               value: np.ndarray | None = None) -> np.ndarray:
        """Queries from x (N, Tq, E), keys from memory (N, Tk, kdim) and values from
        ``value`` (N, Tk, vdim; default: memory); ``key_padding_mask`` (N, Tk)."""
        self._cross = True
        self._separate_value = value is not None
        return self._run(x, memory, memory if value is None else value, training,
                         key_padding_mask)

    def attend_backward(self, dy: np.ndarray) -> tuple[np.ndarray, ...]:
        """``(dx, dmemory)`` of the last ``attend`` (``(dx, dmemory, dvalue)`` when it had
        a separate ``value``); overwrites the grads."""
        if not self._cross:
            raise RuntimeError(f"layer {self.name!r}: the last pass was forward(); call "
                               "backward(dy)")
        dx, dk, dv = self._run_backward(dy)
        if self._separate_value:
            return dx, dk, dv
        dk += dv
        return dx, dk

    # -- generation ----------------------------------------------------------------------
    def decode(self, x_new: np.ndarray, cache: KVCache) -> np.ndarray:
        """Outputs (N, t, E) of t new positions x_new (N, t, E) after the ``cache.length``
        positions in ``cache``, which gets their keys and values (inference, causal)."""
        if not self.causal:
            raise ValueError(f"layer {self.name!r}: decode needs a causal MultiHeadAttention "
                             "(causal=True); a non-causal layer sees future positions")
        self._check(x_new, "x_new")
        q = self._heads(self._project(x_new, "q"))
        cache.append(self._heads(self._project(x_new, "k")),
                     self._heads(self._project(x_new, "v")))
        o, _ = attention_forward(q, cache.k, cache.v, causal=True)
        return self._project(self._merge(o), "o")

    # -- declarations ------------------------------------------------------------------
    def torch_module(self):
        import torch
        return _torch_class()(self, torch)

    def onnx_node(self, g, x: str) -> str:
        """Self-attention at the built length T: MatMul/Add projections, Reshape and
        Transpose to heads, Softmax of scaled scores (plus a -inf mask when causal)."""
        t, e = self.input_shape
        h = self.num_heads
        p = self.params

        def ints(key, values):
            name = f"{self.name}/{key}"
            g.inits.append(g.numpy_helper.from_array(np.array(values, np.int64), name))
            return name

        def proj(inp, key):
            y = g.node("MatMul", [inp, g.const(self, "w" + key, p["w" + key])], self)
            if self.use_bias:
                y = g.node("Add", [y, g.const(self, "b" + key, p["b" + key])], self)
            return y

        heads = ints("heads_shape", [0, 0, h, e // h])
        q, k, v = (g.node("Reshape", [proj(x, key), heads], self) for key in "qkv")
        q = g.node("Transpose", [q], self, perm=[0, 2, 1, 3])
        k = g.node("Transpose", [k], self, perm=[0, 2, 3, 1])
        v = g.node("Transpose", [v], self, perm=[0, 2, 1, 3])
        s = g.node("MatMul", [q, k], self)
        s = g.node("Mul", [s, g.const(self, "scale", np.array(1.0 / math.sqrt(e // h)))], self)
        if self.causal:
            mask = np.triu(np.full((t, t), -np.inf, np.float32), 1)
            s = g.node("Add", [s, g.const(self, "causal_mask", mask)], self)
        o = g.node("MatMul", [g.node("Softmax", [s], self, axis=-1), v], self)
        o = g.node("Transpose", [o], self, perm=[0, 2, 1, 3])
        return proj(g.node("Reshape", [o, ints("merge_shape", [0, 0, e])], self), "o")

    onnx_patterns = ("Transpose",)

    @classmethod
    def from_onnx_pattern(cls, g, node):
        """What ``torch.onnx.export`` writes for a batch-first ``nn.MultiheadAttention``
        (both exporters): see ``attention_onnx.torch_attention``."""
        from .attention_onnx import torch_attention
        return torch_attention(cls, g, node)

    def describe(self):
        extra = [f"num_heads={self.num_heads}"]
        extra += ["causal=True"] if self.causal else []
        extra += [f"dropout={self.dropout}"] if self.dropout else []
        extra += [] if self.use_bias else ["use_bias=False"]
        return ", ".join(extra)


_TORCH = {}


def _torch_class():
    """``TorchSelfAttention``, defined once torch is imported: ``nn.MultiheadAttention``
    (batch_first) as a one-input module for self-attention, the causal mask built per call."""
    if "cls" in _TORCH:
        return _TORCH["cls"]
    import torch
    from torch import nn

    class TorchSelfAttention(nn.Module):
        """distnn's MultiHeadAttention as ``self.mha`` (an ``nn.MultiheadAttention``)."""

        def __init__(self, layer, torch_):
            super().__init__()
            p, e = layer.params, layer.embed
            kdim = p["wk"].shape[0]
            vdim = p["wv"].shape[0]
            self.causal = layer.causal
            self.mha = nn.MultiheadAttention(e, layer.num_heads, dropout=layer.dropout,
                                             bias=layer.use_bias, batch_first=True,
                                             kdim=kdim, vdim=vdim)
            t = {key: torch_.from_numpy(np.array(a, copy=True)) for key, a in p.items()}
            if self.mha._qkv_same_embed_dim:
                self.mha.in_proj_weight.data = torch_.cat([t["wq"].T, t["wk"].T, t["wv"].T])
            else:
                self.mha.q_proj_weight.data = t["wq"].T.contiguous()
                self.mha.k_proj_weight.data = t["wk"].T.contiguous()
                self.mha.v_proj_weight.data = t["wv"].T.contiguous()
            self.mha.out_proj.weight.data = t["wo"].T.contiguous()
            if layer.use_bias:
                self.mha.in_proj_bias.data = torch_.cat([t["bq"], t["bk"], t["bv"]])
                self.mha.out_proj.bias.data = t["bo"]

        def forward(self, x, key_padding_mask=None):
            mask = None
            if self.causal:
                n = x.shape[1]
                mask = torch.ones(n, n, dtype=torch.bool, device=x.device).triu(1)
            kv = x
            if torch.jit.is_tracing():
                # MHA's fused inference path is taken only when query, key and value are
                # one tensor and autograd is off, which the trace's check run changes:
                # a copy keeps one path, and the trace passes its check (save_torch)
                kv = x.clone()
            return self.mha(x, kv, kv, key_padding_mask=key_padding_mask, attn_mask=mask,
                            need_weights=False)[0]

    _TORCH["cls"] = TorchSelfAttention
    return TorchSelfAttention
