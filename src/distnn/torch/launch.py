"""``hvd.run(fn, args, np=N)``: Horovod's Run API on distnn. Starts N ranks with
``mpiexec`` (the one next to this Python, else on PATH), runs ``fn(*args, **kwargs)`` on each
after ``hvd.init()``, and returns the results in rank order. ``fn`` and its arguments travel
pickled (cloudpickle when installed, so lambdas and local functions work too), with this
process's ``sys.path`` so that ``fn``'s module is found; a rank that
raises makes ``run`` raise a RuntimeError with that rank's traceback.

Each rank is ``python -m distnn.torch._rank JOB_DIR`` (``_rank``).
"""
from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable


def _pickler():
    try:
        import cloudpickle
        return cloudpickle
    except ImportError:
        return pickle


def _mpiexec() -> str:
    here = Path(sys.executable).parent / "mpiexec"
    found = str(here) if here.exists() else shutil.which("mpiexec")
    if found is None:
        raise RuntimeError("hvd.run needs mpiexec (install the mpich wheel or an MPI "
                           "library); or start the ranks yourself: mpiexec -n N python ...")
    return found


def run(fn: Callable, args: tuple = (), kwargs: dict | None = None, np: int = 1,
        env: dict | None = None, timeout: float | None = None, verbose: bool = False,
        **_ignored) -> list[Any]:
    """Run ``fn(*args, **kwargs)`` on ``np`` new ranks; returns their results in rank order.

    Args:
        fn: a picklable function (cloudpickle: lambdas and closures too).
        np: the number of ranks.
        env: extra environment variables for the ranks.
        timeout: seconds before the job is stopped (None: no limit).
        verbose: let the ranks print to this process's stdout/stderr.
    Other keyword arguments of Horovod's ``run`` (hosts, ssh options, ...) are accepted and
    ignored: the ranks start on this host.

    Example:
        def work(x): hvd.init(); return hvd.rank() * x
        hvd.run(work, args=(10,), np=2)   # [0, 10]
    """
    if int(np) < 1:
        raise ValueError(f"run: np must be >= 1, got {np!r}")
    with tempfile.TemporaryDirectory(prefix="distnn-run-") as tmp:
        job = Path(tmp)
        with open(job / "path.pkl", "wb") as f:  # fn may live in a module found through it
            pickle.dump(list(sys.path), f)
        with open(job / "fn.pkl", "wb") as f:
            _pickler().dump((fn, tuple(args), dict(kwargs or {})), f)
        child_env = dict(os.environ, **{k: str(v) for k, v in (env or {}).items()})
        out = None if verbose else subprocess.DEVNULL
        proc = subprocess.run([_mpiexec(), "-n", str(int(np)), sys.executable, "-m",
                               "distnn.torch._rank", str(job)], env=child_env,
                              stdout=out, stderr=out, timeout=timeout)
        results = []
        for r in range(int(np)):
            path = job / f"rank{r}.pkl"
            if not path.exists():
                raise RuntimeError(f"run: rank {r} returned nothing (mpiexec exit code "
                                   f"{proc.returncode}); pass verbose=True to see its output")
            ok, value = pickle.load(open(path, "rb"))
            if not ok:
                raise RuntimeError(f"run: rank {r} raised:\n{value}")
            results.append(value)
        return results
