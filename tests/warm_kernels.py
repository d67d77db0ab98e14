"""Fill numba's disk cache before the suite's launched processes need it (tests/conftest.py
runs this once per session, in a process of its own).

The compiled kernels are cached on disk (``numba.njit(cache=True)``, in
src/distnn/kernels/__pycache__), so a process after the first loads them in about a second.
On a cold cache (a fresh clone, or a kernel file just edited) every rank of the first
``mpiexec -n 2`` or ``-n 3`` job compiles the same kernels at once, on 2 cores: measured
here, simplecnn float64 on 2 ranks took 34.8 CPU-s cold against 7.5 warm, both ranks saving
the same 8 kernels. This compiles the common paths once instead: simplecnn float32 and
float64 at 1 thread (a rank sharing the cores) and at the default threads (one process),
at 8x8 (the synthetic runs and digits) and 28x28 (Fashion-MNIST), forward, backward and
evaluation. On a warm cache it costs one short process.
"""
from __future__ import annotations

import contextlib
import io
import os
import sys
import tempfile

RUNS = [
    [*shape, *dtype, *threads]
    for shape in (["--input_shape", "1,8,8"], ["--input_shape", "1,28,28"])
    for dtype in (["--dtype", "float32"], ["--dtype", "float64"])
    for threads in ([], ["--threads", "1"])
]
COMMON = ["train", "--dataset", "synthetic", "--model", "simplecnn", "--num_samples", "64",
          "--batch_size", "16", "--num_epochs", "1", "--steps_per_epoch", "2", "--quiet"]


def main() -> int:
    from distnn.cli.main import main as distnn
    failed = 0
    with tempfile.TemporaryDirectory() as folder:
        os.chdir(folder)
        for run in RUNS:
            out = io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                code = distnn([*COMMON, *run])
            if code != 0:  # the tests that need this path will say why
                failed += 1
                sys.stderr.write(f"warm_kernels: {' '.join(run)}: exit {code}\n{out.getvalue()}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
