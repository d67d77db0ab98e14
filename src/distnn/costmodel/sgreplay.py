"""The SimGrid side of ``simulate.py``: a script run by the Python that has SimGrid's
bindings (Debian's ``python3-simgrid``, often not the venv's), reading one JSON job list on
stdin and writing the simulated seconds of each job on stdout. It imports nothing but
SimGrid and the standard library, so that it runs under that other Python.

Input: ``{"platform": {...}, "software_latency_s": a, "jobs": [...]}``. The platform is a
SimGrid cluster (``flat``: a crossbar of private links; ``fat_tree``; ``torus``) of
``hosts`` hosts, one rank each, every link ``gbits`` Gbit/s each way and ``hop_latency_s``
per link crossed. A job is ``{"name", "kind", ...}``; the kinds:

- ``spmd``: every rank runs ``ops`` in order: ``["compute", s]`` (busy s seconds),
  ``["at", s]`` (wait until s after the job's start), ``["allreduce", bytes, algorithm]``
  (``recursive_doubling``, ``rabenseifner``, ``ring``), ``["direct", part_bytes]`` (a part
  to every other rank, all posted at once), ``["allgather_ring", part_bytes]``,
  ``["bcast", bytes]`` (binomial tree from rank 0), ``["behind", steps, compute_s, bytes,
  algorithm]`` (steps whose all-reduce runs while the next step computes);
- ``master``: rank 0 answers ``rounds`` x (hosts-1) requests of ``bytes`` with ``bytes``;
  each worker computes ``work_s`` then asks, ``rounds`` times; ``steady_s``: a worker's
  mean seconds over the rounds after the first ``skip`` (all workers start at once, so the
  first rounds queue at the master more than the steady state does);
- ``push``: ``steps`` steps of ``compute_s``; after each, with probability ``p`` (a seeded
  draw), a rank sends ``bytes`` to a random peer without waiting for it (it waits for its
  previous push first); ``steady_s`` as for ``master``, over the steps after ``skip``.

Every round of messages a rank starts costs it ``software_latency_s`` first (the per
message work of the host's stack: the alpha of the analytic model less the wire's), then
the messages go as SimGrid flows (a message moves once both ends posted it, matched per
pair of ranks in the order posted, as MPI and SimGrid's mailboxes match them). Jobs run
one after the other, separated by a barrier of every rank; a job's seconds are the last
rank's end less the common start.

One SimGrid actor runs every rank (``Driver``): a rank's program is a Python generator
that yields what it waits for (a time, message ends, a sub-program), its messages are
host-to-host flows (``Comm.sendto_async``); SimGrid's Python actors are an OS thread each,
and switching among a thousand of them cost more than the simulation itself.
"""
import heapq
import json
import random
import sys

import simgrid
from simgrid import Actor, Comm, Engine, this_actor

# Messages a rank posts at once in a "direct" exchange are compacted to at most this many
# (same bytes in all, peers spread evenly over the ranks): 1,024 ranks x 1,023 messages
# would be a million flows where a few thousand give the same link loads.
DIRECT_PEERS = 16


def _fat_tree_params(hosts):
    """Two levels: leaves of h hosts (h the largest divisor of ``hosts`` at most its
    square root), h spines, every leaf one link up to each spine: full bisection."""
    h = max(d for d in range(1, int(hosts ** 0.5) + 1) if hosts % d == 0)
    return f"2;{h},{hosts // h};1,{h};1,1"


def _torus_dims(hosts):
    """Near-equal dimensions whose product is ``hosts``: 3-D from 64 hosts, else 2-D
    (the prime factors, largest first, each to the smallest dimension so far)."""
    dims = [1, 1, 1] if hosts >= 64 else [1, 1]
    n, f, primes = hosts, 2, []
    while n > 1:
        while n % f == 0:
            primes.append(f)
            n //= f
        f += 1
    for q in sorted(primes, reverse=True):
        dims[dims.index(min(dims))] *= q
    return ",".join(str(d) for d in sorted(dims))


