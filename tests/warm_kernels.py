"""Fill numba's disk cache before the suite's launched processes need it (tests/conftest.py
runs this once per session, in a process of its own).

The compiled kernels are cached on disk (``numba.njit(cache=True)``, in
src/distnn/kernels/__pycache__), so a process after the first loads them in about a second.
On a cold cache (a fresh clone, or a kernel file just edited) every rank of the first
``mpiexec -n 2`` or ``-n 3`` job compiles the same kernels at once, on 2 cores: measured
here, simplecnn float64 on 2 ranks took 34.8 CPU-s cold against 7.5 warm, both ranks saving
the same 8 kernels. This compiles the paths of the tests marked ``compiled`` (the only
launched processes that run the compiled kernels, tests/conftest.py) once instead:
simplecnn at 28x28 (Fashion-MNIST) at 1 thread (a rank sharing the cores) and at the
default threads (one process), and resnet20 at 32x32 (its Winograd and vector-direct
layers) at 1 thread, float32, forward, backward and evaluation. On a warm cache it costs
one short process per group.

The runs go in ``GROUPS``, one process each, the groups at once (numba compiles on one
thread, and the suite's workers wait for this: on 2 cores the second core sat idle). Two
processes may compile the same kernel at once: distnn locks numba's cache files
(kernels/_numba_cache.py), and the last save of a kernel is as good as the first.
"""
from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import tempfile

RUNS = [
    ["--model", "simplecnn", "--input_shape", "1,28,28", *threads]
    for threads in ([], ["--threads", "1"])
] + [["--model", "resnet20", "--input_shape", "3,32,32", "--threads", "1"]]
COMMON = ["train", "--dataset", "synthetic", "--num_samples", "64", "--batch_size", "16",
          "--num_epochs", "1", "--steps_per_epoch", "2", "--quiet"]


# simplecnn's two runs share most of their kernels; resnet20's Winograd and vector-direct
# layers are its own.
GROUPS = [[0, 1], [2]]


def run(indices: list[int]) -> int:
    """The runs ``indices`` of RUNS in this process, one after another; how many failed."""
    from distnn.cli.main import main as distnn
    failed = 0
    with tempfile.TemporaryDirectory() as folder:
        os.chdir(folder)
        for args in (RUNS[i] for i in indices):
            out = io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                code = distnn([*COMMON, *args])
            if code != 0:  # the tests that need this path will say why
                failed += 1
                sys.stderr.write(f"warm_kernels: {' '.join(args)}: exit {code}\n{out.getvalue()}")
    return failed


def main(argv: list[str]) -> int:
    if argv:  # one group, in this process
        return 1 if run([int(i) for i in argv]) else 0
    if (os.cpu_count() or 1) < 2:
        return 1 if run([i for group in GROUPS for i in group]) else 0
    procs = [subprocess.Popen([sys.executable, __file__, *map(str, group)])
             for group in GROUPS]
    return 1 if any([p.wait() for p in procs]) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
