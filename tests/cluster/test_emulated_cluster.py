"""The emulated cluster itself: hosts, addresses, links, tear-down, and that MPI's data
really crosses the shaped links (never shared memory between the emulated hosts)."""
import os
import re
import signal
import subprocess
import sys
import textwrap

import pytest
from cluster_util import NET, PREFIX, make_cluster, needs_cluster, run

from distnn.cluster import total_sent
from distnn.cluster.emulated import MARK

pytestmark = [needs_cluster, pytest.mark.mpi]


def leftovers(prefix=PREFIX) -> list[str]:
    """Everything a cluster of this prefix could leave behind that still exists."""
    out = []
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    out += [f"netns {n}" for n in re.findall(rf"^({prefix}\d+)", netns, re.M)]
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    out += [f"link {n}" for n in re.findall(rf"^\d+: ({prefix}(?:v\d+|br))[@:]", links, re.M)]
    out += [f"/etc/netns/{d}" for d in (os.listdir("/etc/netns") if
                                       os.path.isdir("/etc/netns") else [])
            if re.fullmatch(rf"{prefix}\d+", d)]
    out += [f"state {p}" for p in [f"/run/distnn-cluster/{prefix}"] if os.path.exists(p)]
    return out


def test_up_is_idempotent_and_down_leaves_nothing():
    c = make_cluster(3, rate="1gbit")
    try:
        c.up()
        c.up()  # a second up replaces the first, it does not fail or double anything
        assert [h.name for h in c.hosts] == [f"{PREFIX}1", f"{PREFIX}2", f"{PREFIX}3"]
        for h in c.hosts:
            assert h.address.startswith(f"198.18.{NET}.")
            routes = subprocess.run(["ip", "-n", h.name, "route"], capture_output=True,
                                    text=True).stdout.strip().splitlines()
            # only the bridge's /24: nothing beyond it is reachable from a host
            assert routes == [f"198.18.{NET}.0/24 dev eth0 proto kernel scope link src "
                              f"{h.address}"], routes
            qdisc = subprocess.run(["tc", "-n", h.name, "qdisc", "show", "dev", "eth0"],
                                   capture_output=True, text=True).stdout
            assert "tbf" in qdisc and "rate 1Gbit" in qdisc
            with open(f"/etc/netns/{h.name}/hosts") as f:
                assert MARK in f.readline()
        name = subprocess.run(c.exec_argv(f"{PREFIX}2", ["hostname"]), capture_output=True,
                              text=True, timeout=30).stdout.strip()
        assert name == f"{PREFIX}2"
    finally:
        c.down()
        c.down()
    assert leftovers() == []


