"""What MPICH's collectives cost on N hosts x 1 rank joined by links of one latency and
bandwidth (the alpha-beta model): the all-reduce, all-gather and all-to-all algorithms its
automatic choice picks by size, with its default thresholds. Used by ``costmodel``;
equations and what they leave out: docs/costmodel.md.

    allreduce_time(4 << 20, 8, Link(gbits=10))  # (seconds, "reduce-scatter + all-gather")
"""
from __future__ import annotations

import math
from dataclasses import dataclass

# MPICH's defaults (src/mpi/coll/allreduce, allgather, ialltoall: MPI_T cvars of the same
# names; ``mpivars`` of the mpich wheel lists them).
ALLREDUCE_SHORT_MSG_SIZE = 2048      # MPIR_CVAR_ALLREDUCE_SHORT_MSG_SIZE
ALLGATHER_SHORT_MSG_SIZE = 81920     # MPIR_CVAR_ALLGATHER_SHORT_MSG_SIZE
ALLGATHER_LONG_MSG_SIZE = 524288     # MPIR_CVAR_ALLGATHER_LONG_MSG_SIZE
ALLTOALL_SHORT_MSG_SIZE = 256        # MPIR_CVAR_ALLTOALL_SHORT_MSG_SIZE (per destination)
ALLTOALL_MEDIUM_MSG_SIZE = 32768     # MPIR_CVAR_ALLTOALL_MEDIUM_MSG_SIZE (per destination)
ALLTOALL_THROTTLE = 32               # MPIR_CVAR_ALLTOALL_THROTTLE
REDUCE_SCATTER_LONG_MSG_SIZE = 524288  # MPIR_CVAR_REDUCE_SCATTER_COMMUTATIVE_LONG_MSG_SIZE


@dataclass(frozen=True)
class Link:
    """One host's link: ``gbits`` Gbit/s each way, ``latency_s`` per message (alpha)."""
    gbits: float
    latency_s: float = 50e-6

    def __post_init__(self):
        if not self.gbits > 0:
            raise ValueError(f"link gbits must be > 0, got {self.gbits!r}")
        if not self.latency_s >= 0:
            raise ValueError(f"link latency_s must be >= 0, got {self.latency_s!r}")

    @property
    def bytes_per_s(self) -> float:
        return self.gbits * 1e9 / 8

    def send(self, nbytes: float) -> float:
        """alpha + n / beta: one message of ``nbytes``."""
        return self.latency_s + nbytes / self.bytes_per_s


def _pof2(p: int) -> int:
    return 1 << (p.bit_length() - 1)


def allreduce_time(nbytes: float, hosts: int, link: Link, *, itemsize: int = 4,
                   builtin_op: bool = True) -> tuple[float, str]:
    """Seconds of one all-reduce of ``nbytes`` per rank over ``hosts`` ranks, and MPICH's
    algorithm for it: recursive doubling when the buffer is at most
    MPIR_CVAR_ALLREDUCE_SHORT_MSG_SIZE bytes, the op is user-defined or the count is below
    the largest power of two p' <= P; otherwise Rabenseifner's reduce-scatter + all-gather.
    A P that is not a power of two first folds the P - p' extra ranks into partners and
    hands them the result at the end (2 messages of the whole buffer)."""
    if hosts <= 1 or nbytes <= 0:
        return 0.0, "none"
    p = _pof2(hosts)
    steps = p.bit_length() - 1
    fold = 2 * link.send(nbytes) if hosts != p else 0.0
    if nbytes <= ALLREDUCE_SHORT_MSG_SIZE or not builtin_op or nbytes / itemsize < p:
        return steps * link.send(nbytes) + fold, "recursive doubling"
    t = 2 * steps * link.latency_s + 2 * (p - 1) / p * nbytes / link.bytes_per_s
    return t + fold, "reduce-scatter + all-gather"


def allreduce_sends(nbytes: float, hosts: int, *, itemsize: int = 4,
                    builtin_op: bool = True) -> tuple[int, float]:
    """(messages, bytes) one rank sends (and receives) in ``allreduce_time``'s all-reduce:
    recursive doubling log2 p' messages of the whole buffer; Rabenseifner 2 log2 p'
    messages, 2 (p'-1)/p' of the buffer; a P that is not a power of two adds the fold
    (one message of the buffer each way, for the ranks that fold)."""
    if hosts <= 1 or nbytes <= 0:
        return 0, 0.0
    p = _pof2(hosts)
    steps = p.bit_length() - 1
    fold = (1, nbytes) if hosts != p else (0, 0.0)
    if nbytes <= ALLREDUCE_SHORT_MSG_SIZE or not builtin_op or nbytes / itemsize < p:
        return steps + fold[0], steps * nbytes + fold[1]
    return 2 * steps + fold[0], 2 * (p - 1) / p * nbytes + fold[1]


def allgather_time(total_bytes: float, hosts: int, link: Link) -> tuple[float, str]:
    """Seconds of an all-gather that delivers ``total_bytes`` (all ranks' parts) to every
    rank: recursive doubling below MPIR_CVAR_ALLGATHER_LONG_MSG_SIZE on a power of two,
    Bruck below MPIR_CVAR_ALLGATHER_SHORT_MSG_SIZE otherwise, else a ring. Each rank
    receives (P-1)/P of the total in all three; they differ in latency terms."""
    if hosts <= 1 or total_bytes <= 0:
        return 0.0, "none"
    bw = (hosts - 1) / hosts * total_bytes / link.bytes_per_s
    if total_bytes < ALLGATHER_LONG_MSG_SIZE and hosts == _pof2(hosts):
        return math.log2(hosts) * link.latency_s + bw, "recursive doubling"
    if total_bytes < ALLGATHER_SHORT_MSG_SIZE:
        return math.ceil(math.log2(hosts)) * link.latency_s + bw, "bruck"
    return (hosts - 1) * link.latency_s + bw, "ring"


