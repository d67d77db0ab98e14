"""oneDNN's inference primitives over its own blocked layouts (``distnn.nn.inference``
chains them): a convolution with its bias and post-ops (a residual sum into the output
already holding the shortcut, then ReLU), max pooling, and reorders between layouts.

A ``Value`` is an activation in the layout the primitive that wrote it chose (for example
nChw16c), in an array of the library's size for that layout; the layouts stay blocked from
one primitive to the next, and a reorder runs only where the next primitive wants another
layout, or at the edges (``from_plain`` / ``to_plain``: distnn's NCHW arrays). Primitives
are built for one batch size and thread count (their blocking depends on both), under
that thread count; inference-only (``forward_inference``), float32.
"""
from __future__ import annotations

import ctypes

import numpy as np

from . import _onednn as D
from .geometry import ConvGeometry

_FORWARD_INFERENCE = 96
_ELTWISE_RELU = 0x20
_POOLING_MAX = 0x1FF
_POOLING_AVG = 0x2FF  # include padding (the average pools here have none)
_DT_UNDEF = 0
_p = ctypes.c_void_p
_bound = [False]


def _bind() -> None:
    if _bound[0]:
        return
    lib, i64p, f = D._state["lib"], ctypes.POINTER(ctypes.c_int64), ctypes.c_float
    sigs = {
        "dnnl_primitive_attr_create": [ctypes.POINTER(_p)],
        "dnnl_primitive_attr_destroy": [_p],
        "dnnl_primitive_attr_set_post_ops": [_p, _p],
        "dnnl_post_ops_create": [ctypes.POINTER(_p)],
        "dnnl_post_ops_destroy": [_p],
        "dnnl_post_ops_append_sum": [_p, f, ctypes.c_int32, ctypes.c_int],
        "dnnl_post_ops_append_eltwise": [_p, ctypes.c_int, f, f],
        "dnnl_pooling_forward_primitive_desc_create": [
            ctypes.POINTER(_p), _p, ctypes.c_int, ctypes.c_int, _p, _p, i64p, i64p, i64p,
            i64p, i64p, _p],
    }
    for name, args in sigs.items():
        fn = getattr(lib, name)
        fn.argtypes = args
        fn.restype = ctypes.c_int
    _bound[0] = True


def available() -> str | None:
    """None where these primitives can run here (oneDNN loads and builds float32
    convolutions on this CPU), else one line saying why not."""
    reason = D.unavailable_reason()
    if reason is not None:
        return reason
    if not D.dtype_supported(np.float32):
        return "oneDNN builds no float32 convolution on this CPU"
    try:
        _bind()
    except AttributeError as exc:
        return f"the oneDNN library lacks an inference entry point ({exc})"
    return None


class Value:
    """An activation: its memory descriptor (the layout), its NCHW dims and its array."""

    __slots__ = ("md", "dims", "data")

    def __init__(self, md: _p, dims: tuple, data: np.ndarray):
        self.md, self.dims, self.data = md, dims, data


def _equal(a: _p, b: _p) -> bool:
    return bool(D._state["lib"].dnnl_memory_desc_equal(a, b))


def _size(md: _p) -> int:
    return int(D._state["lib"].dnnl_memory_desc_get_size(md))


def _memory(md: _p) -> _p:
    mem = _p()
    D._check(D._state["lib"].dnnl_memory_create(ctypes.byref(mem), md, D._state["engine"],
                                                None), "memory_create")
    return mem


class _Reorder:
    """A reorder from one layout to another (both memories re-pointed at each run)."""

    def __init__(self, src: _p, dst: _p):
        lib, engine = D._state["lib"], D._state["engine"]
        pd = _p()
        D._check(lib.dnnl_reorder_primitive_desc_create(ctypes.byref(pd), src, engine, dst,
                                                        engine, None), "reorder")
        self.prim = D._primitive(pd)
        lib.dnnl_primitive_desc_destroy(pd)
        self.src, self.dst = _memory(src), _memory(dst)

    def __call__(self, src: np.ndarray, dst: np.ndarray) -> None:
        lib = D._state["lib"]
        lib.dnnl_memory_set_data_handle(self.src, src.ctypes.data)
        lib.dnnl_memory_set_data_handle(self.dst, dst.ctypes.data)
        D._run(self.prim, ((D._SRC, self.src), (D._DST, self.dst)))


