"""Launching rule_prog.py (and the distnn command) under real mpiexec for tests/rules (a
module of its own, not conftest.py: "from conftest import" finds whichever conftest pytest
loaded last when several test folders are collected together)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import COMMAND, MPIEXEC, SessionBatch, child_env

PROG = Path(__file__).parent / "progs" / "rule_prog.py"


def run_jobs(n: int, jobs: list[dict], out: Path, timeout: float = 90,
             prog: Path = PROG, stdout: bool = False) -> dict:
    """Run the jobs on n ranks with ``prog``; {job name: [per-rank {"npz", "json"}]}, and
    with ``stdout`` the ranks' output under "stdout"."""
    proc = subprocess.run([MPIEXEC, "-n", str(n), sys.executable, str(prog), str(out),
                           json.dumps(jobs)], capture_output=True, text=True,
                          timeout=timeout, env=child_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = {"stdout": proc.stdout} if stdout else {}
    for job in jobs:
        results[job["name"]] = read_job(n, job["name"], out)
    return results


def read_job(n: int, name: str, out: Path) -> list[dict]:
    """The per-rank results ({"npz" arrays, "json" fields}) of job ``name``."""
    ranks = []
    for r in range(n):
        base = out / f"{name}.rank{r}"
        with np.load(str(base) + ".npz") as z:
            arrays = {k: z[k] for k in z.files}
        ranks.append({**arrays, **json.loads(Path(str(base) + ".json").read_text())})
    return ranks


# One launch per (program, ranks) for the jobs of every test of this folder that batches
# (tests/rules/conftest.py's ``rule_batch``). A job's paths may name "@OUT@", the folder
# of the batch's results (a test's tmp_path does not exist when its module registers).
OUT = "@OUT@"


def _command(key, jobs, out):
    prog, n = key
    return [MPIEXEC, "-n", str(n), sys.executable, str(prog), str(out),
            json.dumps(jobs).replace(OUT, str(out))]


def _done(key, job, out):
    return all((out / f"{job['name']}.rank{r}.json").is_file() for r in range(key[1]))


BATCH = SessionBatch(_command, _done, lambda key: f"{key[0].name} on {key[1]} ranks")


class Jobs:
    """A test's jobs in the session's batch: registered now, read back by the tests."""

    def __init__(self, n: int, jobs: list[dict], owner: str, timeout: float = 90,
                 prog: Path = PROG):
        self.key, self.owner = (Path(prog), n), owner
        self.module = owner.split(".", 1)[0]
        self.names = {job["name"]: f"{owner}.{job['name']}" for job in jobs}
        self.jobs = {job["name"]: job for job in jobs}
        for job in jobs:
            job = {**job, "name": self.names[job["name"]]}
            BATCH.add(self.key, job["name"], job, timeout, self.module)

    def job(self, name: str) -> dict:
        return self.jobs[name]

    def results(self, batch) -> dict:
        """{job name: per-rank results}, the test failed (with the launch's output) when a
        job of it failed."""
        outcome = batch(self.key)
        failed = [why for name in self.names.values() if (why := outcome.get(name))]
        if failed:
            pytest.fail("\n".join(failed), pytrace=False)
        out = BATCH.out[self.key]
        return {name: read_job(self.key[1], unique, out) for name, unique in self.names.items()}


def run_cli(n: int, *args: str, timeout: float = 120, cwd=None) -> subprocess.CompletedProcess:
    launcher = [MPIEXEC, "-n", str(n)] if n else []
    return subprocess.run([*launcher, *COMMAND, *args], capture_output=True, text=True,
                          timeout=timeout, env=child_env(), cwd=cwd)
