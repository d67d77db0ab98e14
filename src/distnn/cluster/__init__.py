"""Running on several hosts: an emulated cluster on one machine (``emulated``) for tests,
benchmarks and trying a multi-host launch without a cluster (``python -m distnn.cluster``)."""
from .emulated import ClusterError, EmulatedCluster, Host, total_sent, unavailable_reason

__all__ = ["EmulatedCluster", "ClusterError", "Host", "total_sent", "unavailable_reason"]
