"""Theano's neural-network names that PyTensor moved or dropped, over what PyTensor has.

PyTensor (Theano's maintained successor) keeps ``softmax``/``sigmoid``/``log_softmax`` but
has no ``tensor.nnet`` module, no ``nnet.conv2d`` and no ``signal.pool.pool_2d``. Here
they are as PyTensor expressions with Theano's signatures and semantics:

* ``conv2d``: im2col (``Im2Col``, a NumPy strided view copied out, its gradient the
  col2im sum ``Col2Im``) and one matrix product: two ops, not one per kernel entry, so
  the graphs compile quickly. ``filter_flip=True`` (Theano's default)
  is a true convolution (the kernel flipped), as in Theano.
* ``pool_2d``: the maximum, sum or mean over the window's strided slices, with Theano's
  output size for ``ignore_border`` False and True and its three average modes.

``theano_shim`` serves these under their Theano module paths.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import pytensor
import pytensor.tensor as pt
from pytensor.graph.basic import Apply
from pytensor.graph.op import Op
from pytensor.tensor.special import softmax as _softmax

POOL_MODES = ("max", "sum", "average_inc_pad", "average_exc_pad")


class Im2Col(Op):
    """(B, C, H, W) -> (B, C, kh, kw, H', W'): every kernel entry's strided view of the
    (already padded) input."""

    __props__ = ("kh", "kw", "sh", "sw", "dh", "dw")

    def __init__(self, kh, kw, sh, sw, dh, dw):
        self.kh, self.kw, self.sh, self.sw, self.dh, self.dw = kh, kw, sh, sw, dh, dw

    def _out(self, h, w):
        return ((h - self.dh * (self.kh - 1) - 1) // self.sh + 1,
                (w - self.dw * (self.kw - 1) - 1) // self.sw + 1)

    def make_node(self, x):
        x = pt.as_tensor_variable(x)
        return Apply(self, [x], [pt.tensor(dtype=x.dtype, shape=(None,) * 6)])

    def perform(self, node, inputs, output_storage):
        (x,) = inputs
        ho, wo = self._out(*x.shape[2:])
        view = np.lib.stride_tricks.sliding_window_view(
            x, (self.dh * (self.kh - 1) + 1, self.dw * (self.kw - 1) + 1), axis=(2, 3))
        view = view[:, :, : self.sh * (ho - 1) + 1: self.sh, : self.sw * (wo - 1) + 1: self.sw,
                    :: self.dh, :: self.dw]
        output_storage[0][0] = np.ascontiguousarray(view.transpose(0, 1, 4, 5, 2, 3))

    def infer_shape(self, fgraph, node, shapes):
        b, c, h, w = shapes[0]
        return [(b, c, self.kh, self.kw, *self._out(h, w))]

    def pullback(self, inputs, outputs, cotangents):
        return [Col2Im(*self.__props_tuple__())(cotangents[0], inputs[0])]

    def __props_tuple__(self):
        return (self.kh, self.kw, self.sh, self.sw, self.dh, self.dw)


class Col2Im(Im2Col):
    """The adjoint of ``Im2Col``: (B, C, kh, kw, H', W') summed back into an image shaped
    like the second input."""

    def make_node(self, cols, like):
        cols, like = pt.as_tensor_variable(cols), pt.as_tensor_variable(like)
        return Apply(self, [cols, like], [like.type()])

    def perform(self, node, inputs, output_storage):
        cols, like = inputs
        out = np.zeros_like(like)
        ho, wo = cols.shape[4:]
        for i in range(self.kh):
            for j in range(self.kw):
                out[:, :, i * self.dh: i * self.dh + self.sh * (ho - 1) + 1: self.sh,
                    j * self.dw: j * self.dw + self.sw * (wo - 1) + 1: self.sw] += cols[:, :, i, j]
        output_storage[0][0] = out

    def infer_shape(self, fgraph, node, shapes):
        return [shapes[1]]

    def pullback(self, inputs, outputs, cotangents):
        return [Im2Col(*self.__props_tuple__())(cotangents[0]), inputs[1].zeros_like()]

    def connection_pattern(self, node):
        return [[True], [False]]


def _pair(value, name: str) -> tuple[int, int]:
    if isinstance(value, int):
        return value, value
    try:
        a, b = (int(v) for v in value)
    except (TypeError, ValueError):
        raise ValueError(f"{name}={value!r}: give an int or a pair of ints") from None
    return a, b


def _kernel_size(filters, filter_shape) -> tuple[int, int]:
    """(kh, kw) as Python ints: from the static type, ``filter_shape``, or the value of a
    filter that depends on shared variables only (a model's weights)."""
    static = filters.type.shape[-2:]
    if all(s is not None for s in static):
        return int(static[0]), int(static[1])
    if filter_shape is not None and all(s is not None for s in filter_shape[-2:]):
        return int(filter_shape[-2]), int(filter_shape[-1])
    try:
        kh, kw = filters.shape[-2:].eval()
    except Exception:
        raise ValueError("conv2d: the filters' height and width are not known; give "
                         "filter_shape=(out, in, kh, kw)") from None
    return int(kh), int(kw)


def conv2d(input, filters, input_shape=None, filter_shape=None, border_mode="valid",
           subsample=(1, 1), filter_flip: bool = True, image_shape=None,
           filter_dilation=(1, 1), num_groups: int = 1, unshared: bool = False, **kwargs):
    """Theano's ``tensor.nnet.conv2d``: (B, C, H, W) * (O, C, kh, kw) -> (B, O, H', W').

    Args:
        border_mode: "valid", "full", "half" (same size for odd kernels), an int or a pair.
        subsample: the strides; filter_dilation: the dilation.
        filter_flip: flip the kernel (a convolution, Theano's default) or not
            (a cross-correlation).
        input_shape / image_shape, filter_shape: optional static shapes (only the kernel
            size is used, when the filters' type does not give it).

    Example:
        y = conv2d(x, W, border_mode="half") + b.dimshuffle("x", 0, "x", "x")
    """
    if num_groups != 1 or unshared:
        raise ValueError(f"conv2d: num_groups={num_groups}, unshared={unshared} are not "
                         "provided over PyTensor; use num_groups=1, unshared=False")
    if filter_shape is None:
        filter_shape = kwargs.get("filter_shape")
    x = pt.as_tensor_variable(input)
    w = pt.as_tensor_variable(filters)
    kh, kw = _kernel_size(w, filter_shape)
    sh, sw = _pair(subsample, "subsample")
    dh, dw = _pair(filter_dilation, "filter_dilation")
    eh, ew = dh * (kh - 1) + 1, dw * (kw - 1) + 1  # the dilated kernel's extent
    modes = {"valid": (0, 0), "full": (eh - 1, ew - 1), "half": (eh // 2, ew // 2)}
    if isinstance(border_mode, str):
        if border_mode not in modes:
            raise ValueError(f"conv2d: border_mode={border_mode!r}; give 'valid', 'full', "
                             "'half', an int or a pair of ints")
        ph, pw = modes[border_mode]
    else:
        ph, pw = _pair(border_mode, "border_mode")
    if filter_flip:
        w = w[:, :, ::-1, ::-1]
    if ph or pw:
        x = pt.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    ho = (x.shape[2] - eh) // sh + 1
    wo = (x.shape[3] - ew) // sw + 1
    patches = Im2Col(kh, kw, sh, sw, dh, dw)(x)  # (B, C, kh, kw, H', W'): w's order
    b, c = x.shape[0], x.shape[1]
    patches = patches.reshape((b, c * kh * kw, ho * wo))
    w2 = w.reshape((w.shape[0], c * kh * kw))
    y = pt.tensordot(patches, w2, axes=[[1], [1]])  # (B, H'*W', O)
    return y.dimshuffle(0, 2, 1).reshape((b, w.shape[0], ho, wo))


def _pooled_size(r, w: int, s: int, ignore_border: bool):
    """Theano's output length for an input of length ``r`` (padding included)."""
    if ignore_border:
        return (r - w) // s + 1
    if s >= w:
        return (r - 1) // s + 1
    return pt.maximum(0, (r - 1 - w + s) // s) + 1


def _extend(x, axis: int, amount, value):
    """``x`` with ``amount`` (symbolic, >= 0) entries of ``value`` appended along ``axis``."""
    shape = [x.shape[k] for k in range(x.ndim)]
    shape[axis] = amount
    return pt.concatenate([x, pt.alloc(pt.cast(value, x.dtype), *shape)], axis=axis)


def _windows(x, ws, st, out, reduce):
    """``reduce`` over every window, rows first then columns (max and sum separate):
    wh + ww slices, not wh * ww."""
    (wh, ww), (sh, sw), (oh, ow) = ws, st, out
    x = reduce(pt.stack([x[..., i: i + sh * (oh - 1) + 1: sh, :] for i in range(wh)]),
               axis=0)
    return reduce(pt.stack([x[..., j: j + sw * (ow - 1) + 1: sw] for j in range(ww)]),
                  axis=0)


def pool_2d(input, ws: Sequence[int] | None = None, ignore_border: bool | None = None,
            stride: Sequence[int] | None = None, pad=(0, 0), mode: str = "max",
            ds=None, st=None, padding=None):
    """Theano's ``tensor.signal.pool.pool_2d`` over the last two axes.

    Args:
        ws: window (height, width); ``ds`` is its old name.
        ignore_border: True drops a partial window at the bottom/right; False (and None,
            as in Theano 1.0) keeps it.
        stride: (None: ``ws``); ``st`` is its old name.
        pad: zeros (for ``max``: never chosen) added on each side; needs ignore_border.
        mode: "max", "sum", "average_inc_pad" (the padding counts in the mean) or
            "average_exc_pad" (only the input's own entries count).

    Example:
        y = pool_2d(conv, ws=(2, 2), ignore_border=True)
    """
    ws = ws if ws is not None else ds
    if ws is None:
        raise ValueError("pool_2d: give the window, ws=(height, width)")
    stride = stride if stride is not None else (st if st is not None else ws)
    pad = padding if padding is not None else pad
    if mode not in POOL_MODES:
        raise ValueError(f"pool_2d: mode={mode!r}; give one of {', '.join(POOL_MODES)}")
    ignore_border = bool(ignore_border)
    ws, stride, pad = _pair(ws, "ws"), _pair(stride, "stride"), _pair(pad, "pad")
    if (pad[0] or pad[1]) and not ignore_border:
        raise ValueError(f"pool_2d: pad={pad} needs ignore_border=True (as in Theano)")
    x = pt.as_tensor_variable(input)
    fill = -pt.inf if mode == "max" else 0.0
    if pad[0] or pad[1]:
        widths = [(0, 0)] * (x.ndim - 2) + [(pad[0], pad[0]), (pad[1], pad[1])]
        x = pt.pad(x, widths, constant_values=fill)
    rows, cols = x.shape[-2], x.shape[-1]
    out = tuple(_pooled_size(r, w, s, ignore_border)
                for r, w, s in zip((rows, cols), ws, stride))
    if not ignore_border:  # the partial windows read `fill` beyond the border
        x = _extend(x, x.ndim - 2, pt.maximum(0, (out[0] - 1) * stride[0] + ws[0] - rows),
                    fill)
        x = _extend(x, x.ndim - 1, pt.maximum(0, (out[1] - 1) * stride[1] + ws[1] - cols),
                    fill)
    if mode in ("max", "sum") and ignore_border and ws == stride and not (pad[0] or pad[1]):
        # non-overlapping windows: one reshape and one reduction
        (wh, ww), (oh, ow) = ws, out
        lead = [x.shape[k] for k in range(x.ndim - 2)]
        x = x[..., : oh * wh, : ow * ww].reshape((*lead, oh, wh, ow, ww))
        return (pt.max if mode == "max" else pt.sum)(x, axis=(-3, -1))
    if mode == "max":
        return _windows(x, ws, stride, out, pt.max)
    total = _windows(x, ws, stride, out, pt.sum)
    if mode == "sum":
        return total
    # how many entries each window covers: of the padded input (inc) or of the input (exc)
    ones = pt.ones_like(input)
    if mode == "average_inc_pad" and (pad[0] or pad[1]):
        ones = pt.pad(ones, [(0, 0)] * (x.ndim - 2) + [(pad[0], pad[0]), (pad[1], pad[1])],
                      constant_values=1.0)
    elif pad[0] or pad[1]:
        ones = pt.pad(ones, [(0, 0)] * (x.ndim - 2) + [(pad[0], pad[0]), (pad[1], pad[1])])
    if not ignore_border:
        ones = _extend(ones, x.ndim - 2, pt.maximum(0, x.shape[-2] - ones.shape[-2]), 0.0)
        ones = _extend(ones, x.ndim - 1, pt.maximum(0, x.shape[-1] - ones.shape[-1]), 0.0)
    return total / _windows(ones, ws, stride, out, pt.sum)


def max_pool_2d(input, ds, ignore_border=None, st=None, padding=(0, 0), mode="max"):
    """Theano's old ``tensor.signal.downsample.max_pool_2d`` (``pool_2d`` by its old names)."""
    return pool_2d(input, ws=ds, ignore_border=ignore_border, stride=st, pad=padding,
                   mode=mode)


def softmax(x):
    """Theano's ``nnet.softmax``: over the last axis of a matrix."""
    return _softmax(x, axis=-1)


def relu(x, alpha=0):
    """Theano's ``nnet.relu``: max(x, 0), or a leaky slope ``alpha`` below 0."""
    if alpha == 0:
        return pt.maximum(x, 0)
    return pt.switch(x > 0, x, alpha * x)


def categorical_crossentropy(coding_dist, true_dist):
    """Theano's ``nnet.categorical_crossentropy``: -log p[label] per row for integer labels,
    -sum(t * log p) per row for one-hot (or soft) targets."""
    p = pt.as_tensor_variable(coding_dist)
    t = pt.as_tensor_variable(true_dist)
    if t.ndim == p.ndim - 1 and t.dtype.startswith(("int", "uint")):
        return -pt.log(p[pt.arange(t.shape[0]), t])
    return -pt.sum(t * pt.log(p), axis=-1)


def binary_crossentropy(output, target):
    """Theano's ``nnet.binary_crossentropy``, elementwise."""
    return -(target * pt.log(output) + (1.0 - target) * pt.log(1.0 - output))


def elu(x, alpha=1.0):
    """Theano's ``nnet.elu``."""
    return pt.switch(x > 0, x, alpha * pt.expm1(x))


NNET = {"softmax": softmax, "relu": relu, "sigmoid": pt.sigmoid, "softplus": pt.softplus,
        "ultra_fast_sigmoid": pt.sigmoid,
        "hard_sigmoid": lambda x: pt.clip(0.2 * x + 0.5, 0.0, 1.0),
        "categorical_crossentropy": categorical_crossentropy,
        "binary_crossentropy": binary_crossentropy, "elu": elu, "conv2d": conv2d,
        "logsoftmax": pytensor.tensor.special.log_softmax}
