"""Intel oneDNN's convolutions as kernel methods (``registry``'s "onednn"), bound through
ctypes to the C API of the library the ``onednn-cpu-gomp`` wheel installs (oneDNN 3.2,
OpenMP on the system's libgomp; ``pip install 'distnn[onednn]'``): nothing is compiled at
install time, and without the library the methods are unavailable (``unavailable_reason``).

One CPU engine and one in-order stream per process. Each layer shape gets primitives built
once (``_conv``: a cache per shape, strides, paddings, dilations, dtype, bias and threads):
convolution forward (training), backward data and backward weights (with bias), their
memory formats left to the library (``format_tag any``, blocked layouts such as
nChw16c), with reorders from and to distnn's NCHW / OIHW arrays where the library chose
another layout. The forward keeps its reordered input for the weight gradient (in the
cache's ``col``). Threads: oneDNN's OpenMP regions take ``omp_get_max_threads()`` of the
calling thread, set here through libgomp's ``omp_set_num_threads`` around each call (and
restored after); the primitives are built under the same count (their blocking depends on
it).

The library is found at ``DISTNN_ONEDNN_LIB`` (a path), else as ``libdnnl.so.3`` in the
environment's ``lib`` folder (where the wheel puts it) or the loader's path.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import sys
from pathlib import Path
from typing import Iterator

import numpy as np

from .geometry import ConvCache, ConvGeometry

# oneDNN's C API constants (dnnl_types.h, stable across 3.x)
_CPU = 1
_F32, _F64 = 3, 7
_ANY, _A, _ABCD = 1, 2, 5
_FORWARD_TRAINING = 64
_CONV_DIRECT = 1
_Q_SRC, _Q_DIFF_SRC, _Q_WEIGHTS, _Q_DIFF_WEIGHTS, _Q_DST, _Q_DIFF_DST = range(129, 135)
_Q_BIAS_MD = 255  # dnnl_query_exec_arg_md, index = the argument
_SRC, _DST, _WEIGHTS, _BIAS = 1, 17, 33, 41
_DIFF_SRC, _DIFF_DST, _DIFF_WEIGHTS, _DIFF_BIAS = 129, 145, 161, 169
_DTYPES = {np.dtype(np.float32): _F32, np.dtype(np.float64): _F64}

_Dims = ctypes.c_int64 * 12
_p = ctypes.c_void_p


class _Arg(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_int), ("memory", _p)]


_state: dict = {"lib": None, "gomp": None, "reason": None, "tried": False, "engine": None,
                "stream": None, "dtypes": {}}
_PRIMS: dict[tuple, "_Conv"] = {}


def library_path() -> str | None:
    """The oneDNN library to load: ``DISTNN_ONEDNN_LIB``, else the wheel's file in this
    environment's lib folder, else None (the loader's path is tried by name)."""
    named = os.environ.get("DISTNN_ONEDNN_LIB", "").strip()
    if named:
        return named
    for base in dict.fromkeys((sys.prefix, sys.base_prefix)):
        for name in ("libdnnl.so.3", "libdnnl.so"):
            path = Path(base) / "lib" / name
            if path.exists():
                return str(path)
    return None


def _load() -> None:
    if _state["tried"]:
        return
    _state["tried"] = True
    path = library_path()
    try:
        lib = ctypes.CDLL(path or "libdnnl.so.3")
    except OSError as exc:
        if path is None:
            _state["reason"] = ("no oneDNN library (pip install 'distnn[onednn]', or name "
                                "libdnnl.so in DISTNN_ONEDNN_LIB)")
        else:
            _state["reason"] = f"the oneDNN library {path} does not load ({exc})"
        return
    try:
        gomp = ctypes.CDLL("libgomp.so.1")  # the one libdnnl loaded (same soname)
        gomp.omp_get_max_threads.restype = ctypes.c_int
        gomp.omp_set_num_threads.argtypes = [ctypes.c_int]
    except (OSError, AttributeError) as exc:
        _state["reason"] = f"libgomp (GNU OpenMP), which oneDNN runs on, is missing ({exc})"
        return
    try:
        _prototypes(lib)
        engine, stream = _p(), _p()
        _check(lib.dnnl_engine_create(ctypes.byref(engine), _CPU, 0), "engine_create")
        _check(lib.dnnl_stream_create(ctypes.byref(stream), engine, 1), "stream_create")
    except (AttributeError, RuntimeError) as exc:
        _state["reason"] = f"the oneDNN library {path or 'libdnnl.so.3'} is unusable ({exc})"
        return
    _state.update(lib=lib, gomp=gomp, engine=engine, stream=stream)


def unavailable_reason() -> str | None:
    """None where oneDNN's methods can run here, else one line saying why not."""
    _load()
    return _state["reason"]


