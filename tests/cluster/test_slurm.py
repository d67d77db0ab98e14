"""Slurm on the emulated cluster: ``srun --mpi=pmi2`` starts distnn on two namespace hosts.

Needs root and Debian's slurmctld, slurmd, slurm-client and munge (skipped otherwise); the
cluster uses prefix ``s`` and 198.18.5.0/24."""
import os
import subprocess
import sys

import pytest

from distnn.cluster import EmulatedCluster, total_sent
from distnn.cluster import emulated, slurm
from distnn.cluster.slurm import EmulatedSlurm

PARAMETERS = 149_210  # simplecnn, float32
STEPS = 50
DISTNN = os.path.join(os.path.dirname(sys.executable), "distnn")


def _why_not() -> str | None:
    why = emulated.unavailable_reason() or slurm.unavailable_reason()
    if why:
        return why
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return "mpi4py is not installed"
    if not os.path.exists(DISTNN):
        return f"no distnn command next to {sys.executable}"
    return None


needs_slurm = pytest.mark.skipif(_why_not() is not None, reason=str(_why_not()))


@pytest.fixture(scope="module")
def slurm_cluster():
    with EmulatedCluster(2, rate="1gbit", prefix="s", net=5) as cluster:
        with EmulatedSlurm(cluster, timeout=30) as slurm_:
            yield cluster, slurm_


def _srun(slurm_, argv, timeout=120):
    return subprocess.run(slurm_.srun_argv(argv), env=slurm_.env(), capture_output=True,
                          text=True, timeout=timeout)


def test_slurm_conf_has_one_node_per_host_with_its_cores():
    cluster = EmulatedCluster(2, rate=None, prefix="s", net=5)
    text = EmulatedSlurm(cluster).slurm_conf()
    for h in cluster.hosts:
        assert f"NodeName={h.name} NodeAddr={h.address} CPUs={len(h.cores)} " in text
    assert "SlurmctldHost=sctl(198.18.5.1)" in text
    assert "MpiDefault=pmi2" in text and "ProctrackType=proctrack/linuxproc" in text
    assert EmulatedSlurm(cluster).srun_argv(["x"]) == ["srun", "--mpi=pmi2", "-N", "2",
                                                        "-n", "2", "x"]


@needs_slurm
@pytest.mark.timeout(120)
def test_srun_info_sees_two_hosts_and_their_cores(slurm_cluster):
    cluster, slurm_ = slurm_cluster
    assert slurm_.node_states() == {"s1": "idle", "s2": "idle"}
    proc = _srun(slurm_, [DISTNN, "info"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ranks: 2" in proc.stdout and "hosts: 2" in proc.stdout, proc.stdout
    assert "s1: ranks [0]" in proc.stdout and "s2: ranks [1]" in proc.stdout, proc.stdout
    for rank, host in enumerate(cluster.hosts):  # task/none: a task runs on its host's cores
        cores = len(host.cores)
        assert (f"rank {rank}: pid" in proc.stdout and f"local rank 0/1, cores {cores}, "
                f"train threads {cores}," in proc.stdout), proc.stdout


@needs_slurm
@pytest.mark.timeout(180)
def test_srun_train_crosses_the_links(slurm_cluster):
    cluster, slurm_ = slurm_cluster
    before = cluster.link_bytes()
    proc = _srun(slurm_, [DISTNN, "train", "--num_epochs", "1", "--steps_per_epoch",
                          str(STEPS)], timeout=150)
    after = cluster.link_bytes()
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "ranks 2" in proc.stdout and "Training: 1 epoch" in proc.stdout, proc.stdout
    # each step all-reduces the float32 gradients between the two hosts
    for h in cluster.hosts:
        sent = after[h.name]["sent"] - before[h.name]["sent"]
        assert sent >= STEPS * PARAMETERS * 4, (h.name, sent)
    assert total_sent(before, after) >= 2 * STEPS * PARAMETERS * 4


@needs_slurm
@pytest.mark.timeout(120)
def test_up_ends_what_a_crashed_instance_left(slurm_cluster):
    cluster, first = slurm_cluster
    # a new instance knows nothing of the first one's processes (as after a crash)
    second = EmulatedSlurm(cluster, timeout=30).up()
    try:
        assert all(p.poll() is not None for p in first._procs)
        proc = _srun(second, ["hostname"])
        assert proc.returncode == 0 and sorted(proc.stdout.split()) == ["s1", "s2"], proc
    finally:
        second.down()
    assert second._leftovers() == [] and not os.path.exists(second.state)
