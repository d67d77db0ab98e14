"""The SimGrid side of ``simulate.py``: a script run by the Python that has SimGrid's
bindings (Debian's ``python3-simgrid``, often not the venv's), reading one JSON job list on
stdin and writing the simulated seconds of each job on stdout. It imports nothing but
SimGrid and the standard library, so that it runs under that other Python.

Input: ``{"platform": {...}, "software_latency_s": a, "jobs": [...]}``; output:
``{"jobs": [{"name", "seconds", "mean_s", ...}], "simgrid": version, "cpus": [the CPUs
it ran on]}``. The platform is a
SimGrid cluster (``flat``: a crossbar of private links; ``fat_tree``; ``torus``) of
``hosts`` hosts, one rank each, every link ``gbits`` Gbit/s each way and ``hop_latency_s``
per link crossed. A job is ``{"name", "kind", ...}``; the kinds:

- ``spmd``: every rank runs ``ops`` in order: ``["compute", s]`` (busy s seconds),
  ``["at", s]`` (wait until s after the job's start), ``["allreduce", bytes, algorithm]``
  (``recursive_doubling``, ``rabenseifner``, ``ring``), ``["direct", part_bytes]`` (a part
  to every other rank, all posted at once), ``["allgather_ring", part_bytes]``,
  ``["bcast", bytes]`` (binomial tree from rank 0), ``["reduce_scatter", bytes,
  algorithm]`` (``recursive_halving``, ``pairwise``), ``["allgather", part_bytes,
  algorithm]`` (``recursive_doubling``, ``bruck``, ``ring``), ``["behind", steps,
  compute_s, bytes, algorithm]`` (steps whose all-reduce runs while the next step computes);
- ``master``: rank 0 answers ``rounds`` x (hosts-1) requests of ``bytes`` with ``bytes``;
  each worker computes ``work_s`` then asks, ``rounds`` times; ``steady_s``: a worker's
  mean seconds over the rounds after the first ``skip`` (all workers start at once, so the
  first rounds queue at the master more than the steady state does);
- ``push``: ``steps`` steps of ``compute_s``; after each, with probability ``p`` (a seeded
  draw), a rank sends ``bytes`` to a random peer without waiting for it (it waits for its
  previous push first); ``steady_s`` as for ``master``, over the steps after ``skip``.

``"cpu"`` (optional): the CPU every thread of the replay is held on (SimGrid's Python
actors are OS threads, one running at a time).

Every round of messages a rank starts costs it ``software_latency_s`` first (the per
message work of the host's stack: the alpha of the analytic model less the wire's), then
the messages go as SimGrid flows (mailbox put/get: a message moves once both ends posted
it). Jobs run one after the other, separated by a barrier of every rank; a job's seconds
are the last rank's end less the common start.
"""
import json
import os
import random
import sys

import simgrid
from simgrid import Actor, Barrier, Comm, Engine, Mailbox, this_actor

# Messages a rank posts at once in a "direct" exchange are compacted to at most this many
# (same bytes in all, peers spread evenly over the ranks): 1,024 ranks x 1,023 messages
# would be a million flows where a few thousand give the same link loads.
DIRECT_PEERS = 16


def _fat_tree_params(hosts):
    """Two levels: leaves of h hosts (h the largest divisor of ``hosts`` at most its
    square root), h spines, every leaf one link up to each spine: full bisection."""
    h = max(d for d in range(1, int(hosts ** 0.5) + 1) if hosts % d == 0)
    return f"2;{h},{hosts // h};1,{h};1,1"


def platform_xml(p):
    """SimGrid platform XML of the cluster ``p`` describes."""
    hosts, bw, lat = int(p["hosts"]), f"{p['gbits']}Gbps", f"{p['hop_latency_s']}s"
    topo = p["topology"]
    extra = ""
    if topo == "fat_tree":
        extra = f' topology="FAT_TREE" topo_parameters="{_fat_tree_params(hosts)}"'
    elif topo == "torus":
        dims = ",".join(str(d) for d in p["torus_dims"])
        extra = f' topology="TORUS" topo_parameters="{dims}"'
    elif topo != "flat":
        raise ValueError(f"topology {topo!r}: flat, fat_tree or torus")
    return ("<?xml version='1.0'?>\n<!DOCTYPE platform SYSTEM "
            "\"https://simgrid.org/simgrid.dtd\">\n<platform version=\"4.1\">\n"
            f"<cluster id=\"c\" prefix=\"h\" suffix=\"\" radical=\"0-{hosts - 1}\" "
            f"speed=\"1Gf\" bw=\"{bw}\" lat=\"{lat}\" sharing_policy=\"SPLITDUPLEX\""
            f"{extra}/>\n</platform>\n")


