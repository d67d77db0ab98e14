"""The registry of kernel methods (kernels/registry.py) and the planner that chooses among
them (kernels/measure.py): eligibility and the fixed plan as data for both CPU kinds, every
registered method against the float64 reference at 1 and 2 threads (a method is covered by
registering it), a method registered in this file considered by the measuring planner,
and the plan cache (a second run plans without timing, a plan file reproduces it)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from distnn import kernels
from distnn.kernels import conv as C
from distnn.kernels import conv_numpy, measure, planner, registry
from distnn.kernels.im2col import conv_geometry

AVX512, AVX2 = planner.CPU("avx512"), planner.CPU("avx2")


def geo(n, c, h, k=3, stride=1, pad=1, dil=1):
    return conv_geometry((n, c, h, h), (k, k), (stride, stride), (pad,) * 4, (dil, dil))


# (layer, geometry, filters) -> the fixed plan's method on AVX-512 | AVX2, float32, 1
# thread, and the compiled methods eligible on each kind (the registry's order)
PLANS = [
    ("resnet20 16->16 32x32", geo(64, 16, 32), 16, "vector", "winograd4",
     ["vector", "winograd2", "winograd4", "direct", "im2col"],
     ["winograd2", "winograd4", "direct", "im2col"]),
    ("resnet20 16->32 s2", geo(64, 16, 32, stride=2), 32, "vector", "im2col",
     ["vector", "im2col"], ["im2col"]),
    ("resnet20 16->32 1x1 s2", geo(64, 16, 32, k=1, stride=2, pad=0), 32, "pointwise",
     "pointwise", ["pointwise", "im2col"], ["pointwise", "im2col"]),
    ("resnet20 64->64 8x8", geo(64, 64, 8), 64, "winograd4", "winograd4",
     ["vector", "winograd2", "winograd4", "direct", "im2col"],
     ["winograd2", "winograd4", "direct", "im2col"]),
    ("vgg11bn 512->512 2x2", geo(64, 512, 2), 512, "winograd2", "winograd2",
     ["vector", "winograd2", "winograd4", "direct", "im2col"],
     ["winograd2", "winograd4", "direct", "im2col"]),
    ("lenet 1->6 5x5", geo(64, 1, 28, k=5, pad=2), 6, "direct", "direct",
     ["direct", "im2col"], ["direct", "im2col"]),
    ("6->16 5x5 14x14", geo(64, 6, 14, k=5, pad=0), 16, "im2col", "im2col",
     ["direct", "im2col"], ["direct", "im2col"]),
]


ONEDNN = registry.method("conv2d", "onednn")


@pytest.mark.parametrize("name,g,f,on512,on2,elig512,elig2", PLANS, ids=[p[0] for p in PLANS])
def test_fixed_plan_and_eligibility_for_both_cpu_kinds(name, g, f, on512, on2, elig512, elig2):
    # oneDNN's convolutions take every float32 layer where the library is here
    extra = ["onednn"] if ONEDNN.reason() is None else []
    for cpu, want, elig in ((AVX512, on512, elig512 + extra), (AVX2, on2, elig2 + extra)):
        q = registry.Query(g, f, np.float32, cpu)
        assert registry.fixed("conv2d", q) == want, cpu
        got = registry.eligible("conv2d", q)
        assert [n for n in got if registry.method("conv2d", n).compiled] == elig, cpu
        assert want in elig and "compact" in got  # the reference is always a candidate
        assert ("flat" in got) == ((g.sh, g.sw) == (1, 1))
        # the NumPy backend plans among the reference's layouts only
        numpy_q = registry.Query(g, f, np.float32, cpu, compiled=False)
        assert set(registry.eligible("conv2d", numpy_q)) <= {"flat", "compact"}
        assert registry.fixed("conv2d", numpy_q) == conv_numpy.layout(g, f)


def test_vector_kernels_are_avx512_float32_only():
    g = geo(64, 16, 32)
    assert "vector" not in registry.eligible("conv2d", registry.Query(g, 16, np.float64, AVX512))
    assert "vector" not in registry.eligible("conv2d", registry.Query(g, 12, np.float32, AVX512))
    off = planner.Limits(register_tiles=False)
    assert "vector" not in registry.eligible("conv2d", registry.Query(g, 16, np.float32, AVX512,
                                                                      limits=off))


def test_the_fixed_plan_is_the_planners_thresholds():
    """The registry's fixed plan names plan_conv's choice for every case of test_plan."""
    from test_plan import CASES, _expect
    for _, g, f, dtype, *wants in CASES:
        for cpu, want in zip((AVX512, AVX2, planner.CPU("generic")), wants):
            plan = _expect(want)
            name = f"winograd{plan.tile}" if plan.method == "winograd" else plan.method
            assert registry.fixed("conv2d", registry.Query(g, f, dtype, cpu)) == name


def _host_query(g, f, dtype, groups=1):
    return registry.Query(g, f, np.dtype(dtype), planner.target(), kernels.get_num_threads(),
                          kernels.backend() == "numba", groups)


def _reference(x, w, b, g, dy):
    """float64 forward and gradients of the NumPy reference's compact layout."""
    y, cache = conv_numpy.forward(x, w, b, g, None, False)
    dx, dw, db = conv_numpy.backward(dy, cache, w, None, None, True, True)
    return y, dx, dw, db


