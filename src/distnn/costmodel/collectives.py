"""What MPICH's collectives cost on N hosts x 1 rank joined by links of one latency and
bandwidth (the alpha-beta model): the all-reduce, all-gather and all-to-all algorithms its
automatic choice picks by size, with its default thresholds. Used by ``costmodel``;
equations and what they leave out: docs/costmodel.md.

    allreduce_time(4 << 20, 8, Link(gbits=10))  # (seconds, "reduce-scatter + all-gather")
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

# MPICH's defaults (src/mpi/coll/allreduce, allgather, ialltoall: MPI_T cvars of the same
# names; ``mpivars`` of the mpich wheel lists them).
ALLREDUCE_SHORT_MSG_SIZE = 2048      # MPIR_CVAR_ALLREDUCE_SHORT_MSG_SIZE
ALLGATHER_SHORT_MSG_SIZE = 81920     # MPIR_CVAR_ALLGATHER_SHORT_MSG_SIZE
ALLGATHER_LONG_MSG_SIZE = 524288     # MPIR_CVAR_ALLGATHER_LONG_MSG_SIZE
ALLTOALL_SHORT_MSG_SIZE = 256        # MPIR_CVAR_ALLTOALL_SHORT_MSG_SIZE (per destination)
ALLTOALL_MEDIUM_MSG_SIZE = 32768     # MPIR_CVAR_ALLTOALL_MEDIUM_MSG_SIZE (per destination)
ALLTOALL_THROTTLE = 32               # MPIR_CVAR_ALLTOALL_THROTTLE
REDUCE_SCATTER_LONG_MSG_SIZE = 524288  # MPIR_CVAR_REDUCE_SCATTER_COMMUTATIVE_LONG_MSG_SIZE


TOPOLOGIES = ("fat_tree", "torus", "flat")


@dataclass(frozen=True)
class Link:
    """One host's link: ``gbits`` Gbit/s each way, ``latency_s`` per message (alpha) to a
    neighbour. ``topology``: a full-bisection network (``fat_tree``, ``flat``: a message
    crosses the sender's link and the receiver's, whatever the pair) or a ``torus``
    (``torus_dims``): a message crosses one link per hop, ``hop_s`` each (alpha holds two:
    a neighbour's message is ``alpha - hop_s``), and a link carries every message routed
    over it. ``burst_bytes``: a token bucket's depth in front of the link (tc's tbf
    ``burst``, as the emulated cluster shapes its links; 0 for a real link): after a pause
    that long at the link's rate, that many bytes a rank sends pass at once, not at
    ``gbits`` (their cost is then the host's: the exchange's CPU term)."""
    gbits: float
    latency_s: float = 50e-6
    topology: str = "fat_tree"
    hop_s: float = 0.0
    burst_bytes: float = 0.0

    def __post_init__(self):
        if not self.gbits > 0:
            raise ValueError(f"link gbits must be > 0, got {self.gbits!r}")
        if not self.latency_s >= 0:
            raise ValueError(f"link latency_s must be >= 0, got {self.latency_s!r}")
        if self.topology not in TOPOLOGIES:
            raise ValueError(f"link topology: {self.topology!r} is not one of "
                             f"{', '.join(TOPOLOGIES)}")
        if not self.hop_s >= 0:
            raise ValueError(f"link hop_s must be >= 0, got {self.hop_s!r}")
        if not self.burst_bytes >= 0:
            raise ValueError(f"link burst_bytes must be >= 0, got {self.burst_bytes!r}")

    @property
    def bytes_per_s(self) -> float:
        return self.gbits * 1e9 / 8

    def send(self, nbytes: float) -> float:
        """alpha + n / beta: one message of ``nbytes``."""
        return self.latency_s + nbytes / self.bytes_per_s

    def burst_credit(self, idle_s: float) -> float:
        """Bytes the token bucket holds after ``idle_s`` seconds with nothing sent."""
        return min(self.burst_bytes, max(0.0, idle_s) * self.bytes_per_s)


def _pof2(p: int) -> int:
    return 1 << (p.bit_length() - 1)


# The torus: SimGrid's TORUS cluster (what ``simulate`` replays on). Rank r sits at the
# mixed-radix coordinates of r (dimension 0 the fastest); a message goes dimension by
# dimension, lowest first, each the shorter way round (SimGrid's TorusZone routing, its
# tie at half a ring included); one link each way between neighbours of a dimension.


def torus_dims(hosts: int) -> tuple[int, ...]:
    """Near-equal dimensions whose product is ``hosts``: 3-D from 64 hosts, else 2-D
    (the prime factors, largest first, each to the smallest dimension so far); the
    simulator's torus is built with these (``simulate`` passes them to ``sgreplay``)."""
    dims = [1, 1, 1] if hosts >= 64 else [1, 1]
    n, f, primes = hosts, 2, []
    while n > 1:
        while n % f == 0:
            primes.append(f)
            n //= f
        f += 1
    for q in sorted(primes, reverse=True):
        dims[dims.index(min(dims))] *= q
    return tuple(sorted(dims))


