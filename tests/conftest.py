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
- ``slow`` (registered in pyproject.toml) marks tests of 15 s and more on 2 cores: real-data
  training and tests of several launches. Nothing is deselected by default:
  ``pytest -m "not slow"`` is the quick pass.
"""
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))

import pytest  # noqa: E402

from distnn import kernels  # noqa: E402

HERE = Path(__file__).resolve().parent
# The folders whose tests start processes that run the compiled kernels.
LAUNCHING = {"cli", "cluster", "distributed", "rules", "run", "search", "torch"}


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
    if _launches(request.node) and request.node.get_closest_marker("compiled") is None:
        monkeypatch.setenv("DISTNN_KERNELS", "numpy")


def _launches(item: pytest.Item) -> bool:
    try:
        parts = Path(item.path).resolve().relative_to(HERE).parts
    except ValueError:
        return False
    return len(parts) > 1 and parts[0] in LAUNCHING


def pytest_collection_finish(session: pytest.Session) -> None:
    if os.environ.get("DISTNN_TEST_WARM", "1") == "0" or session.config.option.collectonly:
        return
    compiled = [i for i in session.items if _launches(i) and i.get_closest_marker("compiled")]
    if importlib.util.find_spec("numba") is None or not compiled:
        return
    if os.environ.get("DISTNN_KERNELS", "").strip().lower() == "numpy":
        return  # the launched processes will not compile anything
    # Best effort: a path that fails here fails in the tests that use it, with their message.
    try:  # the environment as it is: default threads there, --threads 1 for the ranks' path
        subprocess.run([sys.executable, str(HERE / "warm_kernels.py")], timeout=900,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        pass