GEOMETRIES = [("3x3 same", (3, 16, 9, 9), (16, 16, 3, 3), (1, 1), (1,) * 4, (1, 1)),
              ("3x3 s2", (2, 16, 10, 10), (16, 16, 3, 3), (2, 2), (1,) * 4, (1, 1)),
              ("1x1 s2", (2, 8, 8, 8), (16, 8, 1, 1), (2, 2), (0,) * 4, (1, 1)),
              ("5x5 dilated", (2, 3, 12, 12), (8, 3, 5, 5), (1, 1), (2, 1, 2, 1), (2, 2)),
              ("3x3 8x8 64", (2, 64, 8, 8), (64, 64, 3, 3), (1, 1), (1,) * 4, (1, 1))]


@pytest.mark.parametrize("method", list(registry.METHODS["conv2d"]))
@pytest.mark.parametrize("case", GEOMETRIES, ids=[c[0] for c in GEOMETRIES])
def test_every_registered_method_matches_the_float64_reference(method, case, threads):
    """Each conv2d method where it supports the layer on this host (both dtypes it takes),
    forward and backward, against the reference in float64; the same bits at 1 and 2
    threads are the threads tests' (test_threads.py)."""
    _, xs, ws_, stride, pads, dil = case
    rng = np.random.default_rng(5)
    g = conv_geometry(xs, ws_[2:], stride, pads, dil)
    x64, w64 = rng.standard_normal(xs), rng.standard_normal(ws_)
    b64 = rng.standard_normal(ws_[0])
    dy64 = rng.standard_normal((g.n, ws_[0], g.oh, g.ow))
    ref = _reference(x64, w64, b64, g, dy64)
    ran = 0
    m = registry.method("conv2d", method)
    if m.reason() is not None:
        pytest.skip(f"{method}: {m.reason()}")
    for dtype, tol in ((np.float64, 1e-9), (np.float32, 2e-3)):
        q = _host_query(g, ws_[0], dtype)
        if not m.supports(q) or (m.compiled and not q.compiled):
            continue
        x, w, b, dy = (a.astype(dtype) for a in (x64, w64, b64, dy64))
        y, cache = m.run(x, w, b, g, m.prepare(q))
        dx, dw, db = C.conv2d_backward(dy, cache, w)
        for got, want, what in zip((y, dx, dw, db), ref, ("y", "dx", "dw", "db")):
            scale = max(1.0, float(np.abs(want).max()))
            np.testing.assert_allclose(got, want, atol=tol * scale, rtol=0,
                                       err_msg=f"{method} {dtype.__name__} {what}")
        ran += 1
    if not ran:
        pytest.skip(f"{method} does not support {case[0]} on this host and backend")


@pytest.fixture
def plans(tmp_path, monkeypatch):
    """The measuring planner with its cache in tmp_path, this process's choices dropped
    before and after."""
    path = tmp_path / "kernel-plans.json"
    monkeypatch.setenv("DISTNN_KERNEL_PLANS", str(path))
    measure.forget()
    measure.set_mode("measure")
    yield path
    measure.set_mode("fixed")
    measure.forget()


