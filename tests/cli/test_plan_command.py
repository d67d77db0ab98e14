"""``distnn plan`` through the real command (one process): the compute it measures, the
table it prints and the configuration it picks agree with the cost model's numbers; bad
options are one line and exit 2."""
from __future__ import annotations

import json

import pytest
from helpers import run_distnn as distnn


def test_plan_table_and_pick_follow_the_model(tmp_path):
    out = tmp_path / "plan.json"
    proc = distnn("plan", "--model", "simplecnn", "--hosts", "2,4", "--link_gbits", "1,100",
                  "--steps", "2", "--batch_size", "32", "--json", out, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    res = json.loads(out.read_text())
    assert res["compute_s"] > 0 and res["params"] == 149_210 and res["batch"] == 32

    from distnn.costmodel.predict import DEFAULT_CONFIGS, Link, ModelCost, pick, table
    from distnn.distributed.optimizer import parameter_tensors
    from distnn.models import get_model
    net = get_model("simplecnn", input_shape=(1, 28, 28), num_classes=10)
    cost = ModelCost(res["compute_s"], parameter_tensors(net), batch=32,
                     segments=[(layer.name, lo, hi) for layer, lo, hi in net.layer_ranges()])
    lines = proc.stdout.splitlines()
    for gbits in (1, 100):
        preds = table(DEFAULT_CONFIGS, cost, [2, 4], Link(gbits, 50e-6))
        rows = [r for r in res["rows"] if r["gbits"] == gbits]
        assert [(r["config"], r["hosts"]) for r in rows] == \
            [(p.config.label, p.hosts) for p in preds]
        for r, p in zip(rows, preds):
            assert r["step_s"] == pytest.approx(p.step_s)
            assert r["efficiency"] == pytest.approx(p.efficiency)
        # the printed table: one row per configuration, "step ms (efficiency)" per host count
        for cfg in DEFAULT_CONFIGS:
            cells = [f"{p.step_s * 1e3:.2f} ({p.efficiency:.0%})" for p in preds
                     if p.config == cfg]
            assert f"| {cfg.label} | {' | '.join(cells)} |" in lines
        best = pick([p for p in preds if p.hosts == 4])
        said = [ln for ln in lines if ln.startswith(f"pick at 4 hosts on {gbits:g} Gbit/s: ")]
        assert len(said) == 1 and best.config.label in said[0], said
    assert {p["gbits"]: p["config"] for p in res["picks"]} == {
        g: pick([p for p in table(DEFAULT_CONFIGS, cost, [4], Link(g, 50e-6))]).config.label
        for g in (1, 100)}


@pytest.mark.parametrize("args, words", [
    (["--hosts", "8-2"], ["--hosts", "8-2"]),
    (["--link_gbits", "0"], ["--link_gbits", "> 0"]),
    (["--efficiency", "2"], ["--efficiency"]),
    (["--model", "nozoo"], ["--model 'nozoo'"]),
])
def test_bad_options_are_one_line(capsys, args, words):
    from distnn.cli.main import main
    assert main(["plan", "--compute_s", "0.01", *args]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and all(w in lines[0] for w in words), lines


def test_the_table_has_a_row_for_each_rule_that_declares_one():
    from distnn.costmodel.predict import DEFAULT_CONFIGS
    from distnn.rules import RULES
    declared = sorted((cls.plan_order, name) for name, cls in RULES.items()
                      if cls.plan_order is not None)
    rows = [c.rule for c in DEFAULT_CONFIGS if c.rule != "data"]
    assert rows == [name for _, name in declared]
    assert rows[:5] == ["partial", "localsgd", "easgd", "downpour", "gossip"]
    for name in rows:  # each row's traffic is declared by its rule
        assert RULES[name].step_messages(size=10, itemsize=4, period=2, probability=0.5)
