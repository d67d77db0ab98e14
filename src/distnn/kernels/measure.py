"""The planner's choice among a family's eligible methods (``registry``): fixed, measured,
or read from a plan file.

Modes (``set_mode``, env ``DISTNN_KERNEL_PLAN``, ``distnn train --kernels``):

* "fixed" (the default): the planner's thresholds (``registry.FIXED``, handed in by the
  caller with the eligible methods: this module knows no method); the same choice on
  every run and every rank, so N-rank runs equal 1-rank runs bit for bit.
* "measure": at a layer's first use, each eligible method runs on the layer's real
  arrays and thread count (forward and backward, once to compile and warm, then timed),
  within ``BUDGET_S`` seconds a layer; the fastest whose output is within ``TOLERANCE``
  of the float64 reference is kept. Choices are cached per CPU model, thread count,
  dtype and shape in ``plan_path()`` (XDG cache: ``~/.cache/distnn/kernel-plans.json``),
  so a second run plans without timing. Each rank measures for itself: ranks may choose
  differently (results equal to rounding, not bit for bit).
* "plan:FILE": the choices of a plan file (the cache's format; a shape it lacks gets the
  fixed plan's choice), reproducible on another machine.
"""
from __future__ import annotations

import contextlib
import functools
import json
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator

import numpy as np


BUDGET_S = 2.0
TOLERANCE = {np.dtype(np.float32): 1e-3, np.dtype(np.float64): 1e-9}
_state: dict = {"mode": None, "plans": None, "path": None, "record": False}
# key -> {"method": name, "seconds": {name: s}, "flops": n, "family": f, "shape": text}
RECORDS: dict[str, dict] = {}


def set_mode(spec: str | None) -> str:
    """"fixed", "measure" or "plan:FILE" (None: ``DISTNN_KERNEL_PLAN``, else fixed);
    returns the mode in effect. A plan file is read here (an error names it)."""
    if spec is None:
        spec = os.environ.get("DISTNN_KERNEL_PLAN", "").strip() or "fixed"
    if spec not in ("fixed", "measure") and not spec.startswith("plan:"):
        raise ValueError(f"--kernels must be fixed, measure or plan:FILE, got {spec!r}")
    _state["plans"] = None
    if spec.startswith("plan:"):
        path = Path(spec[5:]).expanduser()
        try:
            _state["plans"] = _load(path, strict=True)
        except (OSError, ValueError) as exc:
            raise ValueError(f"--kernels {spec}: cannot read the plan file ({exc}); "
                             "write one with --kernels measure (it lands in "
                             f"{plan_path()})") from None
    _state["mode"] = spec
    return spec


def mode() -> str:
    if _state["mode"] is None:
        set_mode(None)
    return _state["mode"]


def plan_path() -> Path:
    """Where measured choices are kept: ``DISTNN_KERNEL_PLANS``, else the XDG cache."""
    named = os.environ.get("DISTNN_KERNEL_PLANS")
    if named:
        return Path(named).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "distnn" / "kernel-plans.json"


