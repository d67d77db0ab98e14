"""hvd.elastic: commits kept and restored in memory; under ``distnn launch`` a killed rank
makes the next world start from the last commit with the same values, a host added raises
HostsUpdatedInterrupt at a commit and the next world has it, and the ElasticSampler never
repeats a committed sample after a reset (tests/torch/progs/elastic_prog.py is the job)."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torchjobs import COMMAND, PROGS, child_env, mpirun, needs_mpi

import distnn.torch as hvd
from distnn.launch.commits import CommitStore, StoreClient
from distnn.launch.elastic import parse_hosts
from distnn.torch.elastic import sampler as sampler_module

PROG = PROGS / "elastic_prog.py"


def test_torch_state_commits_and_restores_in_memory():
    hvd.init()
    model = torch.nn.Linear(3, 2).double()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    state = hvd.elastic.TorchState(model, opt, epoch=1, seen=[1])
    model(torch.ones(4, 3, dtype=torch.float64)).sum().backward()
    opt.step()
    state.epoch = 2
    state.commit()
    kept = [p.detach().clone() for p in model.parameters()]
    momentum = [opt.state[p]["momentum_buffer"].clone() for p in model.parameters()]
    opt.step()
    state.epoch, state.seen = 3, state.seen + [2]
    state.seen.append(3)
    state.restore()
    assert state.epoch == 2 and state.seen == [1]
    assert all(torch.equal(p, k) for p, k in zip(model.parameters(), kept))
    assert all(torch.equal(opt.state[p]["momentum_buffer"], m)
               for p, m in zip(model.parameters(), momentum))
    # the bytes that travel to the next world hold the commit, not the current values
    payload = state._dumps()
    with torch.no_grad():
        model.weight.add_(1.0)
    state.epoch = 9
    state._loads(payload)
    assert state.epoch == 2 and torch.equal(model.weight, kept[0])


def test_object_state_check_host_updates_never_raises_without_a_launch():
    state = hvd.elastic.ObjectState(bcast_object=lambda x: x, get_rank=lambda: 0, step=4)
    state.step = 5
    state.commit()
    state.check_host_updates()
    state.step = 6
    state.restore()
    assert state.step == 5


def _shard(monkeypatch, sampler, ranks):
    """Every rank's indices of ``sampler`` as if there were ``ranks`` ranks."""
    out = []
    for r in range(ranks):
        monkeypatch.setattr(sampler_module, "size", lambda: ranks)
        monkeypatch.setattr(sampler_module, "rank", lambda r=r: r)
        sampler.reset()
        out.append(list(iter(sampler)))
    return out


def test_elastic_sampler_reshards_what_is_left_without_repeats(monkeypatch):
    sampler = hvd.elastic.ElasticSampler(list(range(30)), seed=5)
    three = _shard(monkeypatch, sampler, 3)
    assert sorted(sum(three, [])) == list(range(30)) and len(sampler) == 10
    done = set()
    for b in range(2):  # 2 batches of 2 per rank on 3 ranks
        done.update(i for shard in three for i in shard[2 * b:2 * b + 2])
        sampler.record_batch(b, 2)
    assert sampler.processed_indices == done and sampler.processed_num == 12
    saved = sampler.state_dict()
    fresh = hvd.elastic.ElasticSampler(list(range(30)), seed=5)
    fresh.load_state_dict(saved)  # a reset: the state restored, 2 ranks now
    two = _shard(monkeypatch, fresh, 2)
    rest = sum(two, [])
    assert not done & set(rest) and set(rest) | done == set(range(30)) and len(rest) == 18
    fresh.set_epoch(1)
    assert fresh.processed_num == 0 and len(_shard(monkeypatch, fresh, 2)[0]) == 15


def test_commit_store_keeps_the_last_commit_and_reports_host_changes():
    store = CommitStore("127.0.0.1")
    try:
        host, port = store.address.rsplit(":", 1)
        client = StoreClient(store.address, store.token)
        assert client.get() is None and client.poll() == (0, "")
        assert client.put(b"first") == (0, "")
        store.hosts_changed("added")
        assert client.put(b"second" * 1000) == (1, "added")
        assert client.get() == b"second" * 1000 and store.commits == 2
        store.new_world()
        assert client.poll() == (1, "")
        intruder = StoreClient(store.address, "not-the-token")
        with pytest.raises(ConnectionError):
            intruder.put(b"evil")
        assert client.get() == b"second" * 1000
    finally:
        store.close()