def platform_xml(p):
    """SimGrid platform XML of the cluster ``p`` describes."""
    hosts, bw, lat = int(p["hosts"]), f"{p['gbits']}Gbps", f"{p['hop_latency_s']}s"
    topo = p["topology"]
    extra = ""
    if topo == "fat_tree":
        extra = f' topology="FAT_TREE" topo_parameters="{_fat_tree_params(hosts)}"'
    elif topo == "torus":
        extra = f' topology="TORUS" topo_parameters="{_torus_dims(hosts)}"'
    elif topo != "flat":
        raise ValueError(f"topology {topo!r}: flat, fat_tree or torus")
    return ("<?xml version='1.0'?>\n<!DOCTYPE platform SYSTEM "
            "\"https://simgrid.org/simgrid.dtd\">\n<platform version=\"4.1\">\n"
            f"<cluster id=\"c\" prefix=\"h\" suffix=\"\" radical=\"0-{hosts - 1}\" "
            f"speed=\"1Gf\" bw=\"{bw}\" lat=\"{lat}\" sharing_policy=\"SPLITDUPLEX\""
            f"{extra}/>\n</platform>\n")


class Waitable:
    """Something a rank can wait for: a message end, a rank's sub-program."""
    __slots__ = ("done", "waiters", "value")

    def __init__(self):
        self.done, self.waiters, self.value = False, [], None


class Proc(Waitable):
    """A rank's program (a generator yielding ``("until", t)`` or ``("wait", [...])``)."""
    __slots__ = ("gen",)

    def __init__(self, gen):
        super().__init__()
        self.gen = gen


class Driver:
    """Every rank's program run by one SimGrid actor: the ranks are generators, their
    messages host-to-host flows (``Comm.sendto_async``) started once both ends posted
    them (the mailbox's matching: per (sender, receiver) pair, in the order posted), their
    compute and latencies timers. One actor instead of a thread a rank: the replay's
    times are those of the actors' replay, without a context switch a message."""

    def __init__(self, hosts):
        self.hosts = hosts
        self.ready = []
        self.timers = []      # heap of (time, seq, proc)
        self.comms, self.ends = [], []   # running flows and the message ends they finish
        self.sends, self.recvs = {}, {}  # (src, dst) or box -> posted, unmatched ends
        self.seq = 0

    # the ranks' primitives

    def spawn(self, gen):
        proc = Proc(gen)
        self.ready.append(proc)
        return proc

    def _flow(self, src, dst, nbytes, ends):
        self.comms.append(Comm.sendto_async(self.hosts[src], self.hosts[dst], nbytes))
        self.ends.append(ends)

    def send(self, src, dst, nbytes, box=None):
        """Post a message of ``nbytes`` from ``src`` to ``dst`` (on ``box``: to whoever
        receives on it, ``dst`` the receiver's rank); its end for the sender."""
        end = Waitable()
        key = box if box is not None else (src, dst)
        waiting = self.recvs.get(key)
        if waiting:
            other = waiting.pop(0)
            other.value = src
            self._flow(src, dst, nbytes, (end, other))
        else:
            self.sends.setdefault(key, []).append((end, src, nbytes))
        return end

    def recv(self, src, dst, box=None):
        """Post the receive of the next message from ``src`` to ``dst`` (on ``box``: from
        any sender, its rank the end's ``value``)."""
        end = Waitable()
        key = box if box is not None else (src, dst)
        posted = self.sends.get(key)
        if posted:
            other, sender, nbytes = posted.pop(0)
            end.value = sender
            self._flow(sender, dst, nbytes, (other, end))
        else:
            self.recvs.setdefault(key, []).append(end)
        return end

    def push(self, src, dst, nbytes):
        """A message to a permanent receiver: it moves at once, the sender's end."""
        end = Waitable()
        self._flow(src, dst, nbytes, (end,))
        return end

    # the loop

    def _finish(self, w):
        w.done = True
        for waiter in w.waiters:
            waiter[0] -= 1
            if waiter[0] == 0:
                self.ready.append(waiter[1])
        w.waiters = []

    def _step(self, proc):
        try:
            cmd = next(proc.gen)
        except StopIteration:
            self._finish(proc)
            return
        if cmd[0] == "until":
            if cmd[1] <= Engine.clock:
                self.ready.append(proc)
            else:
                heapq.heappush(self.timers, (cmd[1], self.seq, proc))
                self.seq += 1
            return
        pending = [w for w in cmd[1] if not w.done]
        if not pending:
            self.ready.append(proc)
            return
        waiter = [len(pending), proc]
        for w in pending:
            w.waiters.append(waiter)

    def _collect(self, first=-1):
        """Flow ``first`` (the one a wait returned) and every other that has ended by
        now: one pass over the running ones (waiting for them one at a time would cost a
        pass each, a million at 1,024 ranks a round)."""
        comms, ends = [], []
        done = []
        for k, (c, e) in enumerate(zip(self.comms, self.ends)):
            state = c.state_str
            if k == first or (state() if callable(state) else state) == "FINISHED":
                done.append(e)
            else:
                comms.append(c)
                ends.append(e)
        self.comms, self.ends = comms, ends
        for e in done:
            for w in e:
                self._finish(w)

    def run(self):
        """Until every program ended and every message moved."""
        while True:
            while self.ready:
                batch, self.ready = self.ready, []
                for proc in batch:
                    self._step(proc)
            if not self.timers and not self.comms:
                return
            if self.timers and self.timers[0][0] <= Engine.clock:
                self._wake()
                continue
            if not self.comms:
                this_actor.sleep_until(self.timers[0][0])
                self._wake()
                continue
            if self.timers:
                i = Comm.wait_any_for(self.comms, self.timers[0][0] - Engine.clock)
            else:
                i = Comm.wait_any(self.comms)
            if i < 0:
                self._wake()
            self._collect(i)  # the flow that ended and the others that ended with it

    def _wake(self):
        """The first timer's programs (and any other due by now)."""
        t = self.timers[0][0]
        while self.timers and self.timers[0][0] <= max(t, Engine.clock):
            self.ready.append(heapq.heappop(self.timers)[2])


