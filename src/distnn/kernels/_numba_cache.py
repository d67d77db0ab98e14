"""numba's disk cache, safe for processes that compile into it at the same time.

numba keeps a compiled function on disk as an index (signature -> data file name) and one
data file per signature. Saving reads the index, takes the first free data file name, and
writes the index and then the data. Two processes that compile *different* signatures of
one function at the same moment both take the same free name: the index that survives then
points one signature at the other's machine code, which every later process loads for the
wrong types. On a cold cache that happens whenever processes of one node run different
shapes or dtypes at once: a search's trials on blocks of ranks, or a test suite's workers.
An exclusive lock on the cache folder around numba's save (read, pick, write) and a shared
one around its load make each of them one step. Where the folder cannot be written (a
read-only installation) numba's own behaviour is kept.
"""
from __future__ import annotations

import functools
import os

try:
    import fcntl
except ImportError:  # not POSIX: numba's cache as it is
    fcntl = None

LOCK_NAME = ".distnn-cache.lock"


def _locked(method, mode: int):
    @functools.wraps(method)
    def under_lock(self, *args, **kwargs):
        try:
            fd = os.open(os.path.join(self._cache_path, LOCK_NAME), os.O_RDWR | os.O_CREAT,
                         0o666)
        except OSError:
            return method(self, *args, **kwargs)
        try:
            fcntl.flock(fd, mode)
            return method(self, *args, **kwargs)
        finally:
            os.close(fd)  # closing the only descriptor releases the lock
    under_lock.distnn_locked = True
    return under_lock


def install() -> bool:
    """Lock numba's cache files (once per process); False where this numba or platform
    offers nothing to lock."""
    try:
        from numba.core.caching import IndexDataCacheFile
    except ImportError:
        return False
    if fcntl is None or not all(hasattr(IndexDataCacheFile, m) for m in ("save", "load")):
        return False
    if not getattr(IndexDataCacheFile.save, "distnn_locked", False):
        IndexDataCacheFile.save = _locked(IndexDataCacheFile.save, fcntl.LOCK_EX)
        IndexDataCacheFile.load = _locked(IndexDataCacheFile.load, fcntl.LOCK_SH)
    return True
