"""Running on several hosts: an emulated cluster on one machine (``emulated``) for tests,
benchmarks and trying a multi-host launch without a cluster (``python -m distnn.cluster``),
and Slurm on its hosts (``slurm``: munged, slurmctld, one slurmd per host, ``srun``;
``python -m distnn.cluster.slurm``)."""
from .emulated import ClusterError, EmulatedCluster, Host, total_sent, unavailable_reason

__all__ = ["EmulatedCluster", "ClusterError", "Host", "total_sent", "unavailable_reason",
           "EmulatedSlurm", "SlurmError"]


def __getattr__(name: str):
    # imported on first use, so that ``python -m distnn.cluster.slurm`` runs it only once
    if name in ("EmulatedSlurm", "SlurmError"):
        from . import slurm
        return getattr(slurm, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