def _forward(a: int, b: int, d: int) -> bool:
    """Whether the route from coordinate ``a`` to ``b`` in a ring of ``d`` goes up."""
    return (a < b <= a + d // 2) or (a > d // 2 and (a + d // 2) % d >= b)


def _ring_links(a: int, b: int, d: int) -> list[tuple[int, int]]:
    """The links (position, +1 or -1) a route from ``a`` to ``b`` crosses in a ring."""
    out, step = [], 1 if _forward(a, b, d) else -1
    while a != b:
        out.append((a, step))
        a = (a + step) % d
    return out


def torus_round(pairs: tuple[tuple[int, int], ...], hosts: int) -> tuple[int, int]:
    """(messages on the busiest link, links the longest route crosses) of one round in
    which every (src, dst) of ``pairs`` sends a message at once on the torus of
    ``hosts``: under max-min sharing the round's bytes take that many times a lone
    message's."""
    dims = torus_dims(hosts)
    load: dict = {}
    longest = 0
    for src, dst in pairs:
        cur, hops, radix = list(_coords(src, dims)), 0, 1
        target = _coords(dst, dims)
        for j, d in enumerate(dims):
            for pos, step in _ring_links(cur[j], target[j], d):
                cur[j] = pos
                key = (tuple(cur), j, step)
                load[key] = load.get(key, 0) + 1
                hops += 1
            cur[j] = target[j]
            radix *= d
        longest = max(longest, hops)
    return max(load.values(), default=0), longest


def _coords(rank: int, dims) -> tuple[int, ...]:
    out = []
    for d in dims:
        out.append(rank % d)
        rank //= d
    return tuple(out)


@lru_cache(maxsize=None)
def _doubling_round(hosts: int, mask: int) -> tuple[int, int]:
    """``torus_round`` of the recursive doubling (halving) round of ``mask`` over the p'
    ranks that stay after MPICH's fold."""
    p = _pof2(hosts)
    rem = hosts - p

    def real(new):
        return new * 2 + 1 if new < rem else new + rem
    return torus_round(tuple((real(r), real(r ^ mask)) for r in range(p)), hosts)


@lru_cache(maxsize=None)
def _fold_round(hosts: int) -> tuple[int, int]:
    p = _pof2(hosts)
    return torus_round(tuple((2 * r, 2 * r + 1) for r in range(hosts - p)), hosts)


@lru_cache(maxsize=None)
def torus_all_to_all(hosts: int) -> tuple[float, int]:
    """(messages on the busiest link, links the longest route crosses) when every rank
    sends one message to every other at once: by the torus's symmetry a link of
    dimension j at ring position x carries P/d_j times the (a, b) routes of its ring
    that cross it (the other coordinates of source and destination free)."""
    dims = torus_dims(hosts)
    busiest = 0.0
    for d in dims:
        count: dict = {}
        for a in range(d):
            for b in range(d):
                for key in _ring_links(a, b, d):
                    count[key] = count.get(key, 0) + 1
        busiest = max(busiest, hosts / d * max(count.values(), default=0))
    return busiest, sum(d // 2 for d in dims)


def _round_time(nbytes: float, link: Link, round_: tuple[int, int] | None) -> float:
    """One message of ``nbytes`` (alpha + n / beta), on a torus in a round whose busiest
    link carries ``round_[0]`` messages and whose longest route crosses ``round_[1]``."""
    if round_ is None:
        return link.send(nbytes)
    shared, hops = round_
    return (link.latency_s + (hops - 2) * link.hop_s +
            max(1, shared) * nbytes / link.bytes_per_s)


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
    if link.topology == "torus":
        return _torus_allreduce(nbytes, hosts, link, itemsize, builtin_op)
    fold = 2 * link.send(nbytes) if hosts != p else 0.0
    if nbytes <= ALLREDUCE_SHORT_MSG_SIZE or not builtin_op or nbytes / itemsize < p:
        return steps * link.send(nbytes) + fold, "recursive doubling"
    t = 2 * steps * link.latency_s + 2 * (p - 1) / p * nbytes / link.bytes_per_s
    return t + fold, "reduce-scatter + all-gather"


def _torus_allreduce(nbytes, hosts, link, itemsize, builtin_op) -> tuple[float, str]:
    """``allreduce_time`` on a torus: each round of recursive doubling (halving) is
    ``_round_time`` of its partners' routes (rank XOR 2^k: 2^k apart, many links and
    links shared between pairs once 2^k spans a dimension)."""
    p = _pof2(hosts)
    masks = [1 << k for k in range(p.bit_length() - 1)]
    fold = 2 * _round_time(nbytes, link, _fold_round(hosts)) if hosts != p else 0.0
    if nbytes <= ALLREDUCE_SHORT_MSG_SIZE or not builtin_op or nbytes / itemsize < p:
        return sum(_round_time(nbytes, link, _doubling_round(hosts, m))
                   for m in masks) + fold, "recursive doubling"
    # halving: the nearest partner first with half the buffer, then back up
    t = sum(2 * _round_time(nbytes / (2 * m), link, _doubling_round(hosts, m))
            for m in masks)
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
    if link.topology == "torus":  # the busiest link's messages, not the rank's P-1
        return _round_time(part_bytes, link, torus_all_to_all(hosts)), "direct"
    return link.latency_s + (hosts - 1) * part_bytes / link.bytes_per_s, "direct"


def direct_sends(part_bytes: float, hosts: int) -> tuple[int, float]:
    """(messages, bytes) one rank sends in ``direct_time``'s exchange."""
    if hosts <= 1 or part_bytes <= 0:
        return 0, 0.0
    return hosts - 1, (hosts - 1) * part_bytes


def master_pickup_s(gap_s: float, max_sleep: float, min_sleep: float = 1e-4,
                    overshoot_s: float = 0.0) -> float:
    """How long a message waits for an idle master rule to notice it (rules/_p2p.py's
    ``serve_clients``), ``gap_s`` seconds after the master last found work.

    The master's polls sleep between them (``coordination.Backoff``): ``min_sleep``,
    doubling up to ``max_sleep``, each sleep taking ``overshoot_s`` longer than asked (the
    machine's timer, measured). A message that arrives during a sleep is not seen by the
    first poll after it: that poll's ``iprobe`` moves it in from the transport, the next
    poll's finds it (measured on the emulated cluster: a 4-byte exchange 4 ms after the
    last one takes 3.8 ms with the rule's 2 ms sleeps, 0.18 ms with 10 us sleeps; two
    exchanges back to back 0.47 ms). So the wait is from the arrival to the second wake
    after it."""
    if gap_s < 0 or not max_sleep > 0:
        return 0.0
    t, delay, seen = 0.0, min(min_sleep, max_sleep), 0
    while True:
        t += delay + overshoot_s
        delay = min(delay * 2, max_sleep)
        if t > gap_s:
            seen += 1
            if seen == 2:
                return t - gap_s
