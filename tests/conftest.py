"""What every test folder shares.

- tests/ is on ``sys.path``: ``from helpers import ...`` gives the launcher (``MPIEXEC``,
  ``launcher``), the ``distnn`` command (``COMMAND``), a child's environment
  (``child_env``), the data set guard and the skip markers (tests/helpers.py).
- ``kernel_backend``: a module's tests on both kernel backends.
- Before the first test of a session that launches processes (mpiexec jobs, the distnn
  command), numba's disk cache is filled once (tests/warm_kernels.py), so that the ranks of
  a job do not all compile the same kernels at once. ``DISTNN_TEST_WARM=0`` skips it.
- Processes launched by the tests of those folders run the NumPy kernels
  (``DISTNN_KERNELS=numpy`` in their environment), unless the test is marked ``compiled``.
  Those tests check what the ranks do together (options, rules, failures, files), on a few
  steps of small models: there numba's start (about 1 s of CPU in every rank, loading its
  registries and the cached kernels) cost more than the steps it speeds up. Tests marked
  ``compiled`` (real data for hundreds of steps, the README main job, the planner's choices
  across ranks) run what users run by default; the kernels themselves are tested in
  tests/kernels on both backends. The suite's own process keeps its default backend.
- ``pytest -n 2`` (the README's test command; pytest-xdist): two worker processes take
  tests as they free up, the emulated-cluster tests (tests/cluster) all on one of them, one
  after another. The controller fills numba's cache before the workers start; the workers
  and the processes they launch then share that cache, so that a kernel one worker
  compiled the other loads (distnn locks numba's cache files: kernels/_numba_cache.py).
- ``slow`` (registered in pyproject.toml) marks tests of 15 s and more on 2 cores: real-data
  training and tests of several launches. Nothing is deselected by default:
  ``pytest -m "not slow"`` is the quick pass.
"""
import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))

import pytest  # noqa: E402

HERE = Path(__file__).resolve().parent
WORKER = os.environ.get("PYTEST_XDIST_WORKER")  # gw0, gw1... under pytest -n N