@functools.lru_cache(maxsize=None)
def cpu_model() -> str:
    """The CPU model's name (/proc/cpuinfo's, else the platform's)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def key(family: str, q) -> str:
    """The cache's key of a choice of ``q`` (a ``registry.Query``): CPU model and kind,
    threads, backend, dtype, shape."""
    g = q.geometry
    shape = (f"{g.n}x{g.c}x{g.h}x{g.w}>{q.filters} k{g.kh}x{g.kw} s{g.sh}x{g.sw} "
             f"p{g.pt},{g.pb},{g.pl},{g.pr} d{g.dh}x{g.dw} g{q.groups}")
    backend = "numba" if q.compiled else "numpy"
    return (f"{cpu_model()}|{q.cpu.kind}|t{q.threads}|{backend}|{np.dtype(q.dtype).name}|"
            f"{family}|{shape}")


def _load(path: Path, strict: bool = False) -> dict:
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except FileNotFoundError:
        if strict:
            raise
        return {}
    except (OSError, ValueError):
        if strict:
            raise
        return {}  # a damaged cache is measured again
    if not isinstance(data, dict):
        if strict:
            raise ValueError("not a JSON object of choices")
        return {}
    return data


def _save(path: Path, entries: dict) -> None:
    """Merge ``entries`` into the cache file, written atomically (a temporary file in the
    same folder, then renamed over it): concurrent ranks never see half a file."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        merged = _load(path)
        merged.update(entries)
        fd, tmp = tempfile.mkstemp(prefix=".kernel-plans.", dir=path.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(merged, fh, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only home: the choice holds for this process only


@contextlib.contextmanager
def recording() -> Iterator[dict]:
    """Inside the block, the chosen method of a fixed or plan-file choice is timed too
    (``distnn info --kernels``), so every layer has a measured rate in ``RECORDS``."""
    saved = _state["record"]
    _state["record"] = True
    try:
        yield RECORDS
    finally:
        _state["record"] = saved


def time_methods(names: list[str], trial: Callable[[str], float | None],
                 budget_s: float = BUDGET_S) -> dict[str, float]:
    """{name: seconds} of each method's ``trial`` (which runs it once warm-up, times it,
    checks it; None when its result is off the reference); methods past the budget
    (counted from the first trial) are left untimed."""
    start, out = time.perf_counter(), {}
    for i, name in enumerate(names):
        if i and time.perf_counter() - start > budget_s:
            break
        seconds = trial(name)
        if seconds is not None:
            out[name] = seconds
    return out


def choose(family: str, q, fixed: str, eligible: Callable[[], list[str]],
           trial: Callable[[str], float | None], flops: float = 0.0) -> str:
    """The method of ``family`` for ``q`` under the mode in effect (see the module):
    ``fixed`` is the fixed plan's (``registry.fixed``), ``eligible()`` the methods that
    may run (``registry.eligible``, asked only when the mode needs them)."""
    current = mode()
    k = key(family, q)
    if current == "fixed" and not _state["record"]:
        return fixed
    known = RECORDS.get(k)
    if known is not None and known["method"] in (fixed, *eligible()):
        return known["method"]
    if current.startswith("plan:"):
        named = (_state["plans"] or {}).get(k, {}).get("method")
        chosen = named if named in eligible() else fixed
    else:
        chosen = fixed
    if current == "measure":
        stored = _cached().get(k)
        if stored and stored.get("method") in eligible():
            RECORDS[k] = stored
            return stored["method"]
        seconds = time_methods(_ordered(eligible(), fixed), trial)
        if seconds:
            chosen = min(seconds, key=seconds.__getitem__)
    elif _state["record"]:  # a fixed or planned choice: time that one only
        seconds = {chosen: s} if (s := trial(chosen)) is not None else {}
    else:
        seconds = {}
    entry = {"method": chosen, "fixed": fixed, "seconds": seconds, "flops": flops,
             "family": family, "shape": k.rsplit("|", 1)[1]}
    RECORDS[k] = entry
    if current == "measure":
        _cached()[k] = entry
        _save(plan_path(), {k: entry})
    return chosen


def note_backward(family: str, q, name: str) -> None:
    """Inside ``recording``, that the backward of the choice for ``q`` is ``name`` (a
    method other than the forward's own: ``distnn info --kernels`` shows it)."""
    if _state["record"] and (entry := RECORDS.get(key(family, q))) is not None:
        entry["backward"] = name


def _ordered(names: list[str], first: str) -> list[str]:
    """The fixed plan's method first (always timed within the budget), then the others."""
    return ([first] if first in names else []) + [n for n in names if n != first]


def _cached() -> dict:
    path = plan_path()
    if _state["plans"] is None or _state["path"] != path:
        _state["plans"], _state["path"] = _load(path), path
    return _state["plans"]


def forget() -> None:
    """Drop this process's choices (tests; the cache file stays)."""
    RECORDS.clear()
    _state["plans"] = None if not mode().startswith("plan:") else _state["plans"]
    _state["path"] = None
