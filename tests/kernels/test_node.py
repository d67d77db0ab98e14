"""Threads per rank: this process's cores (affinity, not the machine's count) shared among
the ranks on its node (MPI's local size, or the launcher's variables before MPI)."""
import os

import pytest

from distnn.kernels import node_cores, threads_per_rank


@pytest.fixture
def clean_env(monkeypatch):
    for var in ("DISTNN_NUM_THREADS", "OMP_NUM_THREADS", "MPI_LOCALNRANKS",
                "OMPI_COMM_WORLD_LOCAL_SIZE", "PMIX_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE"):
        monkeypatch.delenv(var, raising=False)


def test_the_cores_of_the_node_divided_among_its_ranks(clean_env, monkeypatch):
    cores = len(os.sched_getaffinity(0))
    assert node_cores() == cores
    assert threads_per_rank(1) == cores
    assert threads_per_rank(cores) == 1
    assert threads_per_rank(cores * 4) == 1  # oversubscribed: never 0
    assert threads_per_rank() == cores  # no launcher: one rank on the node
    monkeypatch.setenv("MPI_LOCALNRANKS", str(cores))  # hydra, before MPI starts
    assert threads_per_rank() == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the user's choice wins
    assert threads_per_rank(1) == 3


def test_affinity_not_the_machine_count(clean_env):
    before = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {min(before)})  # as taskset, Slurm or a cpuset would
        assert node_cores() == 1 and threads_per_rank(1) == 1
    finally:
        os.sched_setaffinity(0, before)
    assert os.cpu_count() >= len(before)
