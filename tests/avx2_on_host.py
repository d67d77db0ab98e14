"""The AVX2 code run on an AVX-512 host (tests/kernels/test_plan.py,
``test_the_avx2_code_runs_on_this_host``): the register-tile and driver tests in a process
whose numba compiles for an older CPU (``NUMBA_CPU_NAME=haswell``).

That process compiles every kernel those tests use for Haswell (about 90 CPU-s on a cold
cache). Under ``pytest -n N`` the controller starts it (``start``) beside its numba warm-up,
which keeps one core busy while the other waits, so the compile runs on the idle core
before the workers start; the test then reads its result (``result``). Run on its own, the
test runs it in place. Its numba cache is a folder of its own, so it never writes the
cache the warm-up and the workers use.

Run as a script: ``avx2_on_host.py OUT.json`` runs it and writes the result there.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = ["tests/kernels/test_vgemm.py", "tests/kernels/test_winograd_blocks.py"]
PROBE = ("from distnn.kernels import planner as plan, _vgemm; "
         "print(plan.TARGET.kind, _vgemm.WIDTH, plan.tile_products())")
# set by the controller for its workers: the file the started run writes its result to
RESULT_VAR = "DISTNN_TEST_AVX2_RESULT"


def haswell_env() -> dict[str, str]:
    cache = Path(tempfile.gettempdir()) / f"distnn-numba-{os.getuid()}" / "haswell"
    return dict(os.environ, NUMBA_CPU_NAME="haswell", NUMBA_CPU_FEATURES="",
                NUMBA_CACHE_DIR=str(cache))


def run() -> dict:
    """The probe (CPU kind, tile width, tile products as the Haswell process sees them) and
    the tests' exit status and output tail."""
    env = haswell_env()
    probe = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True,
                           text=True, cwd=ROOT)
    tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                            "-x", *TESTS], env=env, capture_output=True,
                           text=True, cwd=ROOT)
    return {"probe": probe.stdout.split(), "probe_err": probe.stderr[-2000:],
            "rc": tests.returncode, "tail": tests.stdout[-3000:]}


def wanted(args: list[str]) -> bool:
    """Whether a session over ``args`` (pytest's file or folder arguments, relative to the
    repository or absolute) would run test_plan.py."""
    target = ROOT / "tests" / "kernels" / "test_plan.py"
    paths = [Path(a.split("::", 1)[0]) for a in args if not a.startswith("-")]
    if not paths:
        return True
    return any(target == (p if p.is_absolute() else (Path.cwd() / p)).resolve()
               or target.is_relative_to((p if p.is_absolute() else Path.cwd() / p).resolve())
               for p in paths)


def start(folder: Path) -> subprocess.Popen:
    """Start the run in the background; its result will be ``folder``/avx2.json."""
    out = folder / "avx2.json"
    os.environ[RESULT_VAR] = str(out)
    return subprocess.Popen([sys.executable, __file__, str(out)], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def result(timeout: float = 900) -> dict:
    """The started run's result (waiting for it), or the run done now when none started."""
    path = os.environ.get(RESULT_VAR)
    if not path:
        return run()
    end = time.monotonic() + timeout
    while not Path(path).exists():
        if time.monotonic() > end:
            raise TimeoutError(f"the AVX2 run started by the controller wrote no {path} "
                               f"in {timeout:.0f} s")
        time.sleep(0.5)
    return json.loads(Path(path).read_text())


if __name__ == "__main__":
    target = Path(sys.argv[1])
    data = run()
    part = target.with_suffix(".part")
    part.write_text(json.dumps(data))
    part.replace(target)  # whole, or not there
