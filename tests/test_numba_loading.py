"""numba loads only with the compiled backend: a process on the NumPy backend never
imports it (0.3-0.5 s of CPU in every rank), and the planner reads numba's CPU switches
from the environment the way numba's own config does."""
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("numba")

CHILD = """
import json, sys
from distnn.cli.main import main
code = main(["train", "--dataset", "synthetic", "--num_samples", "64", "--batch_size", "16",
             "--model", "simplecnn", "--input_shape", "1,28,28", "--num_epochs", "1",
             "--optimizer", "adam", "--quiet"])
print(json.dumps({"code": code, "numba": "numba" in sys.modules}))
"""


def _child(code: str, **env) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=dict(os.environ, **env), timeout=300, cwd=os.getcwd())
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_a_run_imports_numba_only_on_the_compiled_backend(backend, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    said = json.loads(_child(CHILD, DISTNN_KERNELS=backend))
    assert said == {"code": 0, "numba": backend == "numba"}


TARGET = """
from distnn.kernels import planner as plan
read = plan.TARGET
from numba.core import config
print(read == plan.target_cpu(config.CPU_NAME, config.CPU_FEATURES), read.kind)
"""


@pytest.mark.parametrize("env", [{}, {"NUMBA_CPU_NAME": "haswell"},
                                 {"NUMBA_CPU_NAME": "haswell", "NUMBA_CPU_FEATURES": ""},
                                 {"NUMBA_CPU_NAME": "generic"},
                                 {"NUMBA_CPU_NAME": "skylake-avx512"},
                                 {"NUMBA_CPU_NAME": "x86-64", "NUMBA_CPU_FEATURES": "+avx2,+fma"}])
def test_the_planner_reads_the_cpu_numba_compiles_for(env):
    clean = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_CPU")}
    out = subprocess.run([sys.executable, "-c", TARGET], capture_output=True, text=True,
                         env=dict(clean, **env), timeout=120)
    assert out.returncode == 0, out.stderr
    same, kind = out.stdout.split()
    assert same == "True", (env, kind)
    if env == {"NUMBA_CPU_NAME": "haswell", "NUMBA_CPU_FEATURES": ""}:
        assert kind == "avx2"  # the name's own features (without them: the host's)
    if env.get("NUMBA_CPU_NAME") == "generic":
        assert kind == "generic"
