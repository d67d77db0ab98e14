"""The SimGrid replay of a step (costmodel/simulate.py, sgreplay.py): each collective's
point-to-point rounds on a tiny crossbar against times computed by hand, the analytic
model's collectives against the replay where the network adds nothing, and ``distnn plan
--simulate`` through the real command (a zoo model and a model file, its errors). Skips
without SimGrid's Python bindings (``apt-get install python3-simgrid``)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers import run_distnn as distnn

from distnn.costmodel.collectives import Link, allreduce_time
from distnn.costmodel.predict import DEFAULT_CONFIGS, Config, ModelCost, predict
from distnn.costmodel.simulate import replay_jobs, simgrid_python, simulate

SIMGRID = simgrid_python()
needs_simgrid = pytest.mark.skipif(SIMGRID is None, reason="SimGrid's Python bindings "
                                   "are not installed (python3-simgrid)")

GBITS, HOP, ALPHA = 1.0, 1e-6, 20e-6   # a crossbar: a message crosses 2 links
BETA = GBITS * 1e9 / 8


def _one(op, hosts):
    [res] = replay_jobs([{"name": "x", "kind": "spmd", "ops": [op]}], hosts, GBITS,
                        topology="flat", software_latency_s=ALPHA, hop_latency_s=HOP,
                        python=SIMGRID)
    return res["seconds"]


def _round(nbytes):  # one message: the stack's latency, two links, the bytes
    return ALPHA + 2 * HOP + nbytes / BETA


@needs_simgrid
@pytest.mark.parametrize("hosts", [3, 4, 5])
def test_ring_allreduce_is_2p_minus_2_rounds_of_n_over_p(hosts):
    n = 1_200_000
    assert _one(["allreduce", n, "ring"], hosts) == \
        pytest.approx(2 * (hosts - 1) * _round(n / hosts), rel=1e-9)


@needs_simgrid
@pytest.mark.parametrize("hosts, depth", [(2, 1), (4, 2), (8, 3), (6, 3)])
def test_binomial_broadcast_takes_ceil_log2_p_rounds(hosts, depth):
    n = 500_000
    assert _one(["bcast", n], hosts) == pytest.approx(depth * _round(n), rel=1e-9)


@needs_simgrid
@pytest.mark.parametrize("nbytes", [1024, 800_000])
@pytest.mark.parametrize("hosts", [2, 4, 6, 8])
def test_mpich_allreduce_replay_is_the_analytic_time_on_a_crossbar(hosts, nbytes):
    """Recursive doubling (small) and Rabenseifner (large), the fold of a P that is not a
    power of two included: on a crossbar with the link latency in alpha, the replay and
    collectives.allreduce_time are the same equations."""
    t, alg = allreduce_time(nbytes, hosts, Link(GBITS, ALPHA + 2 * HOP))
    name = {"recursive doubling": "recursive_doubling",
            "reduce-scatter + all-gather": "rabenseifner"}[alg]
    assert _one(["allreduce", nbytes, name], hosts) == pytest.approx(t, rel=1e-9)


@needs_simgrid
def test_direct_exchange_pays_the_latency_once():
    part, hosts = 40_000, 5
    assert _one(["direct", part], hosts) == \
        pytest.approx(ALPHA + 2 * HOP + (hosts - 1) * part / BETA, rel=1e-9)


def _cost():
    from distnn.distributed.optimizer import parameter_tensors
    from distnn.models import get_model
    net = get_model("simplecnn", input_shape=(1, 28, 28), num_classes=10)
    return ModelCost(0.02, parameter_tensors(net), batch=32, segments=[
        (layer.name, lo, hi) for layer, lo, hi in net.layer_ranges()])


@needs_simgrid
def test_simulated_steps_of_the_collective_rules_match_the_model_on_a_crossbar():
    """Where the network adds nothing to alpha-beta (a crossbar, one rank a host) the
    replayed step of data, its compressions and the all-reduce rules is the model's."""
    cost, link = _cost(), Link(1.0, 50e-6)
    configs = [Config("data"), Config("data", "fp16"), Config("data", "topk:0.01"),
               Config("data", "powersgd:2"), Config("partial"), Config("localsgd"),
               Config("data", bucket_size_mb=0.25)]
    for sim in simulate(configs, cost, 4, link, topology="flat", hop_latency_s=0.0,
                        python=SIMGRID):
        assert sim.step_s == pytest.approx(predict(sim.config, cost, 4, link).step_s,
                                           rel=1e-6), sim.config.label


