"""The one registry of kernel methods: every way distnn computes an op family, registered here.

A ``Method`` is one small interface: ``supports(query)`` (whether it can compute this
geometry, dtype, CPU kind and thread count: the CPU-kind and shape rules of ``planner``
are its eligibility), ``prepare(query)`` (its per-layer state: the work arrays a layer
keeps between calls) and ``run(...)`` (and ``backward`` where the family has one). Which
eligible method runs is the planner's question (``measure.choose``): the "fixed" plan is
``FIXED[family](query)`` (the thresholds of ``planner``, as measured when they were set),
"measure" times the eligible ones on the layer's real shape. Adding a method is one
``register(Method(...))`` call here (or in a test) plus its tests: the property tests of
tests/kernels/test_registry.py cover every registered method of a family.

Families: "conv2d" (forward; its caches name the backward that reads them),
"conv2d_backward" (dx, dw and db of one cache; the methods compute data and weight
gradients in one pass over dy, so they are one family), "conv2d_grouped" (groups > 1:
depthwise and grouped). Implementations are imported when a method runs, so importing the
registry imports no compiled code. Methods bound to a library that may be absent (oneDNN's
"onednn", the ``onednn`` extra) say why they cannot run (``Method.missing``,
``unavailable``) and are then never eligible; the fixed plan never names them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from . import planner
from .geometry import ConvCache, ConvGeometry


@dataclass(frozen=True)
class Query:
    """What a method is asked to compute, and where.

    Args:
        geometry: the layer's ``ConvGeometry``.
        filters: output channels.
        dtype: the arrays' dtype.
        cpu: the CPU kind the compiled code is built for (``planner.CPU``).
        threads: the compiled loops' threads.
        compiled: whether the compiled backend is in effect (compiled methods need it
            when the planner chooses).
        groups: the convolution's groups.
        limits: ``planner.Limits`` (None: ``planner.LIMITS`` when asked).

    Example:
        >>> q = Query(conv_geometry((64, 16, 32, 32), (3, 3), (1, 1), (1,) * 4), 16,
        ...           np.float32, planner.CPU("avx2"))
    """
    geometry: ConvGeometry
    filters: int
    dtype: Any
    cpu: planner.CPU
    threads: int = 1
    compiled: bool = True
    groups: int = 1
    limits: planner.Limits | None = None

    @property
    def lim(self) -> planner.Limits:
        return planner.LIMITS if self.limits is None else self.limits

    @property
    def float32(self) -> bool:
        return np.dtype(self.dtype) == np.float32


def _no_state(query: Query) -> dict:
    return {}


@dataclass(frozen=True)
class Method:
    """One way to compute an op family.

    Args:
        family: the op family ("conv2d", "conv2d_backward", "conv2d_grouped").
        name: the method's name, unique in its family (a plan file names it).
        supports: query -> whether the method can compute it.
        run: the forward (per family: conv2d's ``run(x, w, b, g, ws, keep_columns)``
            returns (y, cache); conv2d_backward's ``run(dy, cache, w, dw_out, db_out,
            need_dx, need_db, ws)`` returns (dx, dw, db)).
        compiled: whether it runs compiled code (the NumPy backend's planner leaves those).
        prepare: query -> the per-layer state ``run`` is given (a dict of work arrays).
        missing: () -> None where the method can run in this process, else one line why
            not (a library that is not installed); such a method is never eligible
            (``unavailable`` lists them).
    """
    family: str
    name: str
    supports: Callable[[Query], bool]
    run: Callable
    compiled: bool = True
    prepare: Callable[[Query], dict] = field(default=_no_state)
    missing: Callable[[], str | None] | None = None

    def reason(self) -> str | None:
        """Why the method cannot run here (``missing``'s line), or None."""
        return None if self.missing is None else self.missing()


METHODS: dict[str, dict[str, Method]] = {}
FIXED: dict[str, Callable[[Query], str]] = {}


def register(method: Method) -> Method:
    """Add ``method`` to its family (replacing one of the same name)."""
    METHODS.setdefault(method.family, {})[method.name] = method
    return method


def unregister(family: str, name: str) -> None:
    METHODS.get(family, {}).pop(name, None)


def method(family: str, name: str) -> Method:
    """The registered method, or a ValueError naming the family's methods."""
    found = METHODS.get(family, {}).get(name)
    if found is None:
        raise ValueError(f"no kernel method {name!r} in family {family!r}; registered: "
                         f"{sorted(METHODS.get(family, {}))}")
    return found


def eligible(family: str, query: Query) -> list[str]:
    """The names of the family's methods that support ``query`` (compiled ones only on
    the compiled backend), in registration order."""
    return [m.name for m in METHODS.get(family, {}).values()
            if (query.compiled or not m.compiled) and m.reason() is None
            and m.supports(query)]


def unavailable(compiled: bool = True) -> dict[str, tuple[list[str], str]]:
    """The registered methods that cannot run here: {name: (families, why)} (compiled
    methods only on the compiled backend, ``compiled``)."""
    out: dict[str, tuple[list[str], str]] = {}
    for family, methods in METHODS.items():
        for m in methods.values():
            if (compiled or not m.compiled) and (why := m.reason()) is not None:
                out.setdefault(m.name, ([], why))[0].append(family)
    return out


def unavailable_line(compiled: bool = True) -> str | None:
    """``unavailable`` as the one line the command prints, or None when all can run."""
    gone = unavailable(compiled)
    if not gone:
        return None
    return "kernel methods unavailable here: " + "; ".join(
        f"{name} ({', '.join(families)}): {why}" for name, (families, why) in gone.items())


def fixed(family: str, query: Query) -> str:
    """The fixed plan's method: the planner's thresholds."""
    return FIXED[family](query)


# -- conv2d: forward ----------------------------------------------------------------------
def _vector_ok(q: Query) -> bool:
    """The register-tiled direct kernels exist for AVX-512 float32, filters and channels
    multiples of 8 (``planner.use_vector`` adds the measured size bounds)."""
    g = q.geometry
    return (planner.tiles_on(q.cpu, q.lim) and q.cpu.kind == "avx512" and q.float32
            and planner.vector_applies(g) and q.filters % 8 == 0 and g.c % 8 == 0)


def _winograd(tile: int):
    def run(x, w, b, g, ws, keep_columns=None):
        if not planner.winograd_applies(g):
            name = "winograd" if tile == 2 else "winograd4"
            raise ValueError(f"method={name!r} needs a 3x3 kernel, stride 1 and dilation 1, "
                             f"got {g.kh}x{g.kw}, stride {(g.sh, g.sw)}, dilation "
                             f"{(g.dh, g.dw)}; use method='compact' or leave method unset")
        from . import winograd
        x = np.ascontiguousarray(x)
        y = winograd.forward(x, w, b, g.pt, g.pb, g.pl, g.pr, tile=tile)
        return y, ConvCache(g, "winograd", x, tile=tile)
    return run


def _direct(vector: bool):
    def run(x, w, b, g, ws, keep_columns=None):
        if not (vector or planner.direct_applies(g)):
            raise ValueError(f"method='direct' needs stride 1, got stride {(g.sh, g.sw)}")
        from . import direct
        y, xp = direct.forward(x, w, b, g, ws, vector)
        return y, ConvCache(g, "vector" if vector else "direct", xp)
    return run


def _pointwise(x, w, b, g, ws, keep_columns=None):
    if not planner.pointwise_applies(g):
        raise ValueError(f"method='pointwise' needs a 1x1 kernel and no padding, got "
                         f"{g.kh}x{g.kw}, padding {(g.pt, g.pb, g.pl, g.pr)}")
    from . import direct
    y, xs = direct.pointwise_forward(x, w, b, g, ws)
    return y, ConvCache(g, "pointwise", xs)


def _im2col(x, w, b, g, ws, keep_columns=None):
    from . import _im2col_gemm
    return _im2col_gemm.forward(x, w, b, g, ws)


def _reference(flat: bool):
    def run(x, w, b, g, ws, keep_columns=None):
        from . import conv_numpy
        return conv_numpy.forward(x, w, b, g, ws, flat, keep_columns)
    return run


def _fixed_conv(q: Query) -> str:
    """The planner's choice (``planner.plan_conv``) on the compiled backend, the NumPy
    reference's layout otherwise."""
    if not q.compiled:
        from . import conv_numpy
        return conv_numpy.layout(q.geometry, q.filters)
    plan = planner.plan_conv(q.geometry, q.filters, q.dtype, threads=q.threads, cpu=q.cpu,
                             limits=q.limits)
    return f"winograd{plan.tile}" if plan.method == "winograd" else plan.method


register(Method("conv2d", "vector", _vector_ok, _direct(True)))
register(Method("conv2d", "winograd2", lambda q: planner.winograd_applies(q.geometry),
                _winograd(2)))
register(Method("conv2d", "winograd4", lambda q: planner.winograd_applies(q.geometry),
                _winograd(4)))
register(Method("conv2d", "direct", lambda q: planner.direct_applies(q.geometry),
                _direct(False)))
register(Method("conv2d", "pointwise", lambda q: planner.pointwise_applies(q.geometry),
                _pointwise))
register(Method("conv2d", "im2col", lambda q: True, _im2col))


def _onednn_missing() -> str | None:
    from . import _onednn
    return _onednn.unavailable_reason()


def _onednn_ok(q: Query) -> bool:
    """oneDNN's convolutions (``_onednn``): any ungrouped geometry, in the dtypes its
    CPU primitives take (float32; oneDNN 3.2 has no float64 convolution on CPUs)."""
    from . import _onednn
    return q.groups == 1 and _onednn.dtype_supported(q.dtype)


def _onednn_run(x, w, b, g, ws, keep_columns=None):
    # a compiled method: its primitives take the compiled loops' threads
    from . import _onednn
    from ._numba_runtime import get_num_threads
    return _onednn.forward(x, w, b, g, get_num_threads())


# never the fixed plan's: "measure" or a plan file chooses it
register(Method("conv2d", "onednn", _onednn_ok, _onednn_run, missing=_onednn_missing))
register(Method("conv2d", "flat", lambda q: (q.geometry.sh, q.geometry.sw) == (1, 1),
                _reference(True), compiled=False))
register(Method("conv2d", "compact", lambda q: True, _reference(False), compiled=False))
FIXED["conv2d"] = _fixed_conv

# the names ``conv2d_forward(method=...)`` has always taken, as registry names
ALIASES = {"winograd": "winograd2"}


# -- conv2d: backward ---------------------------------------------------------------------
def _cache_name(cache: ConvCache) -> str:
    return f"winograd{cache.tile}" if cache.method == "winograd" else cache.method


def _winograd_back(dy, cache, w, dw_out, db_out, need_dx, need_db, ws=None):
    from . import winograd
    g = cache.geometry
    return winograd.backward(dy, cache.x, w, g.pt, g.pl, dw_out, db_out if need_db else None,
                             need_dx, tile=cache.tile)


def _direct_back(vector: bool):
    def run(dy, cache, w, dw_out, db_out, need_dx, need_db, ws=None):
        from . import direct
        return direct.backward(dy, cache.x, w, cache.geometry, dw_out,
                               db_out if need_db else None, need_dx, ws, vector)
    return run


def _pointwise_back(dy, cache, w, dw_out, db_out, need_dx, need_db, ws=None):
    from . import direct
    return direct.pointwise_backward(dy, cache.x, w, cache.geometry, dw_out,
                                     db_out if need_db else None, need_dx)


def _im2col_back(dy, cache, w, dw_out, db_out, need_dx, need_db, ws=None):
    from . import _im2col_gemm
    return _im2col_gemm.backward(dy, cache, w, dw_out, db_out, need_dx, need_db)


def _reference_back(dy, cache, w, dw_out, db_out, need_dx, need_db, ws=None):
    from . import conv_numpy
    return conv_numpy.backward(dy, cache, w, dw_out, db_out, need_dx, need_db, ws)


@dataclass(frozen=True)
class BackwardQuery(Query):
    """A ``Query`` for the backward of a forward that left ``cache``."""
    cache: ConvCache | None = None


def _reads(*names: str):
    return lambda q: _cache_name(q.cache) in names


def _vector_back_ok(q: BackwardQuery) -> bool:
    """The register-tiled kernels read x itself: their own caches, and Winograd's on
    narrow planes of whole tiles (``planner.vector_cols``)."""
    return _cache_name(q.cache) == "vector" or (
        q.cache.method == "winograd" and _vector_ok(q) and planner.vector_cols(q.geometry, q.lim))


def _fixed_backward(q: BackwardQuery) -> str:
    """The forward's own backward, but the layers the planner sends to oneDNN's
    (``onednn_backward``) and Winograd's it sends to the register-tiled kernels
    (``planner.vector_backward``)."""
    if q.cache.onednn_backward:
        return "onednn"
    if q.cache.vector_backward:
        return "vector"
    name = _cache_name(q.cache)
    return "reference" if name in ("flat", "compact") else name


register(Method("conv2d_backward", "vector", _vector_back_ok, _direct_back(True)))
register(Method("conv2d_backward", "winograd2", _reads("winograd2"), _winograd_back))
register(Method("conv2d_backward", "winograd4", _reads("winograd4"), _winograd_back))
register(Method("conv2d_backward", "direct", _reads("direct"), _direct_back(False)))
register(Method("conv2d_backward", "pointwise", _reads("pointwise"), _pointwise_back))
register(Method("conv2d_backward", "im2col", _reads("im2col"), _im2col_back))
def _onednn_back(dy, cache, w, dw_out, db_out, need_dx, need_db, ws=None):
    from . import _onednn
    from ._numba_runtime import get_num_threads
    return _onednn.backward(dy, cache, w, dw_out, db_out, need_dx, need_db, get_num_threads())


def onednn_backward(q: Query) -> bool:
    """Whether the backward of a register-tiled or Winograd forward of ``q`` runs on
    oneDNN's primitives: where ``planner.onednn_backward`` says so and the library can run
    them (without it, the forward's own backward: the same plan as before it)."""
    return (q.compiled and planner.onednn_backward(q.geometry, q.filters, q.dtype, q.threads,
                                                   q.cpu, q.lim)
            and q.groups == 1 and _onednn_missing() is None and _onednn_ok(q))


def _onednn_back_ok(q: BackwardQuery) -> bool:
    """oneDNN's backward reads x itself: its own caches, and those its flag names."""
    return _cache_name(q.cache) == "onednn" or q.cache.onednn_backward


register(Method("conv2d_backward", "onednn", _onednn_back_ok, _onednn_back,
                missing=_onednn_missing))
register(Method("conv2d_backward", "reference", _reads("flat", "compact"), _reference_back,
                compiled=False))
FIXED["conv2d_backward"] = _fixed_backward


def backward_name(cache: ConvCache) -> str:
    """The backward method of a cache (the fixed plan's; the cache carries the choice)."""
    return _fixed_backward(BackwardQuery(cache.geometry, 0, None, planner.CPU("generic"),
                                         cache=cache))


# -- conv2d_grouped -----------------------------------------------------------------------
def _grouped(name: str):
    def run(x, w, b, g, ws, groups):
        from . import grouped
        return grouped.forward(x, w, b, g, groups, name)
    return run


def _fixed_grouped(q: Query) -> str:
    from .grouped import is_depthwise
    return "depthwise" if q.compiled and is_depthwise(q.geometry, q.groups) else "shifted"


register(Method("conv2d_grouped", "depthwise", lambda q: q.groups == q.geometry.c,
                _grouped("depthwise")))
register(Method("conv2d_grouped", "shifted", lambda q: True, _grouped("shifted"),
                compiled=False))
FIXED["conv2d_grouped"] = _fixed_grouped