def test_discovery_lines_give_hosts_and_slots():
    assert parse_hosts("h1:2\nh2\n\n h3:1 ", 4) == {"h1": 2, "h2": 4, "h3": 1}


def _events(folder: Path, name: str) -> list[dict]:
    return [json.loads(line) for line in (folder / name).read_text().splitlines()]


def _launch(tmp_path, *args, prog_args=(), timeout=240):
    cmd = [*COMMAND, "launch", *args, "--", sys.executable, str(PROG), "job", "--out",
           str(tmp_path), *prog_args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env=child_env(), cwd=tmp_path)


def _no_committed_sample_repeats(folder: Path, ranks0: int, restored: int):
    """World 0's samples up to step ``restored`` and world 1's: each index once."""
    seen = []
    for r in range(ranks0):
        seen += [i for e in _events(folder, f"r{r}.w0.jsonl")
                 if e.get("step", 0) and e["step"] <= restored for i in e["indices"]]
    for f in folder.glob("r*.w1.jsonl"):
        seen += [i for e in _events(folder, f.name) if "step" in e for i in e["indices"]]
    assert sorted(seen) == list(range(24))


@pytest.mark.slow
@needs_mpi
def test_an_internal_error_restores_the_last_commit_on_every_rank(tmp_path):
    proc = mpirun(2, sys.executable, PROG, "memory", "--out", tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = sorted((json.loads(m) for m in re.findall(r"\{[^{}]*\}", proc.stdout)),
                  key=lambda r: r["rank"])  # (the ranks' lines may run together)
    assert [r["rank"] for r in rows] == [0, 1]
    for r in rows:  # the commit's values, the reset callbacks ran once, weights restored
        assert (r["resets"], r["batch"], r["log"], r["processed"], r["same_weights"]) == \
            (1, 5, ["a"], 4, True)


@pytest.mark.slow
@needs_mpi
def test_a_killed_rank_restarts_the_world_from_the_last_commit(tmp_path):
    proc = _launch(tmp_path, "--hosts", "localhost:2", "--max_restarts", "2",
                   prog_args=("--kill_at", "5"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "restart 1/2" in proc.stderr and "starts from the last commit" in proc.stderr
    events = _events(tmp_path, "events.jsonl")
    last = [e for e in events if e.get("commit") and e["world"] == 0][-1]
    assert last["commit"] == 4  # committed every 2 steps; rank 1 died at step 5
    for r in range(2):
        start = _events(tmp_path, f"r{r}.w1.jsonl")[0]
        assert (start["start"], start["processed"], start["size"]) == (4, 16, 2)
        assert start["weights"] == last["weights"]  # bit for bit
    assert events[-1]["done"] == 6 and events[-1]["resets"] == 1
    _no_committed_sample_repeats(tmp_path, 2, 4)


@pytest.mark.slow
@needs_mpi
def test_a_host_added_interrupts_at_a_commit_and_the_next_world_has_it(tmp_path):
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("localhost:1\n")
    script = tmp_path / "discover.sh"
    script.write_text(f"#!/bin/sh\ncat {hosts}\n")
    script.chmod(0o755)
    proc = _launch(tmp_path, "--hosts", "localhost:1", "--host_discovery_script",
                   str(script), "--discovery_interval", "0.2",
                   prog_args=("--add_slot_at", "2", "--hosts_file", str(hosts),
                              "--commit_every", "1", "--sleep", "0.3"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "hosts changed (added localhost)" in proc.stderr, proc.stderr[-3000:]
    events = _events(tmp_path, "events.jsonl")
    interrupt = [e for e in events if "interrupt" in e]
    assert len(interrupt) == 1 and interrupt[0]["world"] == 0, events
    at = interrupt[0]["interrupt"]
    for r in range(2):  # the new world has both ranks and starts where the first stopped
        start = _events(tmp_path, f"r{r}.w1.jsonl")[0]
        assert (start["size"], start["start"], start["processed"]) == (2, at, 2 * at)
    _no_committed_sample_repeats(tmp_path, 1, at)