@needs_simgrid
@pytest.mark.parametrize("hosts", [3, 4])
def test_sharded_steps_replay_their_reduce_scatters_and_all_gathers(hosts):
    """--shard 1/2/3 on a crossbar: the replayed step is the model's (stage 1's buckets and
    its all-gather; 2 and 3's layer slices reduce-scattered by recursive halving on 4
    hosts, pairwise on 3; stage 3's two all-gathers, by recursive doubling or Bruck), and
    not the data rule's step that the simulator replayed for them before."""
    cost, link = _cost(), Link(1.0, 50e-6)
    configs = [Config("data", shard=k) for k in (1, 2, 3)]
    sims = simulate(configs + [Config("data")], cost, hosts, link, topology="flat",
                    hop_latency_s=0.0, python=SIMGRID)
    for sim in sims:   # 1e-5: a message's bytes are whole in SimGrid (n/3 is not)
        assert sim.step_s == pytest.approx(predict(sim.config, cost, hosts, link).step_s,
                                           rel=1e-5), sim.config.label
    assert len({round(sim.step_s, 12) for sim in sims}) == 4


def test_shards_rings_are_not_replayed_beyond_their_host_count():
    """--shard's ring all-gather (and pairwise reduce-scatter) is P-1 rounds that a fat
    tree makes asymmetric (the ranks replay: P(P-1) messages): past RING_HOSTS_MAX hosts
    plan leaves them out of the simulated table with a line naming why."""
    from distnn.costmodel.simulate import RING_HOSTS_MAX, not_replayed
    cost, link = _cost(), Link(10.0, 12e-6)
    why = not_replayed(Config("data", shard=3), cost, 1024, link)
    assert why is not None and "all-gather" in why and "1023 a rank" in why, why
    assert not_replayed(Config("data", shard=3), cost, RING_HOSTS_MAX, link) is None
    assert not_replayed(Config("data"), cost, 1024, link) is None


def _model_file(tmp_path):
    path = tmp_path / "mine.py"
    path.write_text("from distnn.nn import Dense, Flatten, ReLU, Sequential\n\n\n"
                    "def build_model(input_shape, num_classes):\n"
                    "    return Sequential([Flatten(), Dense(64), ReLU(), "
                    "Dense(num_classes)], input_shape=input_shape)\n")
    return path


