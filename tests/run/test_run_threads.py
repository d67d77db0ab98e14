"""Threads per rank are decided once (``distributed.threads_per_rank``: ``--threads``, else
OMP_NUM_THREADS, else this process's cores shared among the ranks of its node that share
them, as the communicator knows them) and applied by the run builder to the compiled
kernels, BLAS and torch."""
from __future__ import annotations

import os

import pytest
from threadpoolctl import threadpool_info

from distnn import kernels
from distnn.distributed import LocalComm, node_cores, threads_per_rank
from distnn.run import build_config, build_run, threads_scope

CORES = len(os.sched_getaffinity(0))
OPTIONS = {"dataset": "synthetic", "input_shape": (1, 8, 8), "num_samples": 64,
           "batch_size": 16, "num_epochs": 1, "evaluate": False, "quiet": True}


@pytest.fixture
def clean_env(monkeypatch):
    for var in ("DISTNN_NUM_THREADS", "OMP_NUM_THREADS", "MPI_LOCALNRANKS",
                "OMPI_COMM_WORLD_LOCAL_SIZE", "PMIX_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE"):
        monkeypatch.delenv(var, raising=False)


def _node(sharers: int, local_size: int | None = None):
    """A communicator's view of its node: ``sharers`` ranks share this rank's cores."""
    comm = LocalComm()
    comm.core_sharers = sharers
    comm.local_size = sharers if local_size is None else local_size
    return comm


def _blas_threads() -> set[int]:
    return {p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"}


def test_the_cores_of_the_node_divided_among_the_ranks_sharing_them(clean_env, monkeypatch):
    assert node_cores() == CORES
    assert threads_per_rank(LocalComm()) == CORES
    assert threads_per_rank(_node(CORES)) == 1
    assert threads_per_rank(_node(CORES * 4)) == 1  # oversubscribed: never 0
    # ranks pinned to cores of their own (core_sharers 1) keep them all
    assert threads_per_rank(_node(1, local_size=CORES)) == CORES
    # the launcher's variables are not read: the communicator says who shares the node
    monkeypatch.setenv("MPI_LOCALNRANKS", str(CORES * 2))
    assert threads_per_rank(LocalComm()) == CORES
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the user's choice ...
    assert threads_per_rank(_node(CORES)) == 3
    assert threads_per_rank(_node(CORES), asked=5) == 5  # ... and --threads wins over it


def test_affinity_not_the_machine_count(clean_env):
    before = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {min(before)})  # as taskset, Slurm or a cpuset would
        assert node_cores() == 1 and threads_per_rank(LocalComm()) == 1
    finally:
        os.sched_setaffinity(0, before)


def test_the_run_builder_applies_the_threads_to_kernels_and_blas(clean_env):
    compiled = kernels.backend() == "numba"
    with threads_scope(2):
        before = kernels.get_num_threads()
        assert before == (min(2, CORES) if compiled else 1)
        with threads_scope():
            run = build_run(build_config("train", {**OPTIONS, "threads": 1}), LocalComm())
            assert run.threads == 1
            assert kernels.get_num_threads() == 1 and _blas_threads() == {1}
            # --threads 0: the node's cores shared among the ranks that share them
            run = build_run(build_config("train", OPTIONS), _node(2))
            assert run.threads == max(1, CORES // 2)
            assert kernels.get_num_threads() == (run.threads if compiled else 1)
            assert _blas_threads() == {run.threads}
        # the scope put back what was there before
        assert kernels.get_num_threads() == before and _blas_threads() == {2}


@pytest.mark.skipif(CORES < 2, reason="needs 2 cores to tell 1 thread from the default")
def test_threads_are_handed_to_torch(clean_env):
    torch = pytest.importorskip("torch")
    torch.set_num_threads(2)  # what the scope restores (an earlier test may have left 1)
    with threads_scope():
        run = build_run(build_config("train", {**OPTIONS, "threads": 1}), LocalComm())
        assert run.threads == 1 and torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2


@pytest.mark.compiled  # the compiled kernels' threads are what it reads
def test_a_script_under_mpiexec_shares_the_node_from_init(tmp_path):
    """A script that calls ``distnn.distributed.init()`` and never builds a run: its ranks
    share the node's cores from the start (cores // ranks on this node), not all of them
    each; one process alone keeps them all."""
    import subprocess
    import sys

    from helpers import MPIEXEC
    if MPIEXEC is None:
        pytest.skip("needs mpiexec")
    script = tmp_path / "script.py"
    # each rank writes its own file: two ranks' prints can interleave in mpiexec's output
    script.write_text("import sys\n"
                      "from distnn import distributed as dist, kernels\n"
                      "comm = dist.init()\n"
                      "line = f'{comm.rank} {kernels.get_num_threads()}'\n"
                      "open(f'{sys.argv[1]}{comm.rank}', 'w').write(line)\n"
                      "print(line)\n")
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_NUM_THREADS", "DISTNN_NUM_THREADS")}
    subprocess.run([MPIEXEC, "-n", "2", sys.executable, str(script), str(tmp_path / "r")],
                   env=env, capture_output=True, text=True, timeout=120, check=True)
    got = sorted((tmp_path / f"r{r}").read_text() for r in range(2))
    assert got == [f"{r} {max(1, CORES // 2)}" for r in range(2)], got
    out = subprocess.run([sys.executable, str(script), str(tmp_path / "one")], env=env,
                         capture_output=True, text=True, timeout=120, check=True).stdout
    assert out.split() == ["0", str(CORES)], out
