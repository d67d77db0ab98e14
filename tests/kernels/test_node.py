"""The compiled loops' threads before a run sets them: what OpenMP would use
(OMP_NUM_THREADS, else this process's cores by affinity), never the MPI launcher's or
Slurm's variables (threads per rank are decided from the communicator:
tests/run/test_run_threads.py)."""
import os

import pytest

from distnn.kernels import loop_threads, node_cores


@pytest.fixture
def clean_env(monkeypatch):
    for var in ("DISTNN_NUM_THREADS", "OMP_NUM_THREADS", "MPI_LOCALNRANKS",
                "OMPI_COMM_WORLD_LOCAL_SIZE", "PMIX_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE"):
        monkeypatch.delenv(var, raising=False)


def test_the_cores_of_the_process_unless_omp_num_threads(clean_env, monkeypatch):
    cores = len(os.sched_getaffinity(0))
    assert node_cores() == cores
    assert loop_threads() == cores
    assert loop_threads(cores) == 1
    assert loop_threads(cores * 4) == 1  # never 0
    monkeypatch.setenv("MPI_LOCALNRANKS", str(cores))  # a launcher's: not read here
    monkeypatch.setenv("SLURM_NTASKS_PER_NODE", str(cores))
    assert loop_threads() == cores
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the user's choice wins
    assert loop_threads() == 3


def test_affinity_not_the_machine_count(clean_env):
    before = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {min(before)})  # as taskset, Slurm or a cpuset would
        assert node_cores() == 1 and loop_threads() == 1
    finally:
        os.sched_setaffinity(0, before)
    assert os.cpu_count() >= len(before)
