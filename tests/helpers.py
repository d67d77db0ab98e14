"""What many test files share: the launcher, the ``distnn`` command, the environment of a
child process, the dataset guard, and the skip markers built on them.

Import it as ``from helpers import ...`` (tests/conftest.py puts tests/ on ``sys.path``).
The skip reasons are part of the suite's report: keep them as they are.
"""
from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent / "distnn"
# The installed ``distnn`` script beside this Python, else the module.
COMMAND = [str(BIN)] if BIN.exists() else [sys.executable, "-m", "distnn.cli.main"]

ONE_THREAD = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def find_mpiexec() -> str | None:
    """The ``mpiexec`` beside this Python (the mpich wheel's), else the one on PATH."""
    here = Path(sys.executable).parent / "mpiexec"
    return str(here) if here.exists() else shutil.which("mpiexec")


MPIEXEC = find_mpiexec()


def have_mpi4py() -> bool:
    return importlib.util.find_spec("mpi4py") is not None


@functools.lru_cache(maxsize=None)
def have_fashion_mnist() -> bool:
    """Fashion-MNIST loads without a download (Debian's dataset-fashion-mnist, $DISTNN_DATA
    or the download cache). Loaded once per session, not once per test module."""
    try:
        from distnn.data import load_dataset
        load_dataset("fashion_mnist", download=False)
    except Exception:
        return False
    return True


def child_env(**extra: str) -> dict[str, str]:
    """This process's environment with one BLAS/OpenMP thread per child process (a child
    is one rank; two ranks share the 2 cores), plus ``extra``."""
    env = dict(os.environ)
    env.update(ONE_THREAD)
    env.update(extra)
    return env


def checkout_env() -> dict[str, str]:
    """This process's environment for a script of this checkout (``python benchmarks/...``,
    ``python -m benchmarks``): the repository root first on PYTHONPATH, then the source
    folder of the distnn this process imported (so the child runs the same code, and finds
    the numba cache the suite warmed for it), then what PYTHONPATH held."""
    import distnn
    src = str(Path(distnn.__file__).resolve().parents[1])
    root = str(Path(__file__).resolve().parents[1])
    paths = [root, src, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(dict.fromkeys(paths))}


def launcher(ranks: int) -> list[str]:
    """``mpiexec -n ranks`` for more than one rank; nothing (a plain process) for one."""
    return [MPIEXEC, "-n", str(ranks)] if ranks > 1 else []


def run_distnn(*args, cwd, ranks: int = 1, timeout: float = 300, **env: str):
    """``distnn ARGS`` on ``ranks`` ranks (a plain process for one), in ``cwd``, with
    one BLAS thread per rank; the finished process, output captured as text."""
    import subprocess
    return subprocess.run([*launcher(ranks), *COMMAND, *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, cwd=cwd, env=child_env(**env))


@contextlib.contextmanager
def reaped(proc):
    """``proc`` (a ``subprocess.Popen``), killed and drained on the way out if it still
    runs: a failed assertion must not leave a job behind."""
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def finish(proc, timeout: float = 240):
    """``proc.communicate(timeout)``: its (stdout, stderr), the process reaped either way."""
    with reaped(proc):
        return proc.communicate(timeout=timeout)


def pids_of_rank(rank: int, mark: str = "", pids=None) -> list[int]:
    """The pids of MPI rank ``rank``'s processes (hydra's PMI_RANK), not their watchers
    (launch/rankwatch.py), whose environment holds ``mark``; among ``pids`` (default:
    every process)."""
    if pids is None:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    found = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                watcher = b"rankwatch" in f.read()
        except OSError:
            continue
        if (f"PMI_RANK={rank}".encode() in env and (not mark or mark.encode() in env)
                and not watcher):
            found.append(pid)
    return found


# Skip markers (the reasons are the ones the suite has always reported).
needs_mpiexec = pytest.mark.skipif(MPIEXEC is None, reason="needs mpiexec")
needs_mpi = pytest.mark.skipif(MPIEXEC is None or not have_mpi4py(),
                               reason="needs mpiexec and mpi4py")


def __getattr__(name: str):
    # ``needs_fashion_mnist`` is made on first import: loading the data set to see whether
    # it is there costs seconds that modules which never ask for it should not pay.
    if name == "needs_fashion_mnist":
        return pytest.mark.skipif(not have_fashion_mnist(), reason="Fashion-MNIST not found")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
