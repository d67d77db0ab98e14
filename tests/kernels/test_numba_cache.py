"""numba's disk cache shared by processes that compile into it at once
(distnn/kernels/_numba_cache.py): saving waits for the folder's lock, and processes that
compile different signatures of one function at the same moment leave an index in which
every signature loads its own code."""
from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import textwrap
import time

import pytest

pytest.importorskip("numba")

KERNEL = textwrap.dedent("""
    import numba

    @numba.njit(cache=True)
    def scaled(x, k):
        return x * k + 1
""")

# A child: install the lock (as the compiled backend does on import), wait for the start
# signal, compile one signature, check what it computes, print where the cache came from.
CHILD = textwrap.dedent("""
    import os, sys, time
    sys.path.insert(0, sys.argv[1])
    from distnn.kernels import _numba_cache
    assert _numba_cache.install()
    import numpy as np
    import kern
    while not os.path.exists(sys.argv[2]):
        time.sleep(0.005)
    x = np.arange(4, dtype=sys.argv[3])
    k = np.dtype(sys.argv[3]).type(3)
    y = kern.scaled(x, k)
    assert y.dtype == x.dtype and (y == x * 3 + 1).all(), (y, y.dtype)
    print(len(kern.scaled.stats.cache_hits), len(kern.scaled.stats.cache_misses))
""")

DTYPES = ["float32", "float64", "complex64", "complex128"]


def _start(folder, dtype):
    env = {**os.environ, "NUMBA_CACHE_DIR": str(folder / "cache")}
    return subprocess.Popen([sys.executable, "-c", CHILD, str(folder), str(folder / "go"),
                             dtype], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


@pytest.fixture
def _both_backends():
    """Not the kernels' backends: numba itself (tests/kernels/conftest.py runs the rest on
    both)."""


@pytest.fixture
def folder(tmp_path):
    (tmp_path / "kern.py").write_text(KERNEL)
    return tmp_path


def _finish(proc):
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err[-2000:]
    return tuple(int(v) for v in out.split())


def test_processes_compiling_different_signatures_at_once_each_load_their_own(folder):
    procs = [_start(folder, d) for d in DTYPES]
    time.sleep(1.0)  # every child imported numba and waits: they compile together
    (folder / "go").touch()
    assert [_finish(p) for p in procs] == [(0, 1)] * len(DTYPES)  # each compiled
    # fresh processes load every signature from the disk, and each computes right
    again = [_start(folder, d) for d in DTYPES]
    assert [_finish(p) for p in again] == [(1, 0)] * len(DTYPES)


def test_saving_waits_for_the_folder_lock(folder):
    from distnn.kernels._numba_cache import LOCK_NAME
    (folder / "go").touch()
    warm = _start(folder, "float64")  # creates the cache folder and its first entry
    assert _finish(warm) == (0, 1)
    locks = list((folder / "cache").rglob(LOCK_NAME))
    assert len(locks) == 1, locks
    fd = os.open(locks[0], os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)  # as a process in the middle of its save
    try:
        waiting = _start(folder, "float32")
        time.sleep(4.0)  # long enough to import, compile and reach the save
        assert waiting.poll() is None  # held at the lock: load or save
    finally:
        os.close(fd)
    assert _finish(waiting) == (0, 1)