# Under pytest -n N each worker computes on one thread (BLAS, OpenMP, distnn's kernels,
# torch): two workers on two cores with two threads each spent their time in the threads'
# spinning (tests/nn: 84 CPU-s at 2 threads a worker against 49 at one). The processes the
# launching folders' tests start get the environment as it was (``_launched_kernels``).
# Paired on tests/kernels' Winograd, backends and vector-direct files and tests/nn, cold
# worker caches: 70.6 and 74.4 s (131, 134 CPU-s) against 81.7 and 85.7 s (153, 161) with
# two threads a worker. DISTNN_TEST_ONE_THREAD=0 leaves the workers' threads alone.
_THREAD_VARIABLES = ("DISTNN_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                     "MKL_NUM_THREADS")
_THREADS_BEFORE = {v: os.environ.get(v) for v in _THREAD_VARIABLES}
if WORKER and os.environ.get("DISTNN_TEST_ONE_THREAD", "1") != "0":
    os.environ.update({v: "1" for v in _THREAD_VARIABLES})
    try:
        from threadpoolctl import threadpool_limits
        threadpool_limits(1)  # a BLAS loaded before this file: its pool too
    except ImportError:
        pass

from distnn import kernels  # noqa: E402
# The folders whose tests start processes that run the compiled kernels.
LAUNCHING = {"cli", "cluster", "distributed", "models", "rules", "run", "search", "torch"}


@pytest.fixture(params=["numpy", "numba"], scope="module")
def kernel_backend(request):
    """Run a module's tests on both kernel backends (NumPy and compiled): tests/kernels uses
    it for every test; other modules opt in with
    ``pytestmark = pytest.mark.usefixtures("kernel_backend")``."""
    if request.param == "numba":
        pytest.importorskip("numba")
    previous = kernels.backend()
    kernels.set_backend(request.param)
    yield request.param
    kernels.set_backend(previous)


# The backend of this process is decided now, before any test sets DISTNN_KERNELS for the
# processes it launches.
kernels.backend()


@pytest.fixture(autouse=True)
def _launched_kernels(request, monkeypatch):
    if not _launches(request.node):
        return
    if request.node.get_closest_marker("compiled") is None:
        monkeypatch.setenv("DISTNN_KERNELS", "numpy")
    if WORKER:  # the launched processes decide their threads as users' processes do
        for var, value in _THREADS_BEFORE.items():
            if value is None:
                monkeypatch.delenv(var, raising=False)
            else:
                monkeypatch.setenv(var, value)


def _launches(item: pytest.Item) -> bool:
    try:
        parts = Path(item.path).resolve().relative_to(HERE).parts
    except ValueError:
        return False
    return len(parts) > 1 and parts[0] in LAUNCHING


_SHARED_FIXTURE = re.compile(r"@pytest\.fixture\([^)]*scope=[\"'](module|class|package|session)")


def _scopes_of_shared_set_ups() -> dict[str, str]:
    """Test file (relative to the repository) -> the scope its tests share: a file that
    defines a module- or class-scoped fixture is one scope (its set-up, often an MPI job
    whose results many tests check, then runs once, not once per worker); files that use a
    session fixture of their folder's conftest.py share one scope with it."""
    scopes: dict[str, str] = {}
    shared: dict[Path, list[str]] = {}
    for conftest in HERE.rglob("conftest.py"):
        if conftest.parent == HERE:
            continue  # the root's kernel_backend: cheap, tests spread freely
        names = re.findall(r"@pytest\.fixture\([^)]*scope=[\"'](?:session|package)[^)]*\)"
                           r"\s*def (\w+)", conftest.read_text())
        if names:
            shared[conftest.parent] = names
    for path in sorted(HERE.rglob("test_*.py")):
        rel = path.relative_to(HERE.parent).as_posix()
        text = path.read_text()
        for folder, names in shared.items():
            used = [n for n in names if path.is_relative_to(folder) and n in text]
            if used:
                scopes[rel] = f"{folder.relative_to(HERE.parent).as_posix()}::{used[0]}"
                break
        else:
            if _SHARED_FIXTURE.search(text):
                scopes[rel] = rel
    return scopes


# A test marked slow: the decorator, any others below it, then its def; a file-wide mark.
_SLOW_TEST = re.compile(r"@pytest\.mark\.slow\b[^\n]*\n(?:[ \t]*[@)\]][^\n]*\n|[ \t]+[^\n]*\n)*?"
                        r"[ \t]*def (\w+)")
_SLOW_FILE = re.compile(r"^pytestmark\s*=[^\n]*\bmark\.slow\b", re.MULTILINE)


def _slow_tests() -> dict[str, set[str] | None]:
    """Test file (relative to the repository) -> the names of its tests marked ``slow``, or
    None where the whole file is; read from the sources, as the scheduler runs in the
    controller, which collects no tests."""
    slow: dict[str, set[str] | None] = {}
    for path in sorted(HERE.rglob("test_*.py")):
        text = path.read_text()
        rel = path.relative_to(HERE.parent).as_posix()
        if _SLOW_FILE.search(text):
            slow[rel] = None
        elif names := set(_SLOW_TEST.findall(text)):
            slow[rel] = names
    return slow


def _is_slow(nodeid: str, slow: dict[str, set[str] | None]) -> bool:
    path, _, rest = nodeid.partition("::")
    if path not in slow:
        return False
    names = slow[path]
    return names is None or rest.split("::")[-1].split("[", 1)[0] in names


if importlib.util.find_spec("xdist") is not None:
    def pytest_xdist_make_scheduler(config: pytest.Config, log):
        """Under pytest -n N the emulated-cluster tests run one after another on one worker
        (one cluster at a time: their timeouts assume the cores they get); the tests that
        share a module- or session-scoped set-up go to one worker together (each worker
        would otherwise repeat the set-up: an MPI job, a training run); every other test
        goes to whichever worker is free. The large units are handed out first, then the
        single tests marked ``slow``, the other single tests last, so that the workers
        finish together (a 60 s test dealt last leaves the other worker idle for 60 s).
        (xdist's own ``xdist_group`` marks do not reach its scheduler under pytest 9: they
        rename ``item._nodeid``, which pytest 9 no longer reads.)"""
        from xdist.scheduler import LoadScopeScheduling

        files = _scopes_of_shared_set_ups()

        def scope(nodeid: str) -> str:
            if nodeid.startswith("tests/cluster/"):
                return "cluster"
            return files.get(nodeid.split("::", 1)[0], nodeid)

        groups = set(files.values())
        slow = _slow_tests()

        def order(unit: str) -> int:
            if unit == "cluster":
                return 0
            if unit in groups:
                return 1
            return 2 if _is_slow(unit, slow) else 3

        class SharedSetUpsTogether(LoadScopeScheduling):
            def _split_scope(self, nodeid: str) -> str:
                return scope(nodeid)

            def _assign_work_unit(self, node) -> None:
                # the first unit of the lowest order: clusters, shared set-ups, slow, the rest
                self.workqueue.move_to_end(min(self.workqueue, key=order), last=False)
                super()._assign_work_unit(node)

        config.option.loadscopereorder = False
        return SharedSetUpsTogether(config, log)


_BACKGROUND: list = []  # the controller's AVX2 run (tests/avx2_on_host.py) and its folder


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    # under pytest -n N: the controller warms the shared cache before it starts the workers,
    # and on an AVX-512 host compiles and runs the AVX2 code on the other core meanwhile
    if getattr(session.config.option, "numprocesses", None) and not WORKER:
        _start_avx2_run(session.config)
        _warm(session.config)


def pytest_sessionfinish(session: pytest.Session) -> None:
    for proc, folder in _BACKGROUND:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        shutil.rmtree(folder, ignore_errors=True)
    _BACKGROUND.clear()


def _start_avx2_run(config: pytest.Config) -> None:
    import avx2_on_host
    from distnn.kernels import planner as plan

    if importlib.util.find_spec("numba") is None or \
            plan.target_cpu(None, None) != plan.CPU("avx512") or \
            not avx2_on_host.wanted([str(a) for a in config.args]):
        return
    folder = Path(tempfile.mkdtemp(prefix="distnn-avx2-"))
    _BACKGROUND.append((avx2_on_host.start(folder), folder))


def pytest_collection_finish(session: pytest.Session) -> None:
    if WORKER or session.config.option.collectonly:
        return  # a worker: its controller warmed the cache
    compiled = [i for i in session.items if _launches(i) and i.get_closest_marker("compiled")]
    if compiled:
        _warm(session.config)


def _warm(config: pytest.Config) -> None:
    if os.environ.get("DISTNN_TEST_WARM", "1") == "0" or importlib.util.find_spec("numba") \
            is None or os.environ.get("DISTNN_KERNELS", "").strip().lower() == "numpy":
        return  # nothing to warm, or the launched processes will not compile anything
    # Best effort: a path that fails here fails in the tests that use it, with their message.
    # The environment as it is: default threads there, --threads 1 for the ranks' path. Its
    # own session, so that a timeout ends the processes it started for its groups too.
    proc = subprocess.Popen([sys.executable, str(HERE / "warm_kernels.py")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        proc.wait(timeout=900)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