def _toy(calls: list, wrong: bool = False):
    """A method defined here: the reference's compact layout, counted (and off by one in
    y when ``wrong``)."""
    reference = registry.method("conv2d", "compact").run

    def run(x, w, b, g, ws, keep_columns=None):
        calls.append(g)
        y, cache = reference(x, w, b, g, ws, keep_columns)
        return (y + 1 if wrong else y), cache
    return registry.Method("conv2d", "toy", lambda q: q.filters == 5, run, compiled=False)


def _layer(rng, dtype=np.float32):
    x = rng.standard_normal((2, 3, 8, 8)).astype(dtype)
    w = rng.standard_normal((5, 3, 3, 3)).astype(dtype)
    return x, w, rng.standard_normal(5).astype(dtype)


def test_a_method_registered_here_is_measured_and_cached(plans):
    calls = []
    registry.register(_toy(calls))
    try:
        x, w, b = _layer(np.random.default_rng(0))
        y, cache = C.conv2d_forward(x, w, b, (1, 1), (1,) * 4)
        (entry,) = measure.RECORDS.values()
        assert "toy" in entry["seconds"] and calls  # considered: run and timed
        assert entry["method"] == min(entry["seconds"], key=entry["seconds"].get)
        assert entry["fixed"] == registry.fixed("conv2d", C.query(cache.geometry, 5, x.dtype))
        stored = json.loads(plans.read_text())
        assert list(stored.values())[0]["method"] == entry["method"]
        # a second run (this process's choices dropped): the file decides, nothing is timed
        measure.forget()
        del calls[:]
        before = dict(stored)
        y2, _ = C.conv2d_forward(x, w, b, (1, 1), (1,) * 4)
        assert json.loads(plans.read_text()) == before
        assert len(calls) <= (1 if entry["method"] == "toy" else 0)  # only a run, if chosen
        np.testing.assert_allclose(y2, y, rtol=1e-4, atol=1e-4)
    finally:
        registry.unregister("conv2d", "toy")


def test_a_method_off_the_reference_is_never_chosen(plans):
    calls = []
    registry.register(_toy(calls, wrong=True))
    try:
        x, w, b = _layer(np.random.default_rng(1))
        C.conv2d_forward(x, w, b, (1, 1), (1,) * 4)
        (entry,) = measure.RECORDS.values()
        assert calls and "toy" not in entry["seconds"] and entry["method"] != "toy"
    finally:
        registry.unregister("conv2d", "toy")


def test_a_plan_file_reproduces_the_choice(plans, tmp_path):
    x, w, b = _layer(np.random.default_rng(2))
    C.conv2d_forward(x, w, b, (1, 1), (1,) * 4)
    (k, entry), = measure.RECORDS.items()
    others = [n for n in registry.eligible("conv2d", C.query(
        conv_geometry(x.shape, (3, 3), (1, 1), (1,) * 4), 5, x.dtype)) if n != entry["method"]]
    planned = tmp_path / "plan.json"
    planned.write_text(json.dumps({k: {"method": others[0]}}))
    measure.forget()
    measure.set_mode(f"plan:{planned}")
    got = C.conv2d_forward(x, w, b, (1, 1), (1,) * 4)[1]
    name = registry.backward_name(got)
    assert name == ("reference" if others[0] in ("flat", "compact") else others[0])


def test_bad_modes_and_plan_files_are_named(tmp_path):
    with pytest.raises(ValueError, match="--kernels must be fixed, measure or plan:FILE, "
                                         "got 'fast'"):
        measure.set_mode("fast")
    with pytest.raises(ValueError, match="--kernels plan:.*cannot read the plan file"):
        measure.set_mode(f"plan:{tmp_path / 'missing.json'}")
    assert measure.mode() in ("fixed", "measure") or measure.mode().startswith("plan:")
    measure.set_mode("fixed")


def test_fixed_runs_the_planners_method(kernel_backend):
    """The default mode: conv2d_forward runs registry.fixed's method (no timing)."""
    measure.set_mode("fixed")
    x, w, b = _layer(np.random.default_rng(3))
    measure.forget()
    cache = C.conv2d_forward(x, w, b, (1, 1), (1,) * 4)[1]
    want = registry.fixed("conv2d", C.query(cache.geometry, 5, x.dtype))
    assert registry.backward_name(cache) == ("reference" if want in ("flat", "compact")
                                             else want)
    assert not measure.RECORDS


