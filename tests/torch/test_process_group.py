"""distnn.torch.init_process_group: PyTorch's own FSDP2 (``fully_shard`` with Adam) and
pipelining (``ScheduleGPipe``, 2 stages) in one script (progs/torch_dist_prog.py) under
``mpiexec -n 2`` and ``distnn launch`` through that call give, bit for bit, what the same
script gives under torchrun's environment, and what one process computes (the mean of the
ranks' losses; gradient accumulation over the micro-batches); on two emulated hosts, the
ranks meet at rank 0's host address and the same weights come out. The rendezvous address
and the refusals are checked here, in this process."""
from __future__ import annotations

import datetime
import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as tdist

import distnn.torch as hvd
from distnn.cluster import EmulatedCluster, total_sent, unavailable_reason
from distnn.distributed import LocalComm
from distnn.torch.process_group import rendezvous_address

from helpers import child_env
from torchjobs import COMMAND, MPIEXEC, PROGS, needs_mpi

PROG = PROGS / "torch_dist_prog.py"
sys.path.insert(0, str(PROGS))
import torch_dist_prog as P  # noqa: E402 (the programme's models, data and steps)

START = {"fsdp": (0, P.FSDP_WIDTHS), "gpipe": (1, P.PIPE_WIDTHS)}  # seed, widths
ENV_KEYS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK",
            "LOCAL_WORLD_SIZE")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("torch_dist")
    ours = subprocess.Popen([MPIEXEC, "-n", "2", sys.executable, str(PROG), "mpi", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=child_env())
    env = subprocess.run([sys.executable, str(PROG), "env", "2", str(out)],
                         capture_output=True, text=True, env=child_env(), timeout=300)
    text = ours.communicate(timeout=300)[0]
    assert ours.returncode == 0, text[-3000:]
    assert env.returncode == 0, (env.stdout + env.stderr)[-3000:]
    return {how: torch.load(out / f"{how}.pt", weights_only=False) for how in ("mpi", "env")}


def _one_process_fsdp() -> dict:
    model = P.mlp(0, P.FSDP_WIDTHS)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for s in range(P.STEPS):  # FSDP2 averages the ranks' gradients: the mean of their losses
        loss = sum(P.mse(model(x), y) for x, y in (P.batch(s, r) for r in range(2))) / 2
        loss.backward()
        opt.step()
        opt.zero_grad()
    return model.state_dict()


def _one_process_gpipe() -> dict:
    model = P.mlp(1, P.PIPE_WIDTHS)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for s in range(P.STEPS):  # accumulated over the micro-batches, scaled by their number
        x, y = P.batch(s, 0, rows=16)
        opt.zero_grad()
        for a, b in zip(x.chunk(P.MICRO), y.chunk(P.MICRO)):
            (P.mse(model(a), b) / P.MICRO).backward()
        opt.step()
    return model.state_dict()


def _same(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for k in b:
        assert torch.equal(a[k], b[k]), k


@pytest.mark.slow
@needs_mpi
@pytest.mark.parametrize("part, reference", [("fsdp", _one_process_fsdp),
                                             ("gpipe", _one_process_gpipe)])
def test_under_mpiexec_as_under_torchrun_and_as_one_process(runs, part, reference):
    _same(runs["mpi"][part]["params"], runs["env"][part]["params"])
    ref = reference()
    start = P.mlp(*START[part]).state_dict()
    assert any(not torch.equal(ref[k], start[k]) for k in ref)  # the steps moved the weights
    assert sorted(ref) == sorted(runs["mpi"][part]["params"])
    for k, v in runs["mpi"][part]["params"].items():
        torch.testing.assert_close(v, ref[k], rtol=1e-12, atol=1e-14)


@pytest.mark.slow
@needs_mpi
def test_fsdp2_holds_half_of_each_parameter_per_rank(runs):
    full = runs["mpi"]["fsdp"]["params"]
    assert runs["mpi"]["fsdp"]["local_numel"] == {k: v.numel() // 2 for k, v in full.items()}


@pytest.mark.slow
@needs_mpi
def test_the_environment_is_torchruns(runs):
    for how in ("mpi", "env"):
        seen = runs[how]["env"]
        assert [s["rank"] for s in seen] == [0, 1] and {s["size"] for s in seen} == {2}
        assert {s["backend"] for s in seen} == {"gloo"}
        for r, s in enumerate(seen):
            assert (s["MASTER_ADDR"], s["RANK"], s["WORLD_SIZE"], s["LOCAL_RANK"],
                    s["LOCAL_WORLD_SIZE"]) == ("127.0.0.1", str(r), "2", str(r), "2")
        assert seen[0]["MASTER_PORT"] == seen[1]["MASTER_PORT"]


@pytest.mark.slow
@needs_mpi
def test_under_distnn_launch(runs, tmp_path):
    proc = subprocess.run([*COMMAND, "launch", "--hosts", "localhost:2", "--mpiexec", MPIEXEC,
                           "--", sys.executable, str(PROG), "mpi", str(tmp_path), "launch"],
                          capture_output=True, text=True, env=child_env(), cwd=tmp_path,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    launched = torch.load(tmp_path / "launch.pt", weights_only=False)
    for part in ("fsdp", "gpipe"):
        _same(launched[part]["params"], runs["mpi"][part]["params"])


@pytest.mark.slow
@needs_mpi
@pytest.mark.skipif(unavailable_reason() is not None, reason=f"emulated cluster: "
                    f"{unavailable_reason()}")
def test_on_two_emulated_hosts_the_rendezvous_is_rank_0s_address(runs, tmp_path):
    # its own names and /24 (DISTNN_TEST_PG_CLUSTER="prefix,net" moves them)
    prefix, net = os.environ.get("DISTNN_TEST_PG_CLUSTER", "dnpg,93").split(",")
    with EmulatedCluster(2, rate="1gbit", prefix=prefix, net=int(net)) as c:
        before = c.link_bytes()
        proc = subprocess.run(c.mpiexec([sys.executable, str(PROG), "mpi", str(tmp_path),
                                         "hosts"], 1, mpiexec=MPIEXEC),
                              env=c.env(child_env()), capture_output=True, text=True,
                              timeout=300)
        sent = total_sent(before, c.link_bytes())
        first = c.hosts[0].address
    assert proc.returncode == 0, proc.stderr[-3000:]
    hosts = torch.load(tmp_path / "hosts.pt", weights_only=False)
    assert [s["MASTER_ADDR"] for s in hosts["env"]] == [first, first]
    assert [s["LOCAL_RANK"] for s in hosts["env"]] == ["0", "0"]  # one rank per host
    numel = sum(v.numel() for v in hosts["fsdp"]["params"].values())
    assert sent >= P.STEPS * numel * 8, sent  # FSDP2's gathers and reductions crossed the link
    for part in ("fsdp", "gpipe"):
        _same(hosts[part]["params"], runs["mpi"][part]["params"])


def test_the_rendezvous_address():
    assert rendezvous_address(["n1", "n1", "n1"]) == "127.0.0.1"  # one host: loopback
    with pytest.raises(RuntimeError, match="pass master_addr="):
        rendezvous_address(["no-such-host.invalid", "other"])


def test_a_loopback_name_on_several_hosts_takes_the_socket_interface(monkeypatch):
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    assert rendezvous_address(["localhost", "other"]) == "127.0.0.1"  # lo's own address
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "no-such-if0")
    with pytest.raises(RuntimeError, match="GLOO_SOCKET_IFNAME"):
        rendezvous_address(["localhost", "other"])


def test_one_process_group_and_the_refusals(monkeypatch):
    for k in ENV_KEYS:  # restored after the test
        monkeypatch.setenv(k, "unset")
    for kwargs, match in [({"rank": 0}, "rank= comes from MPI"),
                          ({"master_port": 70000}, "master_port must be"),
                          ({"init_method": "env://"}, "init_method= comes from MPI")]:
        with pytest.raises(ValueError, match=match):
            hvd.init_process_group("gloo", comm=LocalComm(), **kwargs)
    hvd.init_process_group("gloo", comm=LocalComm(), timeout=datetime.timedelta(seconds=60))
    try:
        assert (tdist.get_rank(), tdist.get_world_size(), tdist.get_backend()) == (0, 1, "gloo")
        assert [os.environ[k] for k in ENV_KEYS if k != "MASTER_PORT"] == \
            ["127.0.0.1", "0", "1", "0", "1"]
        assert 0 < int(os.environ["MASTER_PORT"]) < 65536
        t = torch.ones(3)
        tdist.all_reduce(t)
        assert t.tolist() == [1.0, 1.0, 1.0]
        with pytest.raises(RuntimeError, match="already initialized"):
            hvd.init_process_group("gloo", comm=LocalComm())
    finally:
        tdist.destroy_process_group()
