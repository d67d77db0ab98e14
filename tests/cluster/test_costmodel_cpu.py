"""The exchange's own CPU in the cost model (distnn/costmodel/cpu.py): the term by hand
(slowed as the compute, the TCP work against the link), predictions without it unchanged,
the calibration measured from the real compressors (a slowed one raises it), growing with
the tensors and the ranks, and ``distnn plan --cpu``."""
from __future__ import annotations

import json
import time

import pytest

from distnn.costmodel.predict import DEFAULT_CONFIGS, Config, Link, ModelCost, predict
from distnn.costmodel.cpu import (CpuCost, PhantomComm, calibrate_cpu, calibrate_steps,
                                    calibrate_tcp)

LINK = Link(gbits=1, latency_s=100e-6)
N = 250_000  # one (500, 500) matrix: 1 MB of float32
ONE = ModelCost(compute_s=0.010, tensors=[("fc/w", 0, N, (500, 500))], batch=32)


def _small(side: int) -> list:
    """A (side, side) matrix and its bias."""
    return [("fc/w", 0, side * side, (side, side)),
            ("fc/b", side * side, side * side + side, (side,))]


def _total(steps: dict, spec: str, hosts: int) -> float:
    return sum(next((a, b) for h, a, b in steps[spec] if h == hosts))


def test_without_cpu_predictions_are_unchanged():
    # a CpuCost of zeros gives the model's step exactly; no CpuCost is the default
    assert ONE.cpu is None and ONE.slowdown == 1
    zero = CpuCost({c.compression: [(2, 0.0, 0.0)] for c in DEFAULT_CONFIGS
                    if c.rule == "data"})
    from dataclasses import replace
    for cfg in DEFAULT_CONFIGS:
        for hosts in (2, 4, 64):
            before = predict(cfg, ONE, hosts, LINK)
            after = predict(cfg, replace(ONE, cpu=zero, slowdown=4), hosts, LINK)
            assert after.step_s == before.step_s, (cfg.label, hosts)
            assert after.messages == before.messages


def test_the_cpu_term_by_hand():
    # 2 hosts sharing... a core 4 ways: 1 ms before the bucket starts and 2 ms after,
    # each 4x; TCP: 10 us a message, 1 ns a byte; the 1 MB all-reduce on 2 hosts sends
    # (and receives) 2 messages, 1 MB in all: 20 us + 1 ms of CPU, 4x = 4.08 ms, less
    # than its 8.2 ms on the link: the link's time stands
    cpu = CpuCost({"none": [(2, 1e-3, 2e-3)]}, tcp_message_s=10e-6, tcp_byte_s=1e-9)
    m = ModelCost(compute_s=0.010, tensors=ONE.tensors, cpu=cpu, slowdown=4)
    link_s = 2 * 100e-6 + 8e-3
    p = predict(Config("data"), m, 2, LINK)
    assert p.step_s == pytest.approx(0.010 + 4e-3 + link_s + 8e-3)
    # on 10 Gbit/s the link takes 1 ms: the TCP work (4.08 ms) is the longer
    fast = predict(Config("data"), m, 2, Link(gbits=10, latency_s=100e-6))
    assert fast.step_s == pytest.approx(0.010 + 4e-3 + 4 * (2 * 10e-6 + 1e6 * 1e-9) + 8e-3)
    # added to the link instead of overlapping it
    from dataclasses import replace
    add = replace(m, cpu=replace(cpu, overlap_link=False))
    assert predict(Config("data"), add, 2, LINK).step_s == pytest.approx(
        0.010 + 4e-3 + link_s + 4 * (2 * 10e-6 + 1e6 * 1e-9) + 8e-3)
    # host counts between the measured ones: linear in P; beyond them: the last
    two = CpuCost({"none": [(2, 1e-3, 0.0), (8, 4e-3, 6e-3)]})
    assert two.step_s("none", 4) == pytest.approx((2e-3, 2e-3))
    assert two.step_s("none", 64) == (4e-3, 6e-3)
    assert two.step_s(None, 1) == (1e-3, 0.0)
    with pytest.raises(ValueError, match="not calibrated for compression 'topk:0.01'"):
        two.step_s("topk:0.01", 2)
    with pytest.raises(ValueError, match="slowdown"):
        ModelCost(compute_s=0.01, tensors=[], slowdown=0.5)