def _torus_offsets(dims, k):
    """``k`` displacements on the torus of ``dims`` standing for all the others in a
    "direct" exchange: in each dimension the displacements spread evenly over the ring
    (as those of all the other ranks do, which is what loads its links), each dimension
    in another order; none the rank itself."""
    out = []
    for i in range(k):
        vec = tuple((((i * (2 * j + 1)) + j) % k) * d // k for j, d in enumerate(dims))
        if any(vec):
            out.append(vec)
    return out


_MAILBOXES = {}


def mailbox(name):
    """SimGrid's mailbox ``name``, looked up once: ``Mailbox.by_name`` is a simcall (from an
    actor, a hand-over to SimGrid's maestro thread and back), which a rank's every message
    would otherwise pay on each end."""
    box = _MAILBOXES.get(name)
    if box is None:
        box = _MAILBOXES[name] = Mailbox.by_name(name)
    return box


class Asymmetric(Exception):
    """A collective whose rounds are not the same for every rank at the same instant:
    the rounds replay cannot stand for it (the ranks replay then runs it)."""


class Rank:
    """One rank's point-to-point layer: a mailbox per (sender, receiver) pair, so that the
    messages between two ranks match in the order they were posted; ``dims``: the torus
    it sits on (None: a full-bisection network). Each collective is a generator of its
    rounds, ``(sends [(peer, bytes)], recvs [peer])``, which both replays play: the ranks
    replay one rank's rounds in its own actor, the rounds replay every rank's round k at
    once (``RoundsReplay``)."""

    def __init__(self, me, size, alpha, dims=None):
        self.me, self.size, self.alpha, self.dims = me, size, alpha, dims

    def _moved(self, vec, sign):
        """The rank ``sign`` * ``vec`` away on the torus (dimension 0 the fastest)."""
        rank, radix, rest = 0, 1, self.me
        for d, v in zip(self.dims, vec):
            rank += (rest % d + sign * v) % d * radix
            rest //= d
            radix *= d
        return rank

    @staticmethod
    def box(src, dst):
        return mailbox(f"{src}>{dst}")

    def round(self, sends, recvs):
        """One round: ``sends`` [(peer, bytes)] and ``recvs`` [peer] posted at once, waited
        for together; the stack's latency once before."""
        if not sends and not recvs:
            return
        if self.alpha > 0:
            this_actor.sleep_for(self.alpha)
        comms = [self.box(self.me, peer).put_async(None, max(1, int(nbytes)))
                 for peer, nbytes in sends]
        # the receive's data holder must outlive the wait (SimGrid writes into it)
        gets = [self.box(peer, self.me).get_async() for peer in recvs]
        Comm.wait_all(comms + [g[0] for g in gets])

    def play(self, op):
        """The ranks replay of one collective op: this rank's rounds one after the other."""
        for sends, recvs in self.rounds(op):
            self.round(sends, recvs)

    def rounds(self, op):
        """This rank's rounds of the collective ``op`` (``["allreduce", bytes,
        algorithm]``, ``["direct", part]``, ``["allgather_ring", part]``, ``["bcast",
        bytes]``)."""
        kind = op[0]
        if kind == "allreduce":
            return getattr(self, f"allreduce_{op[2]}")(op[1])
        if kind in ("direct", "allgather_ring", "bcast"):
            return getattr(self, kind)(op[1])
        if kind in ("reduce_scatter", "allgather"):
            return getattr(self, f"{kind}_{op[2]}")(op[1])
        raise ValueError(f"unknown op {kind!r}")

    # MPICH's all-reduce algorithms (src/mpi/coll/allreduce), the data left out

    def _fold(self, nbytes):
        """A P that is not a power of two: the first 2*(P-p') ranks pair up, the even one
        hands its buffer to the odd one and sits out (-1); returns the rank in the p' group."""
        p = 1 << (self.size.bit_length() - 1)
        rem = self.size - p
        if self.me < 2 * rem:
            if self.me % 2 == 0:
                yield [(self.me + 1, nbytes)], []
                return p, -1
            yield [], [self.me - 1]
            return p, self.me // 2
        return p, self.me - rem

    def _unfold(self, p, nbytes):
        rem = self.size - p
        if self.me < 2 * rem:
            if self.me % 2 == 0:
                yield [], [self.me + 1]
            else:
                yield [(self.me - 1, nbytes)], []

    def _real(self, newrank, p):
        rem = self.size - p
        return newrank * 2 + 1 if newrank < rem else newrank + rem

    def _exchange(self, peer, nbytes):
        return [(peer, nbytes)], [peer]

    def allreduce_recursive_doubling(self, nbytes):
        p, new = yield from self._fold(nbytes)
        if new >= 0:
            mask = 1
            while mask < p:
                yield self._exchange(self._real(new ^ mask, p), nbytes)
                mask <<= 1
        yield from self._unfold(p, nbytes)

    def allreduce_rabenseifner(self, nbytes):
        """Reduce-scatter by recursive halving (halves of the buffer, the nearest partner
        first), then all-gather by recursive doubling back up."""
        p, new = yield from self._fold(nbytes)
        if new >= 0:
            part, mask, sizes = nbytes, 1, []
            while mask < p:
                part /= 2
                sizes.append(part)
                yield self._exchange(self._real(new ^ mask, p), part)
                mask <<= 1
            mask >>= 1
            for part in reversed(sizes):
                yield self._exchange(self._real(new ^ mask, p), part)
                mask >>= 1
        yield from self._unfold(p, nbytes)

    def allreduce_ring(self, nbytes):
        """Reduce-scatter then all-gather around the ring: 2(P-1) rounds of n/P."""
        nxt, prv = (self.me + 1) % self.size, (self.me - 1) % self.size
        for _ in range(2 * (self.size - 1)):
            yield [(nxt, nbytes / self.size)], [prv]

    # MPICH's reduce-scatter (src/mpi/coll/reduce_scatter) and all-gather (allgather), the
    # data left out: --shard's layer slices and parameters

    def reduce_scatter_recursive_halving(self, nbytes):
        """A power of two: halves of the buffer, the nearest partner first (as the
        reduce-scatter half of rabenseifner), log2 P rounds."""
        part, mask = nbytes, 1
        while mask < self.size:
            part /= 2
            yield self._exchange(self.me ^ mask, part)
            mask <<= 1

    def reduce_scatter_pairwise(self, nbytes):
        """P-1 rounds: round i sends the part of rank me+i and receives from me-i."""
        for i in range(1, self.size):
            yield [((self.me + i) % self.size, nbytes / self.size)], [(self.me - i) % self.size]

    def allgather_recursive_doubling(self, part):
        """A power of two: the partner at distance 1, 2, 4 ... gets all parts gathered so
        far (1, 2, 4 ... parts)."""
        mask = 1
        while mask < self.size:
            yield self._exchange(self.me ^ mask, part * mask)
            mask <<= 1

    def allgather_bruck(self, part):
        """ceil(log2 P) rounds: round k sends min(2^k, P - 2^k) parts to rank me - 2^k and
        receives as many from me + 2^k."""
        k = 1
        while k < self.size:
            yield ([((self.me - k) % self.size, part * min(k, self.size - k))],
                   [(self.me + k) % self.size])
            k <<= 1

    def allgather_ring(self, part):
        nxt, prv = (self.me + 1) % self.size, (self.me - 1) % self.size
        for _ in range(self.size - 1):
            yield [(nxt, part)], [prv]

    def bcast(self, nbytes):
        """Binomial tree from rank 0 (MPICH's short-message broadcast)."""
        mask = 1
        while mask < self.size:
            if self.me & mask:
                yield [], [self.me - mask]
                break
            mask <<= 1
        mask >>= 1
        while mask > 0:
            if self.me + mask < self.size:
                yield [(self.me + mask, nbytes)], []
            mask >>= 1

    def direct(self, part):
        """A part to every other rank and one from each, all posted at once."""
        others = self.size - 1
        if others <= 0:
            return
        k = min(others, DIRECT_PEERS)
        if self.dims is not None and others > k:
            vecs = _torus_offsets(self.dims, k)
            scale = others / len(vecs)
            yield ([(self._moved(v, 1), part * scale) for v in vecs],
                   [self._moved(v, -1) for v in vecs])
            return
        offsets = sorted({1 + j * others // k for j in range(k)})
        scale = others / len(offsets)
        yield ([((self.me + o) % self.size, part * scale) for o in offsets],
               [(self.me - o) % self.size for o in offsets])


COLLECTIVES = ("allreduce", "direct", "allgather_ring", "bcast", "reduce_scatter", "allgather")


def _spmd(rank, job, t0):
    for op in job["ops"]:
        kind = op[0]
        if kind == "compute":
            this_actor.sleep_for(op[1])
        elif kind == "at":
            if Engine.clock < t0 + op[1]:
                this_actor.sleep_until(t0 + op[1])
        elif kind in COLLECTIVES:
            rank.play(op)
        elif kind == "behind":
            _behind(rank, *op[1:])
        else:
            raise ValueError(f"unknown op {kind!r}")


def _behind(rank, steps, compute_s, nbytes, algorithm):
    """Each step's all-reduce runs in a second actor on the rank's host while the next
    step computes; a step waits for the one before it to finish first."""
    comm = None
    for _ in range(int(steps)):
        this_actor.sleep_for(compute_s)
        if comm is not None:
            comm.join()
        comm = Actor.create(f"ar{rank.me}", this_actor.get_host(),
                            rank.play, ["allreduce", nbytes, algorithm])
    if comm is not None:
        comm.join()


def _master(rank, job, marks):
    """The master receives one request at a time (it probes, then receives that one) and
    answers each with a send it does not wait for (rules/_p2p.py ``serve_clients``)."""
    n, box = job["bytes"], mailbox("to-master")
    if rank.me == 0:
        replies = []
        for _ in range(job["rounds"] * (rank.size - 1)):
            worker = box.get()
            this_actor.sleep_for(rank.alpha)
            replies.append(rank.box(0, worker).put_async(None, max(1, int(n))))
        Comm.wait_all(replies)
        return
    for r in range(job["rounds"]):
        if r == job.get("skip", 0):
            marks[rank.me] = Engine.clock
        this_actor.sleep_for(job["work_s"])
        this_actor.sleep_for(rank.alpha)
        box.put(rank.me, max(1, int(n)))
        rank.box(0, rank.me).get()


def _push(rank, job, draws, marks):
    pending = None
    for step in range(job["steps"]):
        if step == job.get("skip", 0):
            marks[rank.me] = Engine.clock
        this_actor.sleep_for(job["compute_s"])
        if draws[step] >= job["p"]:
            continue
        if pending is not None:
            pending.wait()
        peer = (rank.me + 1 + int(draws[step] / job["p"] * (rank.size - 1))) % rank.size
        this_actor.sleep_for(rank.alpha)
        # the peer's inbox has it as permanent receiver: the push moves without a get
        pending = mailbox(f"push>{peer}").put_async(None, max(1, int(job["bytes"])))
    if pending is not None:
        pending.wait()


class RoundsReplay:
    """The rounds replay of ``spmd`` jobs: one actor posts every rank's messages of a
    round at once as host-to-host flows and waits for them all, round after round.

    It stands for the ranks replay exactly where every round is *symmetric*: all ranks
    have the same number of rounds, each rank's round k sends and receives something,
    the receives of round k are the sends of round k, and all the round's flows end at
    the same instant. Then, by induction over the rounds, every rank starts round k at
    the same instant T_k (the job starts after a barrier and ``compute``/``at`` are the
    same on every rank), pays the stack's latency, and posts its messages at T_k + alpha;
    in the ranks replay each message moves once both ends posted it, at that instant
    too, on a network that the round before left empty: the same flows from the same
    instant as here, so the same ends, and every rank's round ends at T_k + alpha + d_k.
    The round's duration d_k then depends only on its flows (the network is empty at its
    start): a round that sends the same flows again (Rabenseifner's all-gather repeats
    its reduce-scatter's partners and bytes, backwards; fp16's two phases; another
    configuration's identical bucket) is not replayed again. A round whose flows do not
    end together (a fold for a P that is not a power of two, a torus whose dimensions
    the pattern does not divide, a fat tree's shared uplinks) raises ``Asymmetric`` and
    its job goes to the ranks replay."""

    def __init__(self, hosts, size, alpha, dims, tolerance=1e-9):
        self.hosts, self.size, self.alpha, self.dims = hosts, size, alpha, dims
        self.tolerance = tolerance
        self.rounds_cache, self.ops_cache = {}, {}
        self.played = self.reused = 0

    def _flows(self, seqs, k):
        flows, wanted = [], []
        for me, seq in enumerate(seqs):
            sends, recvs = seq[k]
            if not sends and not recvs:
                raise Asymmetric(f"rank {me} sits out round {k}")
            flows += [(me, peer, max(1, int(nbytes))) for peer, nbytes in sends]
            wanted += [(peer, me) for peer in recvs]
        if sorted(wanted) != sorted((s, d) for s, d, _ in flows):
            raise Asymmetric(f"round {k}'s receives are not its sends")
        return tuple(flows)

    def _play(self, flows):
        """The round's duration: from the posting to the last rank's end (a rank's round
        ends once all its messages, sent and received, have)."""
        t0 = Engine.clock
        comms = [Comm.sendto_async(self.hosts[s], self.hosts[d], b) for s, d, b in flows]
        Comm.wait_all(comms)
        ends = [t0] * self.size
        for (s, d, _), comm in zip(flows, comms):
            t = comm.finish_time
            ends[s], ends[d] = max(ends[s], t), max(ends[d], t)
        first, last = min(ends) - t0, max(ends) - t0
        if last - first > self.tolerance * last:
            raise Asymmetric(f"the ranks' round ends from {first:.9g} to {last:.9g} s")
        return last

    def collective_s(self, op):
        key = tuple(op)
        if key not in self.ops_cache:
            ranks = [Rank(me, self.size, self.alpha, self.dims) for me in range(self.size)]
            seqs = [list(r.rounds(op)) for r in ranks]
            if len({len(s) for s in seqs}) != 1:
                raise Asymmetric("ranks have different numbers of rounds")
            total = 0.0
            for k in range(len(seqs[0])):
                flows = self._flows(seqs, k)
                if flows not in self.rounds_cache:
                    self.rounds_cache[flows] = self._play(flows)
                    self.played += 1
                else:
                    self.reused += 1
                total += self.alpha + self.rounds_cache[flows]
            self.ops_cache[key] = total
        return self.ops_cache[key]

    def job_s(self, job):
        """A job's seconds: every rank in step, so one timeline stands for all."""
        t = 0.0
        for op in job["ops"]:
            kind = op[0]
            if kind == "compute":
                t += op[1]
            elif kind == "at":
                t = max(t, op[1])
            elif kind in COLLECTIVES:
                t += self.collective_s(op)
            elif kind == "behind":  # steps, compute_s, bytes, algorithm
                ar, done = self.collective_s(["allreduce", op[3], op[4]]), None
                for _ in range(int(op[1])):
                    t += op[2]
                    if done is not None:
                        t = max(t, done)
                    done = t + ar
                t = t if done is None else done
            else:
                raise ValueError(f"unknown op {kind!r}")
        return t


def _rounds_main(spec, e, all_hosts, dims):
    """Replay the ``spmd`` jobs round by round (``RoundsReplay``); the others, and those
    whose rounds are not symmetric, come back as ``{"name", "fallback": why}``."""
    jobs, out = spec["jobs"], []
    replay = RoundsReplay(all_hosts, len(all_hosts), spec["software_latency_s"], dims)

    def driver():
        for job in jobs:
            if job["kind"] != "spmd":
                out.append({"name": job["name"], "fallback": f"a {job['kind']} job"})
                continue
            try:
                t = replay.job_s(job)
            except Asymmetric as exc:
                out.append({"name": job["name"], "fallback": str(exc)})
                continue
            out.append({"name": job["name"], "seconds": t, "mean_s": t,
                        "replay": "rounds"})

    Actor.create("rounds", all_hosts[0], driver)
    e.run()
    return out, {"rounds_played": replay.played, "rounds_reused": replay.reused}


def _hold_on(cpu):
    """Keep this process's threads (one an actor, created after this) on ``cpu``: SimGrid's
    thread contexts run one actor at a time and pass control by a futex, which costs
    several times more when the next thread wakes on another core."""
    if cpu is None or not hasattr(os, "sched_setaffinity"):
        return
    try:
        os.sched_setaffinity(0, {int(cpu)})
    except OSError:  # a CPU this process may not use: left where the OS puts it
        pass


def main():
    spec = json.load(sys.stdin)
    _hold_on(spec.get("cpu"))
    p = spec["platform"]
    hosts = int(p["hosts"])
    path = spec["platform_file"]
    with open(path, "w") as f:
        f.write(platform_xml(p))
    e = Engine(["sgreplay", "--log=root.thres:critical",
                "--cfg=network/model:CM02", "--cfg=network/crosstraffic:0",
                "--cfg=network/TCP-gamma:1e15", "--cfg=contexts/factory:thread"])
    e.load_platform(path)
    all_hosts = sorted(e.all_hosts, key=lambda h: int(h.name[1:]))
    dims = tuple(p["torus_dims"]) if p["topology"] == "torus" else None
    about = {"simgrid": getattr(simgrid, "simgrid_version", None),
               "cpus": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
               else None}
    if spec.get("replay", "ranks") == "rounds":
        out, counts = _rounds_main(spec, e, all_hosts, dims)
        json.dump({"jobs": out, **about, **counts}, sys.stdout)
        return
    jobs, barrier = spec["jobs"], Barrier(hosts)
    ends = [[0.0] * hosts for _ in jobs]
    marks = [[None] * hosts for _ in jobs]  # a rank's time once its ``skip`` rounds ended
    starts, finished = [0.0] * len(jobs), [0] * len(jobs)
    for job in jobs:  # a push job's draws: one seeded stream, a row per rank
        if job["kind"] == "push":
            rng = random.Random(job.get("seed", 0))
            job["_draws"] = [[rng.random() for _ in range(job["steps"])] for _ in range(hosts)]

    def actor(me):
        rank = Rank(me, hosts, spec["software_latency_s"], dims)
        mailbox(f"push>{me}").set_receiver(Actor.self())
        for j, job in enumerate(jobs):
            barrier.wait()
            t0 = Engine.clock
            starts[j] = t0
            if job["kind"] == "spmd":
                _spmd(rank, job, t0)
            elif job["kind"] == "master":
                _master(rank, job, marks[j])
            elif job["kind"] == "push":
                _push(rank, job, job["_draws"][me], marks[j])
            else:
                raise ValueError(f"unknown job kind {job['kind']!r}")
            ends[j][me] = Engine.clock
            finished[j] += 1

    for me, host in enumerate(all_hosts):
        Actor.create(f"rank{me}", host, actor, me)
    e.run()
    stuck = [job["name"] for j, job in enumerate(jobs) if finished[j] != hosts]
    if stuck:  # a rank waits for a message nobody sends: a bug of the replay, not a time
        sys.exit(f"sgreplay: ranks never finished job {stuck[0]!r} (a deadlock)")
    out = []
    for j, job in enumerate(jobs):
        res = {"name": job["name"], "seconds": max(ends[j]) - starts[j],
               "mean_s": sum(ends[j]) / hosts - starts[j], "replay": "ranks"}
        steady = [e - m for e, m in zip(ends[j], marks[j]) if m is not None]
        if steady:  # after the first rounds, in which every rank starts at once
            res["steady_s"] = sum(steady) / len(steady)
        out.append(res)
    json.dump({"jobs": out, **about}, sys.stdout)


if __name__ == "__main__":
    main()