def test_the_kernels_option_checks_its_value(tmp_path):
    """``--kernels`` (ParallelConfig.kernels): its kind names the three forms; a plan file
    that cannot be read ends the run with a RunError naming --kernels."""
    from distnn.run.errors import RunError
    from distnn.run.execution import ParallelConfig
    from distnn.run.kinds import KernelPlan
    from distnn.run.threads import apply_kernel_plan
    assert ParallelConfig().kernels == "fixed"
    assert KernelPlan().check("Measure") == "measure"
    assert KernelPlan().check("plan:p.json") == "plan:p.json"
    with pytest.raises(ValueError, match="must be fixed, measure or plan:FILE"):
        KernelPlan().check("fast")
    with pytest.raises(RunError, match="--kernels plan:.*cannot read the plan file"):
        apply_kernel_plan(f"plan:{tmp_path / 'none.json'}")
    assert apply_kernel_plan("fixed") == "fixed"


# -- oneDNN's methods ---------------------------------------------------------------------
def _need_onednn(kernel_backend):
    if kernel_backend == "numpy":
        pytest.skip("oneDNN's methods are compiled ones: the NumPy backend plans without them")
    if ONEDNN.reason() is not None:
        pytest.skip(f"onednn: {ONEDNN.reason()}")


ONEDNN_CASES = GEOMETRIES + [
    ("resnet20 16->32 s2", (4, 16, 16, 16), (32, 16, 3, 3), (2, 2), (1,) * 4, (1, 1)),
    ("7x7 s2 asymmetric", (2, 3, 15, 15), (8, 3, 7, 7), (2, 2), (3, 2, 3, 2), (1, 1)),
    ("no bias", (2, 16, 8, 8), (16, 16, 3, 3), (1, 1), (1,) * 4, (1, 1))]


@pytest.mark.parametrize("case", ONEDNN_CASES, ids=[c[0] for c in ONEDNN_CASES])
def test_onednn_forward_and_both_backwards_match_the_float64_reference(case, threads,
                                                                       kernel_backend):
    """Through the public conv2d entry points (a plan file naming "onednn"): y, dx, dw and
    db within 1e-5 of the float64 reference (relative to max |value|) in float32, at 1 and 2
    threads; float64, which oneDNN 3.2 has no CPU convolution for, is never eligible."""
    _need_onednn(kernel_backend)
    name, xs, ws_, stride, pads, dil = case
    rng = np.random.default_rng(11)
    g = conv_geometry(xs, ws_[2:], stride, pads, dil)
    x64, w64 = rng.standard_normal(xs), rng.standard_normal(ws_)
    b64 = None if name == "no bias" else rng.standard_normal(ws_[0])
    dy64 = rng.standard_normal((g.n, ws_[0], g.oh, g.ow))
    y0, c0 = conv_numpy.forward(x64, w64, b64, g, None, False)
    dx0, dw0, db0 = conv_numpy.backward(dy64, c0, w64, None, None, True, True)
    x, w, dy = (a.astype(np.float32) for a in (x64, w64, dy64))
    b = None if b64 is None else b64.astype(np.float32)
    y, cache = C.conv2d_forward(x, w, b, stride, pads, dil, method="onednn")
    assert registry.backward_name(cache) == "onednn"
    dw_out = np.full(w.shape, np.nan, np.float32)  # overwritten, not accumulated
    dx, dw, db = C.conv2d_backward(dy, cache, w, dw_out=dw_out, need_db=True)
    assert dw is dw_out
    for got, want, what in zip((y, dx, dw, db), (y0, dx0, dw0, db0), ("y", "dx", "dw", "db")):
        assert got.dtype == np.float32 and got.shape == want.shape, what
        scale = float(np.abs(want).max())
        assert float(np.abs(got - want).max()) <= 1e-5 * scale, what
    # dx not asked for: none computed, the weight gradient the same
    none, dw2, _ = C.conv2d_backward(dy, C.conv2d_forward(x, w, b, stride, pads, dil,
                                                          method="onednn")[1], w,
                                     need_dx=False, need_db=False)
    assert none is None
    np.testing.assert_allclose(dw2, dw, rtol=1e-6, atol=1e-6 * float(np.abs(dw).max()))
    from distnn.kernels import _onednn
    q64 = _host_query(g, ws_[0], np.float64)
    assert ("onednn" in registry.eligible("conv2d", q64)) == _onednn.dtype_supported(
        np.float64)


