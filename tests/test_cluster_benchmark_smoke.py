"""Smoke tests of benchmarks/cluster.py's options that need no emulated cluster
(benchmarks/cluster_opts.py): link-rate scaling, time to target from evaluations every K
steps, and the network-free rows (the same ranks on one host, shared memory)."""
import argparse
import shutil
import sys
from pathlib import Path

import pytest

from benchmarks import cluster_opts as opts


def test_link_rate_scaled_by_cores_per_host():
    assert opts.link_rate("1gbit", 8, True, ncores=2) == "250mbit"
    assert opts.link_rate("10gbit", 4, True, ncores=2) == "5gbit"
    assert opts.link_rate("1gbit", 2, True, ncores=2) == "1gbit"  # a core each: as named
    assert opts.link_rate("1gbit", 8, False, ncores=2) == "1gbit"
    assert opts.link_rate("1gbit", 3, True, ncores=2) == "666667kbit"
    assert opts.link_rate(opts.NETWORK_FREE, 8, True) == opts.NETWORK_FREE
    assert opts.parse_rate("1.5gbit") == 1.5e9
    with pytest.raises(ValueError, match="rate"):
        opts.parse_rate("1gbps")


def test_time_to_target_from_step_evaluations():
    evals = [{"step": 50, "accuracy": 0.80, "train_s": 1.0},
             {"step": 100, "accuracy": 0.851, "train_s": 2.1},
             {"step": 150, "accuracy": 0.86, "train_s": 3.2}]
    assert opts.time_to_target(evals, 0.85) == {
        "step_to_target": 100, "time_to_target_steps": 2.1, "evals": 3,
        "curve": [[1.0, 0.80], [2.1, 0.851], [3.2, 0.86]]}
    assert opts.time_to_target(evals, 0.9)["step_to_target"] is None


def _needs_mpiexec():
    if shutil.which("mpiexec", path=str(Path(sys.executable).parent)) is None:
        pytest.skip("needs mpiexec")


@pytest.mark.slow
def test_network_free_accuracy_row_evaluates_every_k_steps(tmp_path):
    _needs_mpiexec()
    args = argparse.Namespace(epochs=1, steps_per_epoch=6, eval_every=2, eval_samples=200,
                              target=0.0)
    res = opts.run_rule_local(2, "data", {}, args, tmp_path / "shm.json")
    assert "error" not in res, res
    assert res["evals"] == 3 and res["step_to_target"] == 2  # 6 steps, one every 2
    assert 0 < res["time_to_target_steps"] < res["wall"]
    # benchmarks/cluster_pool.py: the medians of repeated runs, against the reference row
    from benchmarks.cluster_pool import pool, table
    missed = dict(res, time_to_target_steps=None, step_to_target=None)
    rows = pool([{"data/shm": res, "data/1gbit": missed}, {"data/shm": res},
                 {"data/shm": res, "data/1gbit": {"error": "exit 1"}}])
    assert [(r["key"], r["runs"], r["reached"]) for r in rows] == [
        ("data/shm", 3, 3), ("data/1gbit", 1, 0)]
    assert rows[0]["time"] == res["time_to_target_steps"] and rows[1]["time"] is None
    text = table(rows, "data/shm")
    assert "| data | one host (shared memory) | 3 (3) |" in text and "+0%" in text
    assert "| data | 1gbit | 1 (0) | not reached |" in text
    times = [t for t, _ in res["curve"]]  # the curve: every evaluation, in order
    assert len(times) == 3 and times == sorted(set(times))
    assert times[0] == res["time_to_target_steps"] and all(0 <= a <= 1 for _, a in res["curve"])
    from benchmarks.cluster_pool import curves_plot
    curves_plot([{"data/shm": res}, {"data/shm": res, "data/1gbit": missed}], 0.85,
                str(tmp_path / "curves.png"))
    assert (tmp_path / "curves.png").stat().st_size > 5000


@pytest.mark.slow
def test_network_free_throughput_row():
    _needs_mpiexec()
    rec = opts.run_throughput_local("simplecnn", 2, argparse.Namespace(
        warmup=1, windows=2, steps=2))
    assert "error" not in rec, rec
    assert len(rec["samples_per_s"]) == 2 and min(rec["samples_per_s"]) > 0
    # benchmarks/cluster_pool.py pools files of several compressions and repetitions
    from benchmarks.cluster_pool import pool_throughput, throughput_table
    dense = {"meta": {"compression": "none"},
             "throughput": {"simplecnn/2/shm": [rec], "simplecnn/2/1gbit": [rec]}}
    half = {"meta": {"compression": "fp16"}, "throughput": {"simplecnn/2/1gbit": [rec]}}
    pooled = pool_throughput([dense, dense, half])
    assert len(pooled[("simplecnn", 2, "1gbit", "none")]) == 2
    text = throughput_table(pooled, scale=False).splitlines()
    assert text[0].startswith("| model | hosts x ranks | link | none samples/s (runs) | "
                              "fp16 samples/s (runs) | fp16 step / dense step |")
    assert text[2].startswith("| simplecnn | 2 x 1 | one host (shared memory) |")
    assert text[3].startswith("| simplecnn | 2 x 1 | 1gbit |") and text[3].endswith(
        "| 1.00 |")


