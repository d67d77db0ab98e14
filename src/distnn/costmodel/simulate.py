"""The cost model's step replayed in SimGrid: the messages distnn sends a step (the
Reducer's buckets and the compressions' bytes from ``predict.data_messages``, every other
rule's from its ``step_messages``), each collective as the point-to-point rounds of the
algorithm MPICH picks for its size (``collectives.py``'s choice), over a generated fat
tree or torus of N hosts, one rank each, with the compute per step the caller measured.

SimGrid's Python bindings are often those of the system's Python (Debian's
``python3-simgrid``), not the venv's: the replay runs as a child process
(``sgreplay.py``, JSON in and out) under the first Python that imports ``simgrid``:
``$DISTNN_SIMGRID_PYTHON``, this one, then ``/usr/bin/python3``.

    sim = simulate([Config("data")], model, hosts=64, link=Link(10, 12e-6),
                   topology="fat_tree")
    sim[0].step_s, sim[0].efficiency

Equations and what the replay adds to the analytic model: docs/costmodel.md
"Simulated in SimGrid".
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .collectives import TOPOLOGIES, Link, allgather_time, torus_dims
from .predict import Config, ModelCost, data_messages, half_bucket, slice_messages

__all__ = ["Fabric", "FABRICS", "TOPOLOGIES", "MAX_HOSTS", "Simulated", "SimulatorError",
           "simgrid_python", "REPLAYS", "replay_jobs", "config_job", "simulate"]

# One thread a simulated rank (SimGrid's Python actors): past this the replay's memory
# and time grow beyond what a planning command should take.
MAX_HOSTS = 2048
# Asynchronous rules are timed in their steady state: rounds after the first SKIP ones.
STEPS_BEHIND, STEPS_PUSH, MASTER_ROUNDS, SKIP_ROUNDS, SKIP_PUSH = 4, 32, 8, 3, 8
_ALGORITHMS = {"recursive doubling": "recursive_doubling",
               "reduce-scatter + all-gather": "rabenseifner", "ring": "ring"}


class SimulatorError(ValueError):
    """The simulator cannot run what was asked (SimGrid missing, a platform it cannot
    hold): the message names the option and what to do."""


@dataclass(frozen=True)
class Fabric:
    """A network as the analytic model sees it (``alpha_s`` a message end to end, the
    host's stack included) plus what the simulator adds: ``hop_s`` a link crossed (the
    wire and a switch)."""
    name: str
    gbits: float
    alpha_s: float
    hop_s: float

    @property
    def link(self) -> Link:
        return Link(self.gbits, self.alpha_s)


# Latencies of real fabrics, one rank a host: MPI over kernel TCP on Ethernet
# (tens of microseconds a message, a switch a microsecond or less), MPI over verbs on
# InfiniBand EDR (about 1.5 us end to end, 100-150 ns a switch).
FABRICS = {1.0: Fabric("1 Gbit/s Ethernet, TCP", 1.0, 50e-6, 1e-6),
           10.0: Fabric("10 Gbit/s Ethernet, TCP", 10.0, 12e-6, 0.5e-6),
           100.0: Fabric("100 Gbit/s InfiniBand EDR", 100.0, 1.5e-6, 0.12e-6)}


@dataclass(frozen=True)
class Simulated:
    """One configuration's simulated step on ``hosts`` hosts: ``step_s``, the ranks that
    compute, samples per second and scaling efficiency as ``predict.Prediction`` counts
    them, ``simulated_s`` (the seconds the replay covered: ``steps`` steps) and ``replay``
    (``"rounds"`` or ``"ranks"``: which replay gave it, ``replay_jobs``)."""
    config: Config
    hosts: int
    topology: str
    step_s: float
    ranks_computing: int
    samples_per_s: float
    efficiency: float
    simulated_s: float
    steps: int
    replay: str = "ranks"


def simgrid_python() -> str | None:
    """The first Python that imports ``simgrid``: $DISTNN_SIMGRID_PYTHON alone when it is
    set, else this one, /usr/bin/python3, the ``python3`` on PATH; None when none does."""
    chosen = os.environ.get("DISTNN_SIMGRID_PYTHON")
    candidates = [chosen] if chosen else [sys.executable, "/usr/bin/python3",
                                          shutil.which("python3")]
    for exe in dict.fromkeys(c for c in candidates if c):
        try:
            ok = subprocess.run([exe, "-c", "import simgrid"], capture_output=True,
                                timeout=60).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            ok = False
        if ok:
            return exe
    return None


def _exchange_ops(msg, hosts: int) -> list:
    """The replay's ops of one ``data_messages`` entry."""
    what, nbytes, _, alg = msg[:4]
    if alg in _ALGORITHMS:
        return [["allreduce", float(nbytes), _ALGORITHMS[alg]]]
    if alg == "direct":  # the top-k pairs, posted at once to every other rank
        return [["direct", float(nbytes)]]
    if alg.startswith("all-gather (") or alg.startswith("all-to-all ("):  # fp16 buckets
        hb = half_bucket(int(nbytes) // 2, hosts, Link(1.0))
        if hb.whole:
            return [["direct", 2.0 * hb.elements]]
        chunk = 2.0 * -(-hb.elements // hosts)
        return [["direct", chunk], ["direct", chunk]]
    if alg == "none":
        return []
    raise SimulatorError(f"the simulator has no replay of {what!r} sent by {alg!r}")


def config_job(config: Config, model: ModelCost, hosts: int, link: Link) -> tuple:
    """(job for ``sgreplay``, steps it covers, ranks computing) of one configuration."""
    c, n, item = model.compute_s, model.size, model.itemsize
    options = {"shard": config.shard} if config.shard else {}
    declared = config.rule_class.step_messages(size=n, itemsize=item, period=config.period,
                                               probability=config.probability, **options)
    name = config.label
    if hosts <= 1:
        return {"name": name, "kind": "spmd", "ops": [["compute", c]]}, 1, hosts
    shapes = {m.shape for m in declared}
    if config.shard:
        return _sharded_job(name, declared, config, model, hosts, link), 1, hosts
    if shapes == {"gradients"}:
        fwd, back = c * (1 - model.backward_share), c * model.backward_share
        ops, later = [], []
        for msg in data_messages(config, model, hosts, link):
            if msg[4] is None:
                later += _exchange_ops(msg, hosts)
            else:
                ops += [["at", fwd + back * msg[4]], *_exchange_ops(msg, hosts)]
        return {"name": name, "kind": "spmd", "ops": ops + [["at", c]] + later}, 1, hosts
    if len(declared) != 1:
        raise SimulatorError(f"the simulator cannot replay rule {config.rule!r}: it "
                             f"declares {len(declared)} kinds of messages")
    m = declared[0]

    def algorithm(nbytes):
        from .collectives import allreduce_time
        return _ALGORITHMS[allreduce_time(nbytes, hosts, link, itemsize=item)[1]]

    if m.shape == "allreduce":
        k = max(1, round(1 / m.per_step))
        return {"name": name, "kind": "spmd", "ops": [
            ["compute", k * c], ["allreduce", m.nbytes, algorithm(m.nbytes)]]}, k, hosts
    if m.shape == "behind":
        return {"name": name, "kind": "spmd", "ops": [
            ["behind", STEPS_BEHIND, c, m.nbytes, algorithm(m.nbytes)]]}, STEPS_BEHIND, hosts
    if m.shape == "master":
        k = max(1, round(1 / m.per_step))
        return {"name": name, "kind": "master", "work_s": k * c, "bytes": m.nbytes,
                "rounds": MASTER_ROUNDS, "skip": SKIP_ROUNDS}, k * (MASTER_ROUNDS -
                                                                 SKIP_ROUNDS), hosts - 1
    if m.shape == "push":
        return {"name": name, "kind": "push", "compute_s": c, "bytes": m.nbytes,
                "p": m.per_step, "steps": STEPS_PUSH, "seed": 0,
                "skip": SKIP_PUSH}, STEPS_PUSH - SKIP_PUSH, hosts
    raise SimulatorError(f"the simulator has no replay of message shape {m.shape!r}")


_SLICE_ALGORITHMS = {"recursive halving": "recursive_halving",
                     "pairwise exchange": "pairwise"}
_GATHER_ALGORITHMS = {"recursive doubling": "recursive_doubling", "bruck": "bruck",
                      "ring": "ring"}


def _sharded_job(name: str, declared: list, config: Config, model: ModelCost, hosts: int,
                 link: Link) -> dict:
    """--shard's step as predict() has it: the gradients all-reduced in buckets (stage 1)
    or reduce-scattered layer by layer (2, 3), each once backward has made it; after the
    step's compute, the parameters all-gathered (stage 3: twice)."""
    c = model.compute_s
    fwd, back = c * (1 - model.backward_share), c * model.backward_share
    ops, later = [], []
    if any(m.shape == "gradients" for m in declared):
        for msg in data_messages(config, model, hosts, link):
            if msg[4] is None:
                later += _exchange_ops(msg, hosts)
            else:
                ops += [["at", fwd + back * msg[4]], *_exchange_ops(msg, hosts)]
    else:
        for _, nbytes, _, alg, ready in slice_messages(model, hosts, link):
            ops += [["at", fwd + back * ready],
                    ["reduce_scatter", float(nbytes), _SLICE_ALGORITHMS[alg]]]
    ops += [["at", c], *later]
    for m in declared:
        if m.shape == "allgather":
            alg = allgather_time(m.nbytes, hosts, link)[1]
            ops += [["allgather", m.nbytes / hosts, _GATHER_ALGORITHMS[alg]]] * \
                round(m.per_step)
    return {"name": name, "kind": "spmd", "ops": ops}


# A ring or pairwise exchange is P-1 rounds, and on a fat tree or torus not symmetric
# (neighbours across a switch end later), so it goes to the ranks replay: P (P-1) messages,
# 1,046,529 at 1,024 hosts (over 15 minutes). Replayed up to this many hosts.
RING_HOSTS_MAX = 256


def not_replayed(config: Config, model: ModelCost, hosts: int, link: Link) -> str | None:
    """Why ``config`` is not replayed on ``hosts`` hosts (None: it is)."""
    if hosts <= RING_HOSTS_MAX or not config.shard:
        return None
    job = config_job(config, model, hosts, link)[0]
    names = {"allgather": "all-gather", "reduce_scatter": "reduce-scatter"}
    rings = sorted({names[op[0]] for op in job["ops"]
                    if op[0] in names and op[2] in ("ring", "pairwise")})
    if not rings:
        return None
    return (f"its {' and '.join(rings)} go by ring or pairwise rounds, {hosts - 1} a "
            f"rank; replayed up to {RING_HOSTS_MAX} hosts")


REPLAYS = ("auto", "ranks")
# sgreplay.DIRECT_PEERS (that module imports SimGrid: not importable here)
DIRECT_PEERS = 16


def _rounds_unlikely(job: dict, hosts: int) -> bool:
    """An ``spmd`` job whose rounds are known not to be symmetric on ``hosts`` hosts, sent
    to the ranks replay from the start (in parallel with the rounds replay) rather than
    tried by rounds and replayed again after: a direct exchange compacted to
    DIRECT_PEERS spread peers (its flows cross different numbers of links, so the ranks'
    round ends differ: an fp16 bucket's two exchanges, top-k's pairs), a binomial
    broadcast (ranks have different rounds), MPICH's all-reduce fold of a host count
    that is not a power of two. Only where each job goes depends on it: the times are
    the same either way (the rounds replay checks symmetry and falls back)."""
    folds = hosts & (hosts - 1) != 0
    for op in job["ops"]:
        if op[0] == "direct" and hosts - 1 > DIRECT_PEERS or op[0] == "bcast":
            return True
        if folds and (op[0] == "allreduce" and op[2] != "ring"
                      or op[0] == "behind" and op[4] != "ring"):
            return True
    return False


def _cpus() -> list:
    """The CPUs this process may run on (sorted; [None] where the OS cannot tell)."""
    try:
        return sorted(os.sched_getaffinity(0)) or [None]
    except (AttributeError, OSError):
        return [None]


def _start(exe: str, spec: dict, tmp: str, timeout_s: float, cpu=None):
    """One ``sgreplay`` child on ``spec`` (its platform file in ``tmp``), its threads held
    on ``cpu`` (``sgreplay``'s "cpu"; None: where the OS puts them); returns a function
    that waits for it and gives its decoded output."""
    spec = {**spec, "platform_file": str(Path(tmp) / f"platform-{spec['replay']}.xml"),
            "cpu": cpu}
    proc = subprocess.Popen([exe, str(Path(__file__).with_name("sgreplay.py"))],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=tmp)

    def wait() -> dict:
        try:
            out, err = proc.communicate(json.dumps(spec), timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise SimulatorError(f"the SimGrid replay of {spec['platform']['hosts']} hosts "
                                 f"took more than {timeout_s:g} s") from None
        if proc.returncode != 0:
            tail = [ln for ln in err.splitlines() if "xbt_cfg/INFO" not in ln][-3:]
            raise SimulatorError(
                f"the SimGrid replay of {spec['platform']['hosts']} hosts "
                f"({spec['platform']['topology']}) failed (exit {proc.returncode}): "
                f"{' / '.join(tail)}")
        return json.loads(out)
    return wait


def replay_jobs(jobs: list, hosts: int, gbits: float, *, topology: str = "fat_tree",
                software_latency_s: float = 0.0, hop_latency_s: float = 0.0,
                python: str | None = None, timeout_s: float = 3600,
                replay: str = "auto") -> list[dict]:
    """Run ``jobs`` (``sgreplay``'s format) on a generated platform; returns its
    [{"name", "seconds", "mean_s", "replay"}], in the order of ``jobs``.

    ``replay="ranks"``: every job in an actor a rank (an OS thread each), the reference.
    ``"auto"`` (the default): jobs that send the same messages as an earlier one are
    replayed once; the ``spmd`` jobs go to the rounds replay (one actor, every rank's
    round at once, each distinct round once: ``sgreplay.RoundsReplay``, exact where
    every round is symmetric), while the master and push jobs, and the ``spmd`` jobs
    known not to be symmetric (``_rounds_unlikely``), run in the ranks replay in a
    second process at the same time; an ``spmd`` job the rounds replay finds not
    symmetric is replayed by ranks after.

    Each child's threads are held on one CPU (``sgreplay``'s "cpu"): SimGrid runs one actor
    at a time, each in an OS thread of its own, handing over to the next by a futex; left
    free to move, a 1,024-rank replay spent more of its time in those hand-overs across
    two cores than in the simulation (one fp16 job: 10.8 s on two cores, 3.8 s held on
    one, the same simulated seconds)."""
    if topology not in TOPOLOGIES:
        raise SimulatorError(f"--topology: {topology!r} is not one of "
                             f"{', '.join(TOPOLOGIES)}")
    if replay not in REPLAYS:
        raise SimulatorError(f"replay: {replay!r} is not one of {', '.join(REPLAYS)}")
    if not 1 <= hosts <= MAX_HOSTS:
        raise SimulatorError(f"--hosts: the simulator holds 1 to {MAX_HOSTS} hosts (a "
                             f"thread each), got {hosts}; use the analytic model alone "
                             "(without --simulate) beyond it")
    exe = python or simgrid_python()
    if exe is None:
        raise SimulatorError("--simulate: SimGrid's Python bindings are not installed "
                             "(apt-get install python3-simgrid, or scripts/setup.sh "
                             "--simgrid; another Python: DISTNN_SIMGRID_PYTHON)")
    # one replay of each distinct job: configurations that send the same messages
    # (data and its shards, top-k past its crossover) share it
    keys = [json.dumps({k: v for k, v in job.items() if k != "name"}, sort_keys=True)
            for job in jobs]
    unique = {}
    for key, job in zip(keys, jobs):
        unique.setdefault(key, {**job, "name": f"job{len(unique)}"})
    base = {"platform": {"topology": topology, "hosts": hosts, "gbits": gbits,
                         "hop_latency_s": hop_latency_s,
                         "torus_dims": list(torus_dims(hosts))},
            "software_latency_s": software_latency_s}
    found, cpus = {}, _cpus()
    with tempfile.TemporaryDirectory(prefix="distnn-sim-") as tmp:
        todo = list(unique.values())
        if replay == "auto":
            spmd = [j for j in todo if j["kind"] == "spmd" and not _rounds_unlikely(j, hosts)]
            rest = [j for j in todo if j not in spmd]
            # the two children at once, each held on a CPU of its own (the last two)
            waits = [_start(exe, {**base, "replay": "rounds", "jobs": spmd}, tmp, timeout_s,
                            cpus[-2 % len(cpus)]) if spmd else None,
                     _start(exe, {**base, "replay": "ranks", "jobs": rest}, tmp, timeout_s,
                            cpus[-1]) if rest else None]
            for wait in waits:
                for res in (wait() if wait else {"jobs": []})["jobs"]:
                    if "fallback" not in res:
                        found[res["name"]] = res
            todo = [j for j in todo if j["name"] not in found]
        if todo:
            for res in _start(exe, {**base, "replay": "ranks", "jobs": todo}, tmp,
                              timeout_s, cpus[-1])()["jobs"]:
                found[res["name"]] = res
    return [{**found[unique[key]["name"]], "name": job["name"]}
            for key, job in zip(keys, jobs)]


def simulate(configs, model: ModelCost, hosts: int, link: Link, *,
             topology: str = "fat_tree", hop_latency_s: float = 0.0,
             python: str | None = None, replay: str = "auto") -> list[Simulated]:
    """Each of ``configs`` on ``hosts`` hosts joined by ``link``s: the analytic model's
    alpha is the end-to-end latency of two neighbours (the host's stack plus two links
    of ``hop_latency_s``); farther hosts cross more links, and links are shared."""
    built = [config_job(cfg, model, hosts, link) for cfg in configs]
    software = max(0.0, link.latency_s - 2 * hop_latency_s)
    res = replay_jobs([b[0] for b in built], hosts, link.gbits, topology=topology,
                      software_latency_s=software, hop_latency_s=hop_latency_s,
                      python=python, replay=replay)
    out = []
    for cfg, (_, steps, computing), r in zip(configs, built, res):
        step = r.get("steady_s", r["seconds"]) / steps
        sps = computing * model.batch / step
        out.append(Simulated(cfg, hosts, topology, step, computing, sps,
                             sps / (hosts * model.batch / model.compute_s),
                             r["seconds"], steps, r["replay"]))
    return out