def _bruck_blocks(hosts: int) -> int:
    """Blocks a rank sends in Bruck's all-to-all: at step k those whose index has bit k."""
    return sum(sum(1 for i in range(1, hosts) if i >> k & 1)
               for k in range(math.ceil(math.log2(hosts))))


def alltoall_algorithm(chunk_bytes: float, hosts: int) -> str:
    """MPICH's choice for a non-blocking all-to-all of ``chunk_bytes`` per destination
    (``MPIR_Ialltoall_intra_sched_auto``, not in place): Bruck at most
    MPIR_CVAR_ALLTOALL_SHORT_MSG_SIZE with 8 ranks or more, "scattered" (all sends and
    receives posted, MPIR_CVAR_ALLTOALL_THROTTLE at a time) at most
    MPIR_CVAR_ALLTOALL_MEDIUM_MSG_SIZE, else pairwise exchange (P-1 steps)."""
    if chunk_bytes <= ALLTOALL_SHORT_MSG_SIZE and hosts >= 8:
        return "bruck"
    return "scattered" if chunk_bytes <= ALLTOALL_MEDIUM_MSG_SIZE else "pairwise"


def alltoall_time(chunk_bytes: float, hosts: int, link: Link) -> tuple[float, str]:
    """Seconds of an all-to-all in which every rank sends ``chunk_bytes`` to each other
    rank, and the algorithm: pairwise P-1 messages one after another, ``(P-1)(alpha +
    c/beta)``; scattered the same bytes with the latency paid once per batch of
    MPIR_CVAR_ALLTOALL_THROTTLE; Bruck ceil(log2 P) messages that carry about P/2 blocks
    each (store and forward: more bytes, fewer messages)."""
    if hosts <= 1 or chunk_bytes <= 0:
        return 0.0, "none"
    alg = alltoall_algorithm(chunk_bytes, hosts)
    if alg == "bruck":
        steps = math.ceil(math.log2(hosts))
        return steps * link.latency_s + _bruck_blocks(hosts) * chunk_bytes / \
            link.bytes_per_s, alg
    bw = (hosts - 1) * chunk_bytes / link.bytes_per_s
    if alg == "scattered":
        return math.ceil(hosts / ALLTOALL_THROTTLE) * link.latency_s + bw, alg
    return (hosts - 1) * link.latency_s + bw, alg


def alltoall_sends(chunk_bytes: float, hosts: int) -> tuple[int, float]:
    """(messages, bytes) one rank sends in ``alltoall_time``'s all-to-all."""
    if hosts <= 1 or chunk_bytes <= 0:
        return 0, 0.0
    if alltoall_algorithm(chunk_bytes, hosts) == "bruck":
        return math.ceil(math.log2(hosts)), _bruck_blocks(hosts) * chunk_bytes
    return hosts - 1, (hosts - 1) * chunk_bytes


def reduce_scatter_time(total_bytes: float, hosts: int, link: Link) -> tuple[float, str]:
    """Seconds of a reduce-scatter of ``total_bytes`` per rank (each rank keeps the sum of
    its 1/P part): recursive halving below MPIR_CVAR_REDUCE_SCATTER_COMMUTATIVE_LONG_MSG_SIZE
    on a power of two, else pairwise exchange; each rank sends (P-1)/P of the buffer in
    both, in log2 P or P-1 messages."""
    if hosts <= 1 or total_bytes <= 0:
        return 0.0, "none"
    bw = (hosts - 1) / hosts * total_bytes / link.bytes_per_s
    if total_bytes < REDUCE_SCATTER_LONG_MSG_SIZE and hosts == _pof2(hosts):
        return math.log2(hosts) * link.latency_s + bw, "recursive halving"
    return (hosts - 1) * link.latency_s + bw, "pairwise exchange"


def allgather_sends(part_bytes: float, hosts: int) -> tuple[int, float]:
    """(messages, bytes) one rank sends in ``allgather_time``'s all-gather of ``hosts``
    parts of ``part_bytes``: (P-1) parts in every algorithm, in log2 P, ceil(log2 P) or
    P-1 messages."""
    alg = allgather_time(part_bytes * hosts, hosts, Link(1.0))[1]
    if alg == "none":
        return 0, 0.0
    count = hosts - 1 if alg == "ring" else math.ceil(math.log2(hosts))
    return count, (hosts - 1) * part_bytes


def direct_time(part_bytes: float, hosts: int, link: Link) -> tuple[float, str]:
    """Seconds of an exchange whose P-1 messages of ``part_bytes`` a rank posts at once
    (``distributed/oneround.py``: the fp16 exchange's phases, the overlapped top-k pairs):
    the latency once, ``alpha + (P-1) c/beta``."""
    if hosts <= 1 or part_bytes <= 0:
        return 0.0, "none"
    return link.latency_s + (hosts - 1) * part_bytes / link.bytes_per_s, "direct"


def direct_sends(part_bytes: float, hosts: int) -> tuple[int, float]:
    """(messages, bytes) one rank sends in ``direct_time``'s exchange."""
    if hosts <= 1 or part_bytes <= 0:
        return 0, 0.0
    return hosts - 1, (hosts - 1) * part_bytes
