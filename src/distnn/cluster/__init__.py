"""Running on several hosts: an emulated cluster on one machine (``emulated``) for tests,
benchmarks and trying a multi-host launch without a cluster (``python -m distnn.cluster``),
and Slurm on its hosts (``slurm``: munged, slurmctld, one slurmd per host; ``srun``)."""
from .emulated import ClusterError, EmulatedCluster, Host, total_sent, unavailable_reason
from .slurm import EmulatedSlurm, SlurmError

__all__ = ["EmulatedCluster", "ClusterError", "Host", "total_sent", "unavailable_reason",
           "EmulatedSlurm", "SlurmError"]