@needs_simgrid
@pytest.mark.parametrize("model", ["simplecnn", "file"])
def test_plan_simulate_prints_both_and_picks(tmp_path, model):
    spec = str(_model_file(tmp_path)) if model == "file" else model
    out = tmp_path / "plan.json"
    proc = distnn("plan", "--simulate", "--model", spec, "--hosts", "2,4", "--link_gbits",
                  "1", "--compute_s", "0.02", "--batch_size", "32", "--json", out,
                  cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    res = json.loads(out.read_text())
    rows = res["simulated"]
    labels = {r["config"] for r in rows}
    assert {c.label for c in DEFAULT_CONFIGS} <= labels
    assert {r["hosts"] for r in rows} == {2, 4}
    for r in rows:
        assert r["simulated_step_s"] >= 0.02 * (1 - 1e-9)  # never faster than compute
        assert r["error"] == pytest.approx(r["analytic_step_s"] / r["simulated_step_s"] - 1)
    lines = proc.stdout.splitlines()
    assert any(ln.startswith("| data | ") and " / " in ln for ln in lines)
    said = [ln for ln in lines if ln.startswith("simulated pick at 4 hosts on 1 Gbit/s")]
    assert len(said) == 1 and "buckets of" in said[0] and "rule " in said[0], lines[-5:]


@pytest.mark.parametrize("args, env, words", [
    (["--hosts", "4096"], {}, ["--hosts", "4096", "2048"]),
    (["--hop_latency_us", "40"], {}, ["--hop_latency_us", "40"]),
    (["--hosts", "2"], {"DISTNN_SIMGRID_PYTHON": sys.executable}, ["--simulate", "SimGrid",
                                                                   "python3-simgrid"]),
])
def test_plan_simulate_errors_are_one_line(tmp_path, args, env, words):
    if "DISTNN_SIMGRID_PYTHON" in env and subprocess.run(
            [sys.executable, "-c", "import simgrid"], capture_output=True).returncode == 0:
        pytest.skip("this Python has SimGrid: no Python without it to point to")
    proc = distnn("plan", "--simulate", "--compute_s", "0.01", "--link_gbits", "1", *args,
                  cwd=tmp_path, **env)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and all(w in lines[0] for w in words), lines


def _plan_configs(cost):
    from distnn.cli.plan import _bucket_variants
    return DEFAULT_CONFIGS + _bucket_variants(cost, DEFAULT_CONFIGS)


@needs_simgrid
@pytest.mark.parametrize("topology", ["fat_tree", "torus"])
@pytest.mark.parametrize("hosts", [8, 12, 16])
def test_rounds_replay_gives_the_ranks_replays_step_times(hosts, topology):
    """replay='auto' (the spmd jobs round by round, each distinct round once) against
    replay='ranks' (an actor a rank, the reference): every configuration plan simulates,
    the same step within 0.1% (SimGrid's own precision: exact for the rounds replay, 1e-5
    for the master jobs run in another process); 12 hosts, not a power of two, falls back
    to the ranks replay where the fold makes the rounds asymmetric."""
    cost, link = _cost(), Link(10.0, 12e-6)
    configs = _plan_configs(cost)
    auto = simulate(configs, cost, hosts, link, topology=topology, hop_latency_s=0.5e-6,
                    python=SIMGRID)
    ranks = simulate(configs, cost, hosts, link, topology=topology, hop_latency_s=0.5e-6,
                     python=SIMGRID, replay="ranks")
    for a, r in zip(auto, ranks):
        assert r.replay == "ranks"
        assert a.step_s == pytest.approx(r.step_s, rel=1e-3), (a.config, a.replay)
    used = {a.config.label: a.replay for a in auto}
    if hosts & (hosts - 1) == 0:   # a power of two: the all-reduces' rounds are symmetric
        assert used["data"] == used["localsgd (every 8)"] == "rounds", used
    assert used["easgd (every 4)"] == "ranks"  # a master job: the ranks replay always


def test_the_routing_knows_sgreplays_direct_peers():
    """simulate.DIRECT_PEERS (which jobs go to the ranks replay from the start) is
    sgreplay's (which cannot be imported without SimGrid)."""
    import re
    from pathlib import Path

    from distnn.costmodel import simulate as sim
    text = (Path(sim.__file__).with_name("sgreplay.py")).read_text()
    assert re.search(r"^DIRECT_PEERS = (\d+)$", text, re.M).group(1) == str(sim.DIRECT_PEERS)


@needs_simgrid
def test_a_replay_child_is_held_on_the_cpu_it_is_given(tmp_path):
    """sgreplay keeps all its threads (SimGrid's Python actors, one running at a time,
    handing over by futex) on the CPU in its spec, where a 1,024-rank replay took a
    third of the time it took free to move across two cores; the times are the same."""
    import os
    from pathlib import Path

    from distnn.costmodel import simulate as sim
    cpu = sorted(os.sched_getaffinity(0))[-1]
    op = ["allreduce", 1000.0, "ring"]
    spec = {"platform": {"topology": "flat", "hosts": 4, "gbits": GBITS,
                         "hop_latency_s": HOP, "torus_dims": [4]},
            "software_latency_s": ALPHA, "replay": "ranks", "cpu": cpu,
            "platform_file": str(tmp_path / "platform.xml"),
            "jobs": [{"name": "x", "kind": "spmd", "ops": [op]}]}
    proc = subprocess.run([SIMGRID, str(Path(sim.__file__).with_name("sgreplay.py"))],
                          input=json.dumps(spec), capture_output=True, text=True,
                          cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["cpus"] == [cpu]
    assert out["jobs"][0]["seconds"] == pytest.approx(_one(op, 4), rel=1e-12)
