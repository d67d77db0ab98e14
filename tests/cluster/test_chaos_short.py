"""The chaos run of issue 44 in a short form (benchmarks/chaos.py with a compressed, fixed
schedule): ``distnn launch`` on 4 emulated hosts, each fault kind once, and the job must
finish with every checkpoint it wrote loading and nothing left behind.

Which test covers which fault kind:

- kill -9 of one rank, of rank 0, of rank 0 during a checkpoint write; a link down for
  3 s (the job goes on) and for longer than --stall_timeout (exit 4, the host dropped);
  a link at 10 Mbit/s; the checkpoint's storage full (a tmpfs: a warning, the job goes
  on); a dropped host that comes back (taken again at the next restart): here.
- kill -9 of every process of a host: tests/cluster/test_launch.py
  (test_a_killed_host_is_dropped_and_the_run_resumes_bit_identical, bit for bit).
- SIGSTOP longer than --stall_timeout (named, dropped, restarted):
  tests/cluster/test_launch.py (test_a_hung_rank_ends_the_job_at_the_stall_timeout_and_
  its_host_is_dropped); named by the stall inspector: tests/cli/test_stall.py.
- SIGSTOP shorter than --stall_timeout (the job goes on): here (the stall warning only).
- a corrupt or truncated checkpoint: tests/cli/test_checkpoint_faults.py (the previous
  checkpoint, ck.prev.npz, is used by --resume and by the supervisor, the same weights
  as an uninterrupted run; node-local copies that differ agree on the newest, and a
  host back is taken again with node-local checkpoints); neither file loads:
  tests/cluster/test_launch.py (test_a_checkpoint_that_will_not_load_is_not_restarted).
- the disk full on 2 plain ranks (a warning, training goes on; at the final save, exit 2
  naming the last good checkpoint): tests/cli/test_checkpoint_faults.py; a failed write
  leaves the previous file: tests/training/test_checkpoint.py.
"""
from __future__ import annotations

import subprocess

import pytest
from cluster_util import needs_cluster

from benchmarks.chaos import Chaos, parser
from benchmarks.chaos_faults import Fault
from benchmarks.chaos_report import analyse


@needs_cluster
@pytest.mark.slow
def test_each_fault_kind_once_and_the_job_finishes():
    args = parser().parse_args([
        "--minutes", "3.5", "--prefix", "dnc", "--net", "78", "--model", "simplemlp",
        "--epochs", "3", "--steps_per_epoch", "150", "--checkpoint_steps", "10",
        "--stall_timeout", "12", "--max_restarts", "12", "--paced", "--at_steps",
        "--disk_mb", "48"])
    h = ["dnc1", "dnc2", "dnc3", "dnc4"]
    # at global steps of the 450 (a machine of any speed sees every fault before the end)
    plan = [Fault("kill_rank", 80, h[1]), Fault("link_down_5s", 110, h[2], 3.0),
            Fault("stop_short", 130, h[3], 3.0), Fault("throttle", 140, h[1], 8.0),  # < the timeout
            Fault("link_down_60s", 170, h[2], 16.0),     # dropped: longer than 12 s
            Fault("kill_rank0", 210, h[0]),              # h3 answers again: taken back
            Fault("kill_in_write", 260, h[0]),
            # 6 s are at most ~100 steps here: the disk has room again before the final save
            Fault("disk_full", 320, h[0], 6.0)]
    chaos = Chaos(args)
    try:
        result = chaos.run(plan)
    finally:
        chaos.teardown()
    rows = {r["kind"]: r for r in analyse(result)}
    said = "\n".join(text for _, text in result["lines"])
    assert result["finished"], said
    assert result["checkpoints_bad"] == 0 and result["checkpoints_loaded"] >= 3
    assert set(rows) == {f.kind for f in plan}, rows
    assert all(r["reached"] for r in rows.values()), rows  # each on a host in the job
    for kind in ("kill_rank", "kill_rank0", "link_down_60s", "kill_in_write"):
        assert rows[kind]["restart"] and rows[kind]["survived"], rows[kind]
    for kind in ("link_down_5s", "stop_short", "throttle", "disk_full"):  # the job goes on
        assert rows[kind]["restart"] is None, rows[kind]
    assert "stall timeout: rank 2 did not arrive" in said       # the link down 16 s
    assert "host dnc3 back;" in said                              # taken again
    # a full disk: one warning line per failed write, the job goes on (nobody relaunches)
    assert "warning: could not write checkpoint" in said and "No space left on device" \
        in said and "training goes on" in said, (rows["disk_full"], said)
    assert rows["disk_full"]["restart"] is None and rows["disk_full"]["survived"]
    assert result["relaunches"] == [], result["relaunches"]
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert "dnc" not in left