def test_costmodel_check_errors_per_row():
    from benchmarks.costmodel_check import check
    from distnn.costmodel.predict import Config, Link, ModelCost, predict
    from distnn.distributed.optimizer import parameter_tensors
    from distnn.models import get_model
    net = get_model("simplecnn", input_shape=(1, 28, 28), num_classes=10)
    segs = [(ly.name, lo, hi) for ly, lo, hi in net.layer_ranges()]
    # 4 hosts on 2 cores, scaled: compute 2x the 1-host step, links shaped to 500 Mbit/s
    cost = ModelCost(0.020, parameter_tensors(net), batch=64, segments=segs)
    exact = predict(Config("data"), cost, 4, Link(0.5, 50e-6)).step_s
    raw = {"throughput": {
        "simplecnn/1/None": [{"step_s": [0.010, 0.010], "batch_per_rank": 64}],
        "simplecnn/2/shm": [{"step_s": [0.011]}],
        "simplecnn/4/1gbit": [{"step_s": [exact], "batch_per_rank": 64}],
        "simplecnn/4/10gbit": [{"error": "exit 1"}]}}
    rows = check(raw, 50e-6, cores=2, scale=True)
    assert [r["row"] for r in rows] == ["simplecnn/4/1gbit", "simplecnn/4/10gbit"]
    assert rows[0]["link"] == "500mbit" and rows[0]["compute_s"] == 0.020
    assert rows[0]["rel_error"] == pytest.approx(0.0)
    assert "error" in rows[1]
    raw["throughput"]["simplecnn/4/1gbit"] = [{"step_s": [exact / 1.25]}]
    assert check(raw, 50e-6, 2, True)[0]["rel_error"] == pytest.approx(0.25)


def test_emulated_table_pooled_parsed_and_checked(tmp_path):
    # benchmarks/simgrid_scale.py --emulated: the rows and their measured inputs pooled
    # from cluster.py / cluster_probe.py JSON files, printed, parsed back from RESULTS.md
    import json
    from benchmarks import simgrid_scale as sg
    for rep, step in ((1, 0.0050), (2, 0.0054)):
        (tmp_path / f"t_{rep}.json").write_text(json.dumps({
            "meta": {"compression": "powersgd:2", "parallel": None}, "throughput": {
                "simplecnn/1/None": [{"step_s": [0.0036]}],
                "simplecnn/2/shm": [{"step_s": [0.0045]}],
                "simplecnn/2/1gbit": [{"step_s": [step, step]}],
                "simplecnn/4/1gbit": [{"error": "exit 1"}]}}))
    (tmp_path / "probe.json").write_text(json.dumps({"rows": {
        "2/shm": {"allreduce_s": {"4": [3e-6, 3e-6]}},
        "2/1gbit": {"allreduce_s": {"4": [8e-6, 9e-6]}}}}))
    (tmp_path / "compute.json").write_text(json.dumps({"rows": {
        "compute/1": {"max_mean_s": 0.0040}, "compute/2": {"max_mean_s": 0.0044}}}))
    rows = sg.pool_emulated(sorted(str(p) for p in tmp_path.iterdir()))["rows"]
    assert len(rows) == 1
    r = rows[0]
    assert (r["hosts"], r["link"], r["config"], r["runs"]) == (2, "1gbit",
                                                                "data+powersgd:2", 2)
    assert r["measured_s"] == pytest.approx(0.0052) and r["shm_s"] == 0.0045
    # the compute of 2 hosts at once, in proportion to this configuration's 1-process step
    assert r["compute_s"] == pytest.approx(0.0044 * 0.0036 / 0.0040)
    assert r["alpha_s"] == 9e-6
    from distnn.costmodel.cpu import CpuCost
    cpu = CpuCost({"powersgd:2": [(2, 1e-4, 4e-4)]})
    checked = sg.emulated_check(rows, simulate_too=False, cpu=cpu)
    assert checked[0]["analytic_s"] > r["compute_s"] + 5e-4
    import contextlib
    import io
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        sg.print_emulated(checked)
    text = out.getvalue()
    assert "| 2 x 1 | data+powersgd:2 | 3.96 | 9.0 | 4.50 | 5.20 (2) |" in text
    assert text.splitlines()[2].endswith("| - | - | - |")  # no 10gbit row
    assert "within ±15%: analytic" in text
    results = f"# x\n\n{sg.SECTION} (issue 59)\n\n{text}\n## Next\n| 9 x 9 |\n"
    back = sg.parse_emulated(results)
    assert [(b["hosts"], b["config"], b["runs"]) for b in back] == [
        (2, "data+powersgd:2", 2)]
    assert back[0]["compute_s"] == pytest.approx(r["compute_s"], abs=5e-6)
    assert back[0]["alpha_s"] == pytest.approx(9e-6)


@pytest.mark.slow
def test_network_free_row_runs_hosts_times_ranks_per_host():
    """benchmarks/cluster.py --ranks-per-host 2: the network-free row of 2 hosts is 4 ranks
    on one host, and every record says its ranks per host (the JSON files' format)."""
    _needs_mpiexec()
    from benchmarks.cluster import run_throughput
    rec = run_throughput("simplecnn", 2, opts.NETWORK_FREE, argparse.Namespace(
        warmup=1, windows=2, steps=2, ranks_per_host=2, scale_links=False))
    assert "error" not in rec, rec
    assert rec["ranks"] == 4 and rec["ranks_per_host"] == 2
    assert len(rec["samples_per_s"]) == 2 and min(rec["samples_per_s"]) > 0