def _prototypes(lib) -> None:
    i64p = ctypes.POINTER(ctypes.c_int64)
    sigs = {
        "dnnl_engine_create": [ctypes.POINTER(_p), ctypes.c_int, ctypes.c_size_t],
        "dnnl_stream_create": [ctypes.POINTER(_p), _p, ctypes.c_uint],
        "dnnl_stream_wait": [_p],
        "dnnl_memory_desc_create_with_tag": [ctypes.POINTER(_p), ctypes.c_int, i64p,
                                             ctypes.c_int, ctypes.c_int],
        "dnnl_memory_desc_equal": [_p, _p],
        "dnnl_memory_desc_get_size": [_p],
        "dnnl_memory_create": [ctypes.POINTER(_p), _p, _p, _p],
        "dnnl_memory_set_data_handle": [_p, _p],
        "dnnl_primitive_desc_query_md": [_p, ctypes.c_int, ctypes.c_int],
        "dnnl_primitive_desc_destroy": [_p],
        "dnnl_primitive_create": [ctypes.POINTER(_p), _p],
        "dnnl_primitive_execute": [_p, _p, ctypes.c_int, ctypes.POINTER(_Arg)],
        "dnnl_reorder_primitive_desc_create": [ctypes.POINTER(_p), _p, _p, _p, _p, _p],
        "dnnl_convolution_forward_primitive_desc_create": [
            ctypes.POINTER(_p), _p, ctypes.c_int, ctypes.c_int, _p, _p, _p, _p,
            i64p, i64p, i64p, i64p, _p],
        "dnnl_convolution_backward_data_primitive_desc_create": [
            ctypes.POINTER(_p), _p, ctypes.c_int, _p, _p, _p, i64p, i64p, i64p, i64p, _p, _p],
        "dnnl_convolution_backward_weights_primitive_desc_create": [
            ctypes.POINTER(_p), _p, ctypes.c_int, _p, _p, _p, _p, i64p, i64p, i64p, i64p,
            _p, _p],
    }
    for name, args in sigs.items():
        fn = getattr(lib, name)
        fn.argtypes = args
        fn.restype = ctypes.c_int
    lib.dnnl_memory_desc_get_size.restype = ctypes.c_size_t
    lib.dnnl_primitive_desc_query_md.restype = _p


def _check(status: int, what: str) -> None:
    if status != 0:
        raise RuntimeError(f"oneDNN dnnl_{what} failed (status {status})")


@contextlib.contextmanager
def _threads(n: int) -> Iterator[None]:
    gomp = _state["gomp"]
    before = gomp.omp_get_max_threads()
    if before != n:
        gomp.omp_set_num_threads(n)
    try:
        yield
    finally:
        if before != n:
            gomp.omp_set_num_threads(before)


def _dims(values) -> _Dims:
    return _Dims(*(int(v) for v in values))


def _md(dims, dtype: int, tag: int) -> _p:
    md = _p()
    _check(_state["lib"].dnnl_memory_desc_create_with_tag(
        ctypes.byref(md), len(dims), _dims(dims), dtype, tag), "memory_desc_create_with_tag")
    return md