def test_a_crashed_set_up_is_cleaned_by_the_next_one(tmp_path):
    # A process that made a cluster and was killed (no tear-down ran) leaves it all behind;
    # the next up() or down() of that prefix removes it.
    script = textwrap.dedent(f"""
        import os, signal
        from distnn.cluster import EmulatedCluster
        EmulatedCluster(2, prefix={PREFIX!r}, net={NET}).up()
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert len(leftovers()) >= 5  # 2 netns, 2 links, bridge, files: the crash left them
    make_cluster(2).down()
    assert leftovers() == []


def test_mpi_data_crosses_the_shaped_link(tmp_path):
    prog = tmp_path / "allreduce.py"
    prog.write_text(textwrap.dedent("""
        import socket, time
        import numpy as np
        from distnn import distributed as dist
        comm = dist.init()
        a = np.ones(4 * 1024 * 1024, np.float32)  # 16 MiB
        comm.allreduce_(a)
        t = time.perf_counter(); comm.allreduce_(a); t = time.perf_counter() - t
        assert np.all(a == comm.size ** 2)
        rows = comm.allgather_obj(f"rank {comm.rank} host {socket.gethostname()} local "
                                  f"{comm.local_size} seconds {t:.4f}")
        if comm.rank == 0:  # one writer: lines of two ranks can interleave
            print(*rows, sep=chr(10), flush=True)
    """))
    with make_cluster(2, rate="1gbit") as c:
        before = c.link_bytes()
        proc = run(c, [sys.executable, str(prog)], timeout=120)
        after = c.link_bytes()
    assert proc.returncode == 0, proc.stderr
    lines = sorted(proc.stdout.strip().splitlines())
    assert [ln.split()[3] for ln in lines] == [f"{PREFIX}1", f"{PREFIX}2"]
    assert all(ln.split()[5] == "1" for ln in lines)  # one rank on each host
    sent = total_sent(before, after)
    # two all-reduces of 16 MiB between 2 hosts: each host sends at least 16 MiB in all
    assert sent >= 2 * 16 * 2**20, sent
    # ...and at 1 Gbit/s one 16 MiB all-reduce cannot be faster than 16 MiB on the wire
    # (shared memory took ~7 ms here)
    seconds = max(float(ln.split()[-1]) for ln in lines)
    assert seconds >= 16 * 2**20 * 8 / 1e9 * 0.9, seconds


def test_unshaped_links_still_cross_the_veth(tmp_path):
    with make_cluster(2, rate=None) as c:
        before = c.link_bytes()
        proc = run(c, [sys.executable, "-c", "from distnn import distributed as d; import "
                       "numpy as np; c = d.init(); c.allreduce_(np.ones(2**20))"],
                   timeout=120)
        after = c.link_bytes()
    assert proc.returncode == 0, proc.stderr
    assert total_sent(before, after) >= 8 * 2**20


def test_bad_arguments_are_named():
    from distnn.cluster import EmulatedCluster
    with pytest.raises(ValueError, match="rate must be a tc rate"):
        EmulatedCluster(2, rate="fast")
    with pytest.raises(ValueError, match="hosts must be"):
        EmulatedCluster(0)
    with pytest.raises(ValueError, match="prefix"):
        EmulatedCluster(2, prefix="Bad-Name")
    with pytest.raises(ValueError, match="net must be"):
        EmulatedCluster(2, net=300)


def test_cores_split_between_hosts():
    cpus = sorted(os.sched_getaffinity(0))
    c = make_cluster(2, cores="split")
    if len(cpus) >= 2:
        assert set(c.hosts[0].cores).isdisjoint(c.hosts[1].cores)
    assert all(c.hosts[i].cores for i in range(2))
    assert make_cluster(2, cores="all").hosts[1].cores == tuple(cpus)
    many = make_cluster(len(cpus) + 1)  # more hosts than cores: one each, round-robin
    assert [h.cores for h in many.hosts][-1] == (cpus[0],)


def test_the_cluster_command_up_run_exec_kill_down():
    from cluster_util import DISTNN

    def cmd(*words):
        return subprocess.run([DISTNN, "cluster", *words], capture_output=True, text=True,
                              timeout=120)
    up = cmd("up", "--hosts", "3", "--prefix", PREFIX, "--net", str(NET), "--rate", "10gbit")
    try:
        assert up.returncode == 0, up.stderr
        assert f"{PREFIX}3: 198.18.{NET}.13" in up.stdout
        ran = cmd("run", "--prefix", PREFIX, "--", DISTNN, "info")
        assert ran.returncode == 0, ran.stderr
        assert "hosts: 3" in ran.stdout and "MB crossed the links" in ran.stderr
        assert cmd("exec", "--prefix", PREFIX, f"{PREFIX}2", "--", "hostname").stdout.strip() \
            == f"{PREFIX}2"
        bad = cmd("kill", "--prefix", PREFIX, f"{PREFIX}9")
        assert bad.returncode == 2 and f"no host '{PREFIX}9'" in bad.stderr
    finally:
        down = cmd("down", "--prefix", PREFIX)
    assert down.returncode == 0 and leftovers() == []
    gone = cmd("status", "--prefix", PREFIX)
    assert gone.returncode == 2 and "distnn cluster up" in gone.stderr