def test_onednn_is_measured_but_never_the_fixed_plan(plans, kernel_backend, monkeypatch):
    """The fixed plan never names it; the measuring planner times it on the layer (within
    a budget that lets every method's first, compiling, run finish on a busy host)."""
    _need_onednn(kernel_backend)
    monkeypatch.setattr(measure.time_methods, "__defaults__", (600.0,))
    for _, g, f, *_ in PLANS:
        for cpu in (AVX512, AVX2):
            assert registry.fixed("conv2d", registry.Query(g, f, np.float32, cpu)) != "onednn"
    rng = np.random.default_rng(4)
    x = rng.standard_normal((4, 16, 8, 8)).astype(np.float32)
    w = rng.standard_normal((16, 16, 3, 3)).astype(np.float32)
    C.conv2d_forward(x, w, None, (1, 1), (1,) * 4)
    (entry,) = measure.RECORDS.values()
    assert "onednn" in entry["seconds"] and entry["seconds"]["onednn"] > 0


def _missing_onednn(monkeypatch):
    """oneDNN's library as if it were not installed (for this test)."""
    from distnn.kernels import _onednn
    _onednn.unavailable_reason()
    monkeypatch.setitem(_onednn._state, "reason", "no oneDNN library (a test)")


def test_onednns_backward_in_the_fixed_plan_as_data(monkeypatch):
    """The fixed plan sends the backward of resnet20's 32->32 16x16 layer to oneDNN on
    AVX-512 at 1 thread where the library is here, never on AVX2 nor at 2 threads, and
    without the library keeps the plan it had (the forward's own backward)."""
    g, here = geo(64, 32, 16), ONEDNN.reason() is None
    assert registry.onednn_backward(registry.Query(g, 32, np.float32, AVX512)) is here
    for q in (registry.Query(g, 32, np.float32, AVX2),
              registry.Query(g, 32, np.float32, AVX512, threads=2),
              registry.Query(g, 32, np.float32, AVX512, compiled=False),
              registry.Query(geo(64, 16, 32), 16, np.float32, AVX512)):
        assert not registry.onednn_backward(q)
    _missing_onednn(monkeypatch)
    assert not registry.onednn_backward(registry.Query(g, 32, np.float32, AVX512))


@pytest.mark.parametrize("missing", [False, True], ids=["library", "no library"])
def test_onednns_backward_of_the_compiled_forwards_matches_the_reference(
        missing, threads, kernel_backend, monkeypatch):
    """Through the public entry points under the fixed plan, resnet20-like 32->32,
    32->64 stride-2 and 64->64 layers: where the planner sends their backward to oneDNN
    (this host's kind at 1 thread, the library here) the cache says so, the forward is the
    compiled path's, and y, dx, dw, db are within 2e-6 of the float64 reference; with the
    library missing the forward's own backward runs, to the same tolerance."""
    if kernel_backend == "numpy":
        pytest.skip("the NumPy backend's reference layouts have their own backward")
    if missing:
        _missing_onednn(monkeypatch)
    measure.set_mode("fixed")
    rng = np.random.default_rng(5)
    for xs, f, stride, pads in (((3, 32, 16, 16), 32, (1, 1), (1,) * 4),
                                ((3, 32, 16, 16), 64, (2, 2), (0, 1, 0, 1)),
                                ((3, 64, 8, 8), 64, (1, 1), (1,) * 4)):
        g = conv_geometry(xs, (3, 3), stride, pads)
        x64, w64 = rng.standard_normal(xs), rng.standard_normal((f, xs[1], 3, 3)) * 0.1
        b64 = rng.standard_normal(f)
        dy64 = rng.standard_normal((g.n, f, g.oh, g.ow))
        refs = _reference(x64, w64, b64, g, dy64)
        x, w, b, dy = (a.astype(np.float32) for a in (x64, w64, b64, dy64))
        y, cache = C.conv2d_forward(x, w, b, stride, pads)
        q = C.query(g, f, np.float32)
        want = (not missing and threads == 1 and planner.target().kind == "avx512"
                and registry.onednn_backward(q))
        assert cache.onednn_backward is want and cache.method in ("vector", "winograd")
        assert registry.backward_name(cache) == ("onednn" if want else
                                                 registry.fixed("conv2d_backward",
                                                                registry.BackwardQuery(
                                                                    g, f, np.float32, q.cpu,
                                                                    cache=cache._replace(
                                                                        onednn_backward=False
                                                                    ))))
        got = (y,) + C.conv2d_backward(dy, cache, w)
        for r, ref, what in zip(got, refs, ("y", "dx", "dw", "db")):
            assert r.dtype == np.float32, what
            scale = float(np.abs(ref).max())
            assert float(np.abs(r - ref).max()) <= 2e-6 * scale * (5 if what == "y" else 1), what