def test_calibration_is_positive_and_grows_with_tensors_and_ranks():
    specs = ["none", "fp16", "topk:0.001", "powersgd:2"]
    small = calibrate_steps(_small(256), specs=specs, hosts=[2], steps=3, warmup=1)
    big = calibrate_steps(_small(1024), specs=specs, hosts=[2], steps=3, warmup=1)
    for spec in specs:
        assert 0 < _total(small, spec, 2) < _total(big, spec, 2), spec
    # top-k adds every rank's pairs (1,048 a rank here) after the exchange: 512 ranks'
    # take longer than 2's
    ranks = calibrate_steps(_small(1024), specs=["topk:0.001"], hosts=[2, 512], steps=3,
                            warmup=1)
    (_, _, two), (_, _, many) = sorted(ranks["topk:0.001"])
    assert many > 1.5 * two


def _burn(seconds: float) -> None:
    t = time.process_time()
    while time.process_time() - t < seconds:
        pass


def test_calibration_times_the_real_compressors(monkeypatch):
    tensors = _small(512)
    base = calibrate_steps(tensors, specs=["topk:0.01", "powersgd:2"], hosts=[2], steps=3,
                           warmup=1)
    from distnn.distributed import powersgd
    from distnn.distributed.compressors import TopK
    select, basis = TopK.select, powersgd.orthonormal_basis

    def slow_select(self, acc):
        _burn(0.02)
        return select(self, acc)

    def slow_basis(p):
        _burn(0.02)
        return basis(p)

    monkeypatch.setattr(TopK, "select", slow_select)
    monkeypatch.setattr(powersgd, "orthonormal_basis", slow_basis)
    slow = calibrate_steps(tensors, specs=["topk:0.01", "powersgd:2"], hosts=[2], steps=3,
                           warmup=1)
    # the selection runs as the bucket starts (before), the QR in synchronize (after)
    (_, pre0, _), (_, pre1, _) = base["topk:0.01"][0], slow["topk:0.01"][0]
    assert pre1 >= pre0 + 0.018
    (_, _, post0), (_, _, post1) = base["powersgd:2"][0], slow["powersgd:2"][0]
    assert post1 >= post0 + 0.018


def test_phantom_comm_hands_back_what_the_ranks_would_send():
    import numpy as np
    comm = PhantomComm(4)
    part = np.arange(6, dtype=np.uint8)
    assert comm.iallgatherv(part, [6] * 4).wait().tolist() == list(range(6)) * 4
    assert comm.allgather(np.array([3])).tolist() == [[3]] * 4
    buf = np.ones(1000, np.float32)
    assert comm.iallreduce_(buf).wait() is buf and (buf == 1).all()
    with pytest.raises(ValueError, match="2 or more"):
        PhantomComm(1)


def test_tcp_calibration_on_loopback():
    per_message, per_byte = calibrate_tcp(count=50)
    assert 0 < per_message < 1e-3
    assert 0 < per_byte < 1e-7
    cpu = calibrate_cpu(_small(64), specs=["none"], hosts=[2, 3], steps=2)
    assert cpu.tcp_byte_s > 0 and sorted(h for h, _, _ in cpu.steps["none"]) == [2, 3]


def test_plan_with_cpu(tmp_path, capsys):
    from distnn.cli.main import main
    out, without = tmp_path / "cpu.json", tmp_path / "plain.json"
    common = ["plan", "--compute_s", "0.01", "--hosts", "2,4", "--link_gbits", "1,100"]
    assert main([*common, "--cpu", "--json", str(out)]) == 0
    assert "With the exchange's CPU" in capsys.readouterr().out
    assert main([*common, "--json", str(without)]) == 0
    res, plain = json.loads(out.read_text()), json.loads(without.read_text())
    assert plain["cpu"] is None and res["cpu"]["tcp_byte_s"] > 0
    assert set(res["cpu"]["steps"]) == {"none", "fp16", "topk:0.01", "powersgd:2"}
    for r, p in zip(res["rows"], plain["rows"]):
        assert (r["config"], r["hosts"], r["gbits"]) == (p["config"], p["hosts"], p["gbits"])
        if r["rule"] == "data":
            assert r["step_s"] > p["step_s"], r
        else:
            assert r["step_s"] == p["step_s"]