def sleep_for(seconds):
    yield ("until", Engine.clock + seconds)


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


class Rank:
    """One rank's point-to-point layer (generators run by the ``Driver``); ``dims``: the
    torus it sits on (None: a full-bisection network)."""

    def __init__(self, driver, me, size, alpha, dims=None):
        self.d, self.me, self.size, self.alpha, self.dims = driver, me, size, alpha, dims

    def _moved(self, vec, sign):
        """The rank ``sign`` * ``vec`` away on the torus (dimension 0 the fastest)."""
        rank, radix, rest = 0, 1, self.me
        for d, v in zip(self.dims, vec):
            rank += (rest % d + sign * v) % d * radix
            rest //= d
            radix *= d
        return rank

    def round(self, sends, recvs):
        """One round: ``sends`` [(peer, bytes)] and ``recvs`` [peer] posted at once, waited
        for together; the stack's latency once before."""
        if not sends and not recvs:
            return
        if self.alpha > 0:
            yield from sleep_for(self.alpha)
        ends = [self.d.send(self.me, peer, max(1, int(nbytes))) for peer, nbytes in sends]
        ends += [self.d.recv(peer, self.me) for peer in recvs]
        yield ("wait", ends)

    def exchange(self, peer, nbytes):
        yield from self.round([(peer, nbytes)], [peer])

    # MPICH's all-reduce algorithms (src/mpi/coll/allreduce), the data left out

    def _fold(self, nbytes):
        """A P that is not a power of two: the first 2*(P-p') ranks pair up, the even one
        hands its buffer to the odd one and sits out (-1); returns the rank in the p' group."""
        p = 1 << (self.size.bit_length() - 1)
        rem = self.size - p
        if self.me < 2 * rem:
            if self.me % 2 == 0:
                yield from self.round([(self.me + 1, nbytes)], [])
                return p, -1
            yield from self.round([], [self.me - 1])
            return p, self.me // 2
        return p, self.me - rem

    def _unfold(self, p, nbytes):
        rem = self.size - p
        if self.me < 2 * rem:
            if self.me % 2 == 0:
                yield from self.round([], [self.me + 1])
            else:
                yield from self.round([(self.me - 1, nbytes)], [])

    def _real(self, newrank, p):
        rem = self.size - p
        return newrank * 2 + 1 if newrank < rem else newrank + rem

    def allreduce_recursive_doubling(self, nbytes):
        p, new = yield from self._fold(nbytes)
        if new >= 0:
            mask = 1
            while mask < p:
                yield from self.exchange(self._real(new ^ mask, p), nbytes)
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
                yield from self.exchange(self._real(new ^ mask, p), part)
                mask <<= 1
            mask >>= 1
            for part in reversed(sizes):
                yield from self.exchange(self._real(new ^ mask, p), part)
                mask >>= 1
        yield from self._unfold(p, nbytes)

    def allreduce_ring(self, nbytes):
        """Reduce-scatter then all-gather around the ring: 2(P-1) rounds of n/P."""
        nxt, prv = (self.me + 1) % self.size, (self.me - 1) % self.size
        for _ in range(2 * (self.size - 1)):
            yield from self.round([(nxt, nbytes / self.size)], [prv])

    def allgather_ring(self, part):
        nxt, prv = (self.me + 1) % self.size, (self.me - 1) % self.size
        for _ in range(self.size - 1):
            yield from self.round([(nxt, part)], [prv])

    def bcast(self, nbytes):
        """Binomial tree from rank 0 (MPICH's short-message broadcast)."""
        mask = 1
        while mask < self.size:
            if self.me & mask:
                yield from self.round([], [self.me - mask])
                break
            mask <<= 1
        mask >>= 1
        while mask > 0:
            if self.me + mask < self.size:
                yield from self.round([(self.me + mask, nbytes)], [])
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
            yield from self.round([(self._moved(v, 1), part * scale) for v in vecs],
                                  [self._moved(v, -1) for v in vecs])
            return
        offsets = sorted({1 + j * others // k for j in range(k)})
        scale = others / len(offsets)
        yield from self.round([((self.me + o) % self.size, part * scale) for o in offsets],
                              [(self.me - o) % self.size for o in offsets])

    def allreduce(self, nbytes, algorithm):
        yield from getattr(self, f"allreduce_{algorithm}")(nbytes)


def _spmd(rank, job, t0):
    for op in job["ops"]:
        kind = op[0]
        if kind == "compute":
            yield from sleep_for(op[1])
        elif kind == "at":
            if Engine.clock < t0 + op[1]:
                yield ("until", t0 + op[1])
        elif kind == "allreduce":
            yield from rank.allreduce(op[1], op[2])
        elif kind == "direct":
            yield from rank.direct(op[1])
        elif kind == "allgather_ring":
            yield from rank.allgather_ring(op[1])
        elif kind == "bcast":
            yield from rank.bcast(op[1])
        elif kind == "behind":
            yield from _behind(rank, *op[1:])
        else:
            raise ValueError(f"unknown op {kind!r}")


def _behind(rank, steps, compute_s, nbytes, algorithm):
    """Each step's all-reduce runs beside the rank's program while the next step
    computes; a step waits for the one before it to finish first."""
    comm = None
    for _ in range(int(steps)):
        yield from sleep_for(compute_s)
        if comm is not None:
            yield ("wait", [comm])
        comm = rank.d.spawn(rank.allreduce(nbytes, algorithm))
    if comm is not None:
        yield ("wait", [comm])


def _master(rank, job, marks):
    """The master receives one request at a time (it probes, then receives that one) and
    answers each with a send it does not wait for (rules/_p2p.py ``serve_clients``)."""
    n, d = max(1, int(job["bytes"])), rank.d
    if rank.me == 0:
        replies = []
        for _ in range(job["rounds"] * (rank.size - 1)):
            got = d.recv(None, 0, box="to-master")
            yield ("wait", [got])
            yield from sleep_for(rank.alpha)
            replies.append(d.send(0, got.value, n))
        yield ("wait", replies)
        return
    for r in range(job["rounds"]):
        if r == job.get("skip", 0):
            marks[rank.me] = Engine.clock
        yield from sleep_for(job["work_s"])
        yield from sleep_for(rank.alpha)
        yield ("wait", [d.send(rank.me, 0, n, box="to-master")])
        yield ("wait", [d.recv(0, rank.me)])


def _push(rank, job, draws, marks):
    pending = None
    for step in range(job["steps"]):
        if step == job.get("skip", 0):
            marks[rank.me] = Engine.clock
        yield from sleep_for(job["compute_s"])
        if draws[step] >= job["p"]:
            continue
        if pending is not None:
            yield ("wait", [pending])
        peer = (rank.me + 1 + int(draws[step] / job["p"] * (rank.size - 1))) % rank.size
        yield from sleep_for(rank.alpha)
        # the peer's inbox has a permanent receiver: the push moves without a get
        pending = rank.d.push(rank.me, peer, max(1, int(job["bytes"])))
    if pending is not None:
        yield ("wait", [pending])


def main():
    spec = json.load(sys.stdin)
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
    jobs = spec["jobs"]
    ends = [[0.0] * hosts for _ in jobs]
    marks = [[None] * hosts for _ in jobs]  # a rank's time once its ``skip`` rounds ended
    starts, finished = [0.0] * len(jobs), [0] * len(jobs)
    for job in jobs:  # a push job's draws: one seeded stream, a row per rank
        if job["kind"] == "push":
            rng = random.Random(job.get("seed", 0))
            job["_draws"] = [[rng.random() for _ in range(job["steps"])] for _ in range(hosts)]

    def program(rank, j, job, t0):
        if job["kind"] == "spmd":
            yield from _spmd(rank, job, t0)
        elif job["kind"] == "master":
            yield from _master(rank, job, marks[j])
        elif job["kind"] == "push":
            yield from _push(rank, job, job["_draws"][rank.me], marks[j])
        else:
            raise ValueError(f"unknown job kind {job['kind']!r}")
        ends[j][rank.me] = Engine.clock
        finished[j] += 1

    def driver():
        d = Driver(all_hosts)
        dims = (tuple(int(x) for x in _torus_dims(hosts).split(","))
                if p["topology"] == "torus" else None)
        ranks = [Rank(d, me, hosts, spec["software_latency_s"], dims) for me in range(hosts)]
        for j, job in enumerate(jobs):  # a job starts once every rank ended the one before
            t0 = starts[j] = Engine.clock
            for rank in ranks:
                d.spawn(program(rank, j, job, t0))
            d.run()
            if finished[j] != hosts:
                return

    Actor.create("driver", all_hosts[0], driver)
    e.run()
    stuck = [job["name"] for j, job in enumerate(jobs) if finished[j] != hosts]
    if stuck:  # a rank waits for a message nobody sends: a bug of the replay, not a time
        sys.exit(f"sgreplay: ranks never finished job {stuck[0]!r} (a deadlock)")
    out = []
    for j, job in enumerate(jobs):
        res = {"name": job["name"], "seconds": max(ends[j]) - starts[j],
               "mean_s": sum(ends[j]) / hosts - starts[j]}
        steady = [e - m for e, m in zip(ends[j], marks[j]) if m is not None]
        if steady:  # after the first rounds, in which every rank starts at once
            res["steady_s"] = sum(steady) / len(steady)
        out.append(res)
    json.dump({"jobs": out, "simgrid": simgrid.simgrid_version if hasattr(
        simgrid, "simgrid_version") else None}, sys.stdout)


if __name__ == "__main__":
    main()