def _info(backend: str, **env):
    import subprocess

    from helpers import COMMAND, child_env
    return subprocess.run([*COMMAND, "info", "--kernels", "fixed", "--model", "lenet",
                           "--batch_size", "4"], capture_output=True, text=True, timeout=300,
                          env=child_env(DISTNN_KERNELS=backend, **env))


def test_info_kernels_names_onednn_when_its_library_is_missing(tmp_path, kernel_backend):
    """``distnn info --kernels`` with DISTNN_ONEDNN_LIB naming no library: one last line
    says oneDNN's methods are unavailable and why, the table is still there; on the NumPy
    backend (no compiled method is a candidate) no such line."""
    missing = tmp_path / "libdnnl.so.3"
    proc = _info(kernel_backend, DISTNN_ONEDNN_LIB=str(missing))
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if "unavailable" in ln]
    assert proc.stdout.count("conv2d ") >= 2  # lenet's two convolutions
    if kernel_backend == "numpy":
        assert not lines, proc.stdout
        return
    (line,) = lines
    assert line == proc.stdout.strip().splitlines()[-1]
    assert line.startswith("kernel methods unavailable here: onednn (conv2d, conv2d_backward): "
                           f"the oneDNN library {missing} does not load"), line
    if ONEDNN.reason() is None:  # and with the library found, no line
        proc = _info(kernel_backend)
        assert proc.returncode == 0 and "unavailable" not in proc.stdout, proc.stdout


def test_a_measured_run_names_onednn_when_its_library_is_missing(tmp_path, kernel_backend):
    """``distnn train --kernels measure`` with DISTNN_ONEDNN_LIB naming no library: rank 0
    prints the one line (the NumPy backend: none) and the run trains on to its end."""
    import subprocess

    from helpers import COMMAND, child_env
    missing = tmp_path / "libdnnl.so.3"
    proc = subprocess.run(
        [*COMMAND, "train", "--dataset", "synthetic", "--input_shape", "1,8,8",
         "--num_samples", "64", "--batch_size", "16", "--num_epochs", "1", "--model",
         "simplecnn", "--kernels", "measure", "--history_file", str(tmp_path / "h.json")],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
        env=child_env(DISTNN_KERNELS=kernel_backend, DISTNN_ONEDNN_LIB=str(missing),
                      DISTNN_KERNEL_PLANS=str(tmp_path / "plans.json")))
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if "unavailable here" in ln]
    assert (tmp_path / "h.json").exists()
    if kernel_backend == "numpy":
        assert not lines, proc.stdout
    else:
        assert len(lines) == 1 and f"onednn (conv2d, conv2d_backward): the oneDNN library " \
            f"{missing} does not load" in lines[0], proc.stdout


def test_info_kernels_names_onednns_backward(kernel_backend):
    """The table of ``distnn info --kernels`` marks the layers whose backward runs on
    oneDNN's primitives (``vector+onednn``) where the planner sends it there (this host's
    kind at 1 thread, the library here), and no layer otherwise."""
    from distnn.cli.kernel_info import kernel_report
    previous = kernels.get_num_threads()
    kernels.set_num_threads(1)
    try:
        table = kernel_report("resnet20", "fixed", batch=4)
    finally:
        kernels.set_num_threads(previous)
    want = (kernel_backend == "numba" and planner.target().kind == "avx512"
            and ONEDNN.reason() is None)
    rows = [ln for ln in table.splitlines() if "+onednn" in ln]
    assert bool(rows) is want, table
    if want:  # resnet20's 32->32 16x16, 32->64 stride-2 and 64->64 8x8 layers
        assert len(rows) == 3 and all(" k3x3 " in r for r in rows), table
