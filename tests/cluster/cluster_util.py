"""Helpers of the emulated-cluster tests (a module of its own: pytest swaps `conftest`
between folders)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import MPIEXEC

from distnn.cluster import EmulatedCluster, unavailable_reason

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
DISTNN = str(BIN / "distnn")
# Tests use their own names and /24 so they never meet a cluster a person has up;
# DISTNN_TEST_CLUSTER="prefix,net" moves them (two checkouts testing at once).
PREFIX, NET = os.environ.get("DISTNN_TEST_CLUSTER", "dnt,77").split(",")
NET = int(NET)


def skip_reason() -> str | None:
    why = unavailable_reason()
    if why:
        return f"emulated cluster: {why}"
    if MPIEXEC is None:
        return "emulated cluster: needs mpiexec (pip install mpich)"
    return None


needs_cluster = pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")


def make_cluster(hosts=2, **kw) -> EmulatedCluster:
    return EmulatedCluster(hosts, prefix=kw.pop("prefix", PREFIX), net=kw.pop("net", NET),
                           **kw)


def run(cluster, argv, ranks_per_host=1, hosts=None, timeout=180, env=None, **kw):
    """Run argv under mpiexec on the cluster's hosts; CompletedProcess with text output."""
    environment = cluster.env(env)
    environment.setdefault("PYTHONUNBUFFERED", "1")
    return subprocess.run(cluster.mpiexec(argv, ranks_per_host, hosts, mpiexec=MPIEXEC),
                          env=environment, capture_output=True, text=True, timeout=timeout,
                          cwd=kw.pop("cwd", ROOT), **kw)


def local_run(argv, n=0, timeout=180, env=None, bind=None):
    """argv on this machine's shared memory: n ranks under mpiexec, or 1 process (n=0);
    ``bind``: hydra's -bind-to (e.g. "core")."""
    cmd = ([MPIEXEC] + (["-bind-to", bind] if bind else []) + ["-n", str(n)] if n else []) \
        + list(argv)
    environment = dict(os.environ if env is None else env)
    return subprocess.run(cmd, env=environment, capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)
