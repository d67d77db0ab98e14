"""Reading the attention ``torch.onnx.export`` writes for a batch-first
``nn.MultiheadAttention`` (the legacy exporter and the torch.export one) back into one
``MultiHeadAttention``: ``MultiHeadAttention.from_onnx_pattern`` calls
``torch_attention``. models/onnx_import.py's reader hands it the graph ``g`` (constants
``g.consts``, readers of a tensor ``g.consumers``, ``g.attrs(node)``, ``g.refuse``)."""
from __future__ import annotations

import numpy as np

__all__ = ["torch_attention"]


# The ops torch's exporters write between the packed input projection and the output
# projection: head reshapes (with the shape arithmetic of the legacy exporter), the
# q/k/v selection, the scaled scores, the softmax and the weighted sum.
_INSIDE = {"Reshape", "Transpose", "Unsqueeze", "Squeeze", "Gather", "Shape", "Slice",
           "Concat", "Mod", "Cast", "Sqrt", "Div", "Mul", "Add", "MatMul", "Softmax",
           "Identity", "Split", "Expand", "Trilu", "Equal", "Where"}


def _only_reader(g, tensor, op):
    readers = g.consumers.get(tensor, [])
    return readers[0] if len(readers) == 1 and readers[0].op_type == op else None


def _bias_after(g, tensor, size):
    """(bias, tensor after it) when ``tensor``'s only reader adds a constant (size,)."""
    add = _only_reader(g, tensor, "Add")
    if add is not None:
        consts = [g.consts[i] for i in add.input if i in g.consts]
        if len(consts) == 1 and consts[0].shape == (size,):
            return consts[0], add.output[0]
    return None, tensor


def _region(g, start, t, e):
    """(the nodes between the in_proj's output ``t`` and the (E, E) out_proj, that out_proj
    node): a walk over the readers of ``t`` that refuses an op outside ``_INSIDE``, a second
    (E, E) projection, or a region without a softmax."""
    region, out, frontier, seen = [], None, [t], set()
    while frontier:
        for n in g.consumers.get(frontier.pop(), []):
            if id(n) in seen:
                continue
            seen.add(id(n))
            wo = g.consts.get(n.input[1]) if n.op_type in ("Gemm", "MatMul") else None
            if wo is not None and wo.shape == (e, e):
                if out is not None:
                    g.refuse(n, "a second (E, E) projection inside one attention")
                out = n
                continue
            if n.op_type not in _INSIDE or len(region) > 200:
                g.refuse(n, f"inside the attention that starts at {start.name!r}; distnn "
                         f"reads {', '.join(sorted(_INSIDE))} there")
            region.append(n)
            frontier.extend(n.output)
    if out is None or not any(n.op_type == "Softmax" for n in region):
        g.refuse(start, "an (E, 3E) input projection without a softmax and an (E, E) "
                 "output projection after it; not an attention distnn reads")
    return region, out


def _causal(g, region) -> bool:
    """Whether the region masks causally: SDPA's is_causal mask from a lower Trilu of ones
    (Equal 0 -> Where -inf), or a constant -inf upper triangle added to the scores (any
    other added mask is refused)."""
    causal = any(n.op_type == "Trilu" and not g.attrs(n).get("upper", 1) for n in region)
    for n in region:
        masks = [g.consts[i] for i in n.input if i in g.consts
                 and g.consts[i].ndim >= 2 and g.consts[i].dtype.kind == "f"]
        if n.op_type == "Add" and masks:
            m = masks[0].reshape(masks[0].shape[-2:])
            if not np.array_equal(np.isneginf(m), np.triu(np.ones(m.shape, bool), 1)):
                g.refuse(n, "an attention mask other than the causal one")
            causal = True
    return causal


def _out_projection(g, out, e):
    """(wo (E, E) as ``x @ wo``, bo or None, the tensor after them) of the out_proj node
    (a Gemm with its transB, alpha, beta and bias, or a MatMul with an Add after it)."""
    attrs = g.attrs(out)
    wo = g.consts[out.input[1]]
    bo = None
    if out.op_type == "Gemm":
        wo = (wo.T if attrs.get("transB", 0) else wo) * attrs.get("alpha", 1.0)
        if len(out.input) > 2 and out.input[2]:
            bo = g.const(out, 2) * attrs.get("beta", 1.0)
    t = out.output[0]
    if bo is None:
        bo, t = _bias_after(g, t, e)
    return wo, bo, t


def torch_attention(cls, g, start):
    """Transpose (1, 0, 2) -> MatMul by the packed (E, 3E) in_proj weight (+ its bias) ->
    the heads' reshapes, scores, Softmax -> Gemm/MatMul by the (E, E) out_proj ->
    Reshape -> Transpose (1, 0, 2): one MultiHeadAttention (the heads from the reshape
    that splits q into heads; causal when a constant -inf upper triangle is added to the
    scores, or when SDPA's is_causal mask comes from a lower Trilu). None where ``start``
    does not begin an in_proj."""
    if list(g.attrs(start).get("perm", ())) != [1, 0, 2]:
        return None
    inproj = _only_reader(g, start.output[0], "MatMul")
    w = g.consts.get(inproj.input[1]) if inproj is not None else None
    if w is None or w.ndim != 2 or w.shape[1] != 3 * w.shape[0]:
        return None
    e = w.shape[0]
    b, t = _bias_after(g, inproj.output[0], 3 * e)
    region, out = _region(g, start, t, e)
    made = {o: n for n in region for o in n.output}
    head_dims = [int(g.consts[n.input[1]].reshape(-1)[-1]) for n in region
                 if n.op_type == "Reshape" and n.input[1] in g.consts
                 and getattr(made.get(n.input[0]), "op_type", None) == "Gather"]
    if not head_dims or head_dims[0] <= 0 or e % head_dims[0]:
        g.refuse(start, "no reshape of q into heads with a constant head size")
    causal = _causal(g, region)
    wo, bo, t = _out_projection(g, out, e)
    reshape = _only_reader(g, t, "Reshape")
    back = _only_reader(g, reshape.output[0], "Transpose") if reshape is not None else None
    if back is None or list(g.attrs(back).get("perm", ())) != [1, 0, 2]:
        g.refuse(out, "the attention's output is not reshaped and transposed back to "
                 "batch-first (N, T, E)")
    zeros = np.zeros(e, w.dtype)
    b = np.concatenate([zeros] * 3) if b is None else b
    arrays = {"wq": w[:, :e], "wk": w[:, e:2 * e], "wv": w[:, 2 * e:], "wo": wo,
              "bq": b[:e], "bk": b[e:2 * e], "bv": b[2 * e:],
              "bo": zeros if bo is None else bo}
    return cls(e // head_dims[0], causal=causal), arrays, back.output[0]