def _aligned(nbytes: int, dtype) -> np.ndarray:
    """A flat array of at least ``nbytes`` starting on a 64-byte boundary."""
    item = np.dtype(dtype).itemsize
    raw = np.empty(nbytes // item + 64 // item + 1, dtype)
    skip = (-raw.ctypes.data % 64) // item
    return raw[skip:skip + -(-nbytes // item)]


class _Mem:
    """One argument of a primitive: the layout the primitive wants, the user's plain one,
    and the reorder between them where they differ."""

    def __init__(self, want: _p, plain: _p, into_user: bool):
        lib, engine = _state["lib"], _state["engine"]
        self.plain = bool(lib.dnnl_memory_desc_equal(want, plain))
        self.size = lib.dnnl_memory_desc_get_size(want)
        self.mem, self.user = _p(), _p()
        _check(lib.dnnl_memory_create(ctypes.byref(self.mem), want, engine, None),
               "memory_create")
        self.reorder = None
        if not self.plain:
            _check(lib.dnnl_memory_create(ctypes.byref(self.user), plain, engine, None),
                   "memory_create")
            src, dst = (want, plain) if into_user else (plain, want)
            pd, prim = _p(), _p()
            _check(lib.dnnl_reorder_primitive_desc_create(ctypes.byref(pd), src, engine, dst,
                                                          engine, None), "reorder")
            _check(lib.dnnl_primitive_create(ctypes.byref(prim), pd), "primitive_create")
            lib.dnnl_primitive_desc_destroy(pd)
            self.reorder, self.into_user = prim, into_user
        self.work = None

    def buffer(self, dtype) -> np.ndarray:
        """The shared work array of the library's layout (reused call after call)."""
        if self.work is None:
            self.work = _aligned(self.size, dtype)
        return self.work

    def bind_in(self, arr: np.ndarray, keep: np.ndarray | None = None) -> np.ndarray:
        """Point the argument at ``arr`` (plain), reordering it first where the primitive
        wants another layout (into ``keep`` if given, else the shared work array)."""
        lib = _state["lib"]
        if self.plain:
            lib.dnnl_memory_set_data_handle(self.mem, arr.ctypes.data)
            return arr
        work = keep if keep is not None else self.buffer(arr.dtype)
        lib.dnnl_memory_set_data_handle(self.user, arr.ctypes.data)
        lib.dnnl_memory_set_data_handle(self.mem, work.ctypes.data)
        _run(self.reorder, ((_SRC, self.user), (_DST, self.mem)))
        return work

    def bind_blocked(self, work: np.ndarray) -> None:
        """Point the argument at an array already in the primitive's layout."""
        _state["lib"].dnnl_memory_set_data_handle(self.mem, work.ctypes.data)

    def bind_out(self, arr: np.ndarray) -> None:
        lib = _state["lib"]
        if self.plain:
            lib.dnnl_memory_set_data_handle(self.mem, arr.ctypes.data)
        else:
            lib.dnnl_memory_set_data_handle(self.user, arr.ctypes.data)
            lib.dnnl_memory_set_data_handle(self.mem, self.buffer(arr.dtype).ctypes.data)

    def finish_out(self) -> None:
        if not self.plain:
            _run(self.reorder, ((_SRC, self.mem), (_DST, self.user)))


def _run(prim: _p, args) -> None:
    arr = (_Arg * len(args))(*(_Arg(a, m) for a, m in args))
    _check(_state["lib"].dnnl_primitive_execute(prim, _state["stream"], len(args), arr),
           "primitive_execute")


def _primitive(pd: _p) -> _p:
    prim = _p()
    _check(_state["lib"].dnnl_primitive_create(ctypes.byref(prim), pd), "primitive_create")
    return prim


class _Conv:
    """The primitives of one convolution shape (forward; both backwards when asked)."""

    def __init__(self, g: ConvGeometry, f: int, dtype, bias: bool):
        lib, engine = _state["lib"], _state["engine"]
        dt = _DTYPES[np.dtype(dtype)]
        self.g, self.f, self.dtype, self.bias = g, f, np.dtype(dtype), bias
        xs, ws, ys = (g.n, g.c, g.h, g.w), (f, g.c, g.kh, g.kw), (g.n, f, g.oh, g.ow)
        self.plain = {"x": _md(xs, dt, _ABCD), "w": _md(ws, dt, _ABCD),
                      "y": _md(ys, dt, _ABCD), "b": _md((f,), dt, _A)}
        anyx, anyw, anyy = _md(xs, dt, _ANY), _md(ws, dt, _ANY), _md(ys, dt, _ANY)
        self.geo = (_dims((g.sh, g.sw)), _dims((g.dh - 1, g.dw - 1)), _dims((g.pt, g.pl)),
                    _dims((g.pb, g.pr)))
        self.fwd_pd = _p()
        _check(lib.dnnl_convolution_forward_primitive_desc_create(
            ctypes.byref(self.fwd_pd), engine, _FORWARD_TRAINING, _CONV_DIRECT, anyx, anyw,
            self.plain["b"] if bias else None, anyy, *self.geo, None),
            "convolution_forward_primitive_desc_create")
        q = lambda what: lib.dnnl_primitive_desc_query_md(self.fwd_pd, what, 0)  # noqa: E731
        self.fwd = _primitive(self.fwd_pd)
        self.src = _Mem(q(_Q_SRC), self.plain["x"], False)
        self.weights = _Mem(q(_Q_WEIGHTS), self.plain["w"], False)
        self.dst = _Mem(q(_Q_DST), self.plain["y"], True)
        self.fwd_src_md = q(_Q_SRC)
        self.any = (anyx, anyw, anyy)
        self.back: dict[bool, tuple] = {}

    def forward(self, x: np.ndarray, w: np.ndarray, b: np.ndarray | None):
        g = self.g
        y = np.empty((g.n, self.f, g.oh, g.ow), self.dtype)
        keep = None if self.src.plain else _aligned(self.src.size, self.dtype)
        xs = self.src.bind_in(x, keep)
        self.weights.bind_in(w)
        self.dst.bind_out(y)
        args = [(_SRC, self.src.mem), (_WEIGHTS, self.weights.mem), (_DST, self.dst.mem)]
        if self.bias:
            bm = self._bias_mem()
            _state["lib"].dnnl_memory_set_data_handle(bm, b.ctypes.data)
            args.append((_BIAS, bm))
        _run(self.fwd, args)
        self.dst.finish_out()
        return y, (None if self.src.plain else xs)

    def _bias_mem(self) -> _p:
        if not hasattr(self, "_bm"):
            self._bm = _p()
            _check(_state["lib"].dnnl_memory_create(ctypes.byref(self._bm), self.plain["b"],
                                                    _state["engine"], None), "memory_create")
        return self._bm

    def _backward(self, need_db: bool) -> tuple:
        if need_db in self.back:
            return self.back[need_db]
        lib, engine = _state["lib"], _state["engine"]
        anyx, anyw, anyy = self.any
        dpd, wpd = _p(), _p()
        _check(lib.dnnl_convolution_backward_data_primitive_desc_create(
            ctypes.byref(dpd), engine, _CONV_DIRECT, anyx, anyw, anyy, *self.geo,
            self.fwd_pd, None), "convolution_backward_data_primitive_desc_create")
        _check(lib.dnnl_convolution_backward_weights_primitive_desc_create(
            ctypes.byref(wpd), engine, _CONV_DIRECT, anyx, anyw,
            self.plain["b"] if need_db else None, anyy, *self.geo, self.fwd_pd, None),
            "convolution_backward_weights_primitive_desc_create")
        qd = lambda what: lib.dnnl_primitive_desc_query_md(dpd, what, 0)  # noqa: E731
        qw = lambda what: lib.dnnl_primitive_desc_query_md(wpd, what, 0)  # noqa: E731
        data = dict(prim=_primitive(dpd), dy=_Mem(qd(_Q_DIFF_DST), self.plain["y"], False),
                    w=_Mem(qd(_Q_WEIGHTS), self.plain["w"], False),
                    dx=_Mem(qd(_Q_DIFF_SRC), self.plain["x"], True))
        src_md = qw(_Q_SRC)
        weights = dict(prim=_primitive(wpd), x=_Mem(src_md, self.plain["x"], False),
                       dy=_Mem(qw(_Q_DIFF_DST), self.plain["y"], False),
                       dw=_Mem(qw(_Q_DIFF_WEIGHTS), self.plain["w"], True),
                       same_src=bool(lib.dnnl_memory_desc_equal(src_md, self.fwd_src_md)),
                       same_dy=bool(lib.dnnl_memory_desc_equal(qw(_Q_DIFF_DST),
                                                               qd(_Q_DIFF_DST))))
        if need_db:
            weights["db"] = _Mem(lib.dnnl_primitive_desc_query_md(wpd, _Q_BIAS_MD,
                                                                  _DIFF_BIAS),
                                 self.plain["b"], True)
        self.back[need_db] = (data, weights)
        return self.back[need_db]

    def backward(self, dy, x, kept, w, dw, db, need_dx: bool, need_db: bool):
        data, weights = self._backward(need_db)
        dyb = None
        dx = None
        if need_dx:
            dx = np.empty((self.g.n, self.g.c, self.g.h, self.g.w), self.dtype)
            dyb = data["dy"].bind_in(dy)
            data["w"].bind_in(w)
            data["dx"].bind_out(dx)
            _run(data["prim"], [(_DIFF_DST, data["dy"].mem), (_WEIGHTS, data["w"].mem),
                                (_DIFF_SRC, data["dx"].mem)])
            data["dx"].finish_out()
        if kept is not None and weights["same_src"]:
            weights["x"].bind_blocked(kept)
        else:
            weights["x"].bind_in(x)
        if dyb is not None and weights["same_dy"] and not data["dy"].plain:
            weights["dy"].bind_blocked(dyb)
        else:
            weights["dy"].bind_in(dy)
        weights["dw"].bind_out(dw)
        args = [(_SRC, weights["x"].mem), (_DIFF_DST, weights["dy"].mem),
                (_DIFF_WEIGHTS, weights["dw"].mem)]
        if need_db:
            weights["db"].bind_out(db)
            args.append((_DIFF_BIAS, weights["db"].mem))
        _run(weights["prim"], args)
        weights["dw"].finish_out()
        if need_db:
            weights["db"].finish_out()
        return dx


def dtype_supported(dtype) -> bool:
    """Whether this library builds convolutions of ``dtype`` on this CPU (probed once on a
    small layer)."""
    dt = np.dtype(dtype)
    if dt not in _DTYPES or unavailable_reason() is not None:
        return False
    known = _state["dtypes"].get(dt)
    if known is None:
        try:
            with _threads(1):
                _Conv(ConvGeometry(1, 8, 4, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 4, 4), 8, dt,
                      True)
            known = True
        except RuntimeError:
            known = False
        _state["dtypes"][dt] = known
    return known


def _key(g: ConvGeometry, f: int, dtype, bias: bool, threads: int) -> tuple:
    return (tuple(g), f, np.dtype(dtype).name, bias, threads)


def _conv(key: tuple) -> _Conv:
    """The primitives of ``key`` (built at its first use, under its threads)."""
    found = _PRIMS.get(key)
    if found is None:
        g, f, dtype, bias, _ = key
        found = _PRIMS[key] = _Conv(ConvGeometry(*g), f, dtype, bias)
    return found


def forward(x, w, b, g: ConvGeometry, threads: int):
    """y = conv2d(x, w) + b (NCHW, OIHW) and its ``ConvCache`` ("onednn": ``x`` the
    input, ``col`` the input in the primitive's layout, or None where that is NCHW,
    ``chunks`` the key of the primitives that ran)."""
    x = np.ascontiguousarray(x)
    w = np.ascontiguousarray(w, dtype=x.dtype)
    if b is not None:
        b = np.ascontiguousarray(b, dtype=x.dtype)
    key = _key(g, w.shape[0], x.dtype, b is not None, threads)
    with _threads(threads):
        y, kept = _conv(key).forward(x, w, b)
    return y, ConvCache(g, "onednn", x, kept, chunks=key)


def backward(dy, cache: ConvCache, w, dw_out, db_out, need_dx: bool, need_db: bool,
             threads: int):
    """(dx or None, dw, db or None) of ``forward``'s cache, or of another forward's whose
    ``x`` is the NCHW input (the register-tiled and Winograd caches the planner flags
    ``onednn_backward``), dw and db written into ``dw_out`` / ``db_out`` (new arrays where
    None or not contiguous)."""
    g, x = cache.geometry, cache.x
    dy = np.ascontiguousarray(dy, dtype=x.dtype)
    w = np.ascontiguousarray(w, dtype=x.dtype)
    f = w.shape[0]
    dw = dw_out if (dw_out is not None and dw_out.flags.c_contiguous
                    and dw_out.dtype == x.dtype) else np.empty(w.shape, x.dtype)
    db = None
    if need_db:
        db = db_out if (db_out is not None and db_out.flags.c_contiguous
                        and db_out.dtype == x.dtype) else np.empty(f, x.dtype)
    own = cache.method == "onednn"  # else another forward's cache (``onednn_backward``)
    key = cache.chunks if own else None
    if key is None or key[4] != threads:
        key = _key(g, f, x.dtype, True, threads)
    with _threads(threads):
        conv = _conv(key)
        kept = cache.col if own and key == cache.chunks else None
        dx = conv.backward(dy, x, kept, w, dw, db, need_dx, need_db)
    if dw_out is not None and dw is not dw_out:
        dw_out[...] = dw
        dw = dw_out
    if need_db and db_out is not None and db is not db_out:
        db_out[...] = db
        db = db_out
    return dx, dw, db