class Pool:
    """Work arrays by size, handed out and taken back (the same program asks for the same
    sizes every call, so after the first no new array is allocated)."""

    def __init__(self):
        self.free: dict[int, list[np.ndarray]] = {}

    def take(self, nbytes: int) -> np.ndarray:
        spare = self.free.get(nbytes)
        return spare.pop() if spare else D._aligned(nbytes, np.float32)

    def give(self, arr: np.ndarray) -> None:
        self.free.setdefault(arr.nbytes, []).append(arr)


def plain_md(dims: tuple) -> _p:
    return D._md(dims, D._F32, D._ABCD if len(dims) == 4 else D._A + len(dims) - 1)


class Input:
    """An NCHW batch into the layout ``want`` (a view of the array where that is NCHW)."""

    def __init__(self, dims: tuple, want: _p):
        self.dims, self.md = dims, want
        plain = plain_md(dims)
        self.reorder = None if _equal(plain, want) else _Reorder(plain, want)

    def __call__(self, x: np.ndarray, pool: Pool) -> tuple[Value, bool]:
        """(the value, whether its array is the pool's)."""
        if self.reorder is None:
            return Value(self.md, self.dims, x.reshape(-1)), False
        out = pool.take(_size(self.md))
        self.reorder(x, out)
        return Value(self.md, self.dims, out), True


class Output:
    """A value into a new NCHW array."""

    def __init__(self, md: _p, dims: tuple):
        self.dims = dims
        plain = plain_md(dims)
        self.reorder = None if _equal(plain, md) else _Reorder(md, plain)

    def __call__(self, v: Value) -> np.ndarray:
        if self.reorder is None:
            return v.data[:int(np.prod(self.dims))].reshape(self.dims).copy()
        y = np.empty(self.dims, np.float32)
        self.reorder(v.data, y)
        return y


class Convert:
    """A value from one layout into another (``None`` where they are equal)."""

    def __init__(self, src: _p, dst: _p):
        self.reorder = _Reorder(src, dst)
        self.md, self.size = dst, _size(dst)


def _attr(sum_: bool, relu: bool) -> _p:
    lib = D._state["lib"]
    attr, ops = _p(), _p()
    D._check(lib.dnnl_primitive_attr_create(ctypes.byref(attr)), "primitive_attr_create")
    D._check(lib.dnnl_post_ops_create(ctypes.byref(ops)), "post_ops_create")
    if sum_:
        D._check(lib.dnnl_post_ops_append_sum(ops, 1.0, 0, _DT_UNDEF), "post_ops_append_sum")
    if relu:
        D._check(lib.dnnl_post_ops_append_eltwise(ops, _ELTWISE_RELU, 0.0, 0.0),
                 "post_ops_append_eltwise")
    D._check(lib.dnnl_primitive_attr_set_post_ops(attr, ops), "primitive_attr_set_post_ops")
    lib.dnnl_post_ops_destroy(ops)
    return attr


