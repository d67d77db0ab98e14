"""The cost model's torus term (costmodel/collectives.py: each round's routes on SimGrid's
torus, the busiest link and the longest route) against routes counted by hand and
against the SimGrid replay (costmodel/simulate.py) of the same collectives on a torus,
through ``distnn plan --simulate --topology torus``. The replay tests skip without
SimGrid's Python bindings (``apt-get install python3-simgrid``)."""
from __future__ import annotations

import json

import pytest
from helpers import run_distnn as distnn

from distnn.costmodel.collectives import (Link, allreduce_time, direct_time, torus_all_to_all,
                                          torus_dims, torus_round)
from distnn.costmodel.simulate import replay_jobs, simgrid_python

SIMGRID = simgrid_python()
needs_simgrid = pytest.mark.skipif(SIMGRID is None, reason="SimGrid's Python bindings "
                                   "are not installed (python3-simgrid)")

GBITS, HOP, ALPHA = 1.0, 1e-6, 50e-6   # alpha: a neighbour's message, two links in it
BETA = GBITS * 1e9 / 8
TORUS = Link(GBITS, ALPHA, topology="torus", hop_s=HOP)


def test_torus_dims_are_near_equal_2d_then_3d():
    assert [torus_dims(h) for h in (16, 12, 64, 256, 1024)] == [
        (4, 4), (3, 4), (4, 4, 4), (4, 8, 8), (8, 8, 16)]


def test_recursive_doubling_rounds_on_a_4x4_torus_by_hand():
    """Rank r at (r % 4, r // 4). XOR 1 and XOR 4: a neighbour each, one message a link.
    XOR 2: 0->2 and 3->1 (3 is past half a ring: it goes up, round the wrap) both cross
    the link 0->1: two messages on it, two links the longest route."""
    for mask, want in [(1, (1, 1)), (2, (2, 2)), (4, (1, 1)), (8, (2, 2))]:
        assert torus_round(tuple((r, r ^ mask) for r in range(16)), 16) == want, mask
    # in a ring of 4 the link 0->1 carries 0->1, 0->2 and 3->1; 16/4 such rings a link
    assert torus_all_to_all(16) == (12.0, 4)


def test_fat_tree_and_crossbar_links_have_no_torus_term():
    n, hosts = 800_000, 16
    plain = allreduce_time(n, hosts, Link(GBITS, ALPHA))
    assert allreduce_time(n, hosts, Link(GBITS, ALPHA, topology="flat", hop_s=HOP)) == plain
    torus = allreduce_time(n, hosts, TORUS)
    assert torus[1] == plain[1] == "reduce-scatter + all-gather"
    # halving's bytes n/2, n/4, n/8, n/16 on links shared 1, 2, 1, 2 ways, twice; routes
    # of 1, 2, 1, 2 links (alpha holds two: a neighbour's message is a hop less)
    assert torus[0] == pytest.approx(8 * ALPHA - 4 * HOP + 2 * 1.25 * n / BETA, rel=1e-12)
    assert direct_time(1000, hosts, TORUS)[0] == pytest.approx(
        ALPHA + 2 * HOP + 12 * 1000 / BETA, rel=1e-12)
    with pytest.raises(ValueError, match="topology"):
        Link(1.0, topology="ring")


def _replay(op, hosts):
    [res] = replay_jobs([{"name": "x", "kind": "spmd", "ops": [op]}], hosts, GBITS,
                        topology="torus", software_latency_s=ALPHA - 2 * HOP,
                        hop_latency_s=HOP, python=SIMGRID)
    return res["seconds"]


@needs_simgrid
@pytest.mark.parametrize("hosts", [16, 64])
@pytest.mark.parametrize("nbytes, alg", [(1024, "recursive_doubling"),
                                          (800_000, "rabenseifner")])
def test_torus_allreduce_is_the_replay_on_a_torus(hosts, nbytes, alg):
    t, name = allreduce_time(nbytes, hosts, TORUS)
    assert name.startswith({"recursive_doubling": "recursive",
                            "rabenseifner": "reduce"}[alg])
    plain = allreduce_time(nbytes, hosts, Link(GBITS, ALPHA))[0]
    got = _replay(["allreduce", nbytes, alg], hosts)
    assert t == pytest.approx(got, rel=0.02), (t, got, plain)


@needs_simgrid
@pytest.mark.parametrize("hosts", [16, 64, 256])
def test_torus_direct_exchange_is_the_replay_within_10_percent(hosts):
    """Every rank posts a part to every other at once: on a torus the busiest link, not
    the rank's own P-1 parts, sets the time (fewer at 16 hosts: four links out of each)."""
    part = 20_000
    t = direct_time(part, hosts, TORUS)[0]
    got = _replay(["direct", part], hosts)
    assert t == pytest.approx(got, rel=0.10), (t, got)  # 64 hosts: -9.5% (15 peers sampled)


@needs_simgrid
def test_plan_simulate_on_a_torus_counts_the_torus(tmp_path):
    out = tmp_path / "plan.json"
    args = ["plan", "--simulate", "--model", "simplecnn", "--hosts", "16", "--link_gbits",
            "1", "--compute_s", "0.0073", "--batch_size", "64", "--latency_us", "50",
            "--hop_latency_us", "1"]
    proc = distnn(*args, "--topology", "torus", "--json", out, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    res = json.loads(out.read_text())
    rows = {r["config"]: r for r in res["simulated"]}
    for label in ("data", "data+fp16", "data+powersgd:2", "partial (4 chunks)"):
        assert abs(rows[label]["error"]) <= 0.05, (label, rows[label])
    # the plan's own table is the full-bisection model's: there the torus's shared links
    # make the dense step slower (halving's bytes 1.25 n on the busiest link, not 15/16 n)
    [full] = [r for r in res["rows"] if r["config"] == "data"]
    assert rows["data"]["analytic_step_s"] > 1.1 * full["step_s"]