class Conv:
    """relu?(conv2d(x, w) + b (+ the output's prior contents, where ``sum_``)) in the
    layouts the library picks for this shape (``src_md`` / ``dst_md``); weights reordered
    into its layout by ``set_weights`` (once per change of the weights)."""

    def __init__(self, g: ConvGeometry, f: int, relu: bool, sum_: bool):
        lib, engine = D._state["lib"], D._state["engine"]
        xs, ws, ys = (g.n, g.c, g.h, g.w), (f, g.c, g.kh, g.kw), (g.n, f, g.oh, g.ow)
        self.dims, self.sum = ys, sum_
        anyx, anyw, anyy = (D._md(s, D._F32, D._ANY) for s in (xs, ws, ys))
        bias = D._md((f,), D._F32, D._A)
        geo = (D._dims((g.sh, g.sw)), D._dims((g.dh - 1, g.dw - 1)), D._dims((g.pt, g.pl)),
               D._dims((g.pb, g.pr)))
        attr = _attr(sum_, relu)
        pd = _p()
        D._check(lib.dnnl_convolution_forward_primitive_desc_create(
            ctypes.byref(pd), engine, _FORWARD_INFERENCE, D._CONV_DIRECT, anyx, anyw, bias,
            anyy, *geo, attr), "convolution_forward_primitive_desc_create")
        lib.dnnl_primitive_attr_destroy(attr)
        q = lambda what: lib.dnnl_primitive_desc_query_md(pd, what, 0)  # noqa: E731
        self.src_md, self.dst_md, w_md = q(D._Q_SRC), q(D._Q_DST), q(D._Q_WEIGHTS)
        self.prim = D._primitive(pd)
        self.pd = pd  # owns the queried descriptors
        self.mems = {k: _memory(md) for k, md in (("x", self.src_md), ("w", w_md),
                                                    ("b", bias), ("y", self.dst_md))}
        self.w_plain = None if _equal(w_md, D._md(ws, D._F32, D._ABCD)) else _Reorder(
            D._md(ws, D._F32, D._ABCD), w_md)
        self.w = D._aligned(_size(w_md), np.float32)
        self.b = np.zeros(f, np.float32)
        self.size = _size(self.dst_md)

    def set_weights(self, w: np.ndarray, b: np.ndarray) -> None:
        w = np.ascontiguousarray(w, np.float32)
        if self.w_plain is None:
            self.w[:w.size] = w.reshape(-1)
        else:
            self.w_plain(w, self.w)
        self.b[...] = b

    def __call__(self, x: Value, out: np.ndarray) -> Value:
        """Runs into ``out`` (which holds the sum's other term where ``sum_``)."""
        lib, m = D._state["lib"], self.mems
        for key, arr in (("x", x.data), ("w", self.w), ("b", self.b), ("y", out)):
            lib.dnnl_memory_set_data_handle(m[key], arr.ctypes.data)
        D._run(self.prim, ((D._SRC, m["x"]), (D._WEIGHTS, m["w"]), (D._BIAS, m["b"]),
                           (D._DST, m["y"])))
        return Value(self.dst_md, self.dims, out)


class MaxPool:
    """Max pooling (or, with ``average``, average pooling without padding) in the layout
    the library picks for its input (``src_md``)."""

    def __init__(self, src_md: _p, dims: tuple, out_hw: tuple, kernel: tuple, strides: tuple,
                 pads: tuple, average: bool = False):
        lib, engine = D._state["lib"], D._state["engine"]
        n, c = dims[:2]
        self.dims = (n, c, *out_hw)
        anyy = D._md(self.dims, D._F32, D._ANY)
        pd = _p()
        D._check(lib.dnnl_pooling_forward_primitive_desc_create(
            ctypes.byref(pd), engine, _FORWARD_INFERENCE, _POOLING_AVG if average else _POOLING_MAX,
            src_md, anyy,
            D._dims(strides), D._dims(kernel), D._dims((0, 0)), D._dims(pads[::2]),
            D._dims(pads[1::2]), None), "pooling_forward_primitive_desc_create")
        q = lambda what: lib.dnnl_primitive_desc_query_md(pd, what, 0)  # noqa: E731
        self.src_md, self.dst_md = q(D._Q_SRC), q(D._Q_DST)
        self.pd, self.prim = pd, D._primitive(pd)
        self.mems = (_memory(self.src_md), _memory(self.dst_md))
        self.size = _size(self.dst_md)

    def __call__(self, x: Value, out: np.ndarray) -> Value:
        lib = D._state["lib"]
        lib.dnnl_memory_set_data_handle(self.mems[0], x.data.ctypes.data)
        lib.dnnl_memory_set_data_handle(self.mems[1], out.ctypes.data)
        D._run(self.prim, ((D._SRC, self.mems[0]), (D._DST, self.mems[1])))
        return Value(self.dst_md, self.dims, out)


def equal(a: _p, b: _p) -> bool:
    """Whether two layouts are the same."""
    return _equal(a, b)


def threads(n: int):
    """A context under which oneDNN's OpenMP regions (building and running) take ``n``
    threads."""
    return D._threads(n)
