"""An emulated cluster on one machine: hosts as Linux network namespaces, real TCP links.

Each host is a network namespace with its own hostname (a UTS namespace per process it
runs), its own cores (``taskset``) and one veth link to a bridge in the root namespace,
where the launcher (``mpiexec``) runs. Links can be shaped to a bandwidth with the ``tbf``
qdisc at both ends. Addresses come from the benchmarking range 198.18.0.0/15 (RFC 2544):
the bridge is 198.18.NET.1, host i is 198.18.NET.(10+i), and no host has a route beyond
the bridge's /24, so the emulated hosts talk only to each other and to the bridge.

MPICH's launcher starts ranks on the hosts as it would over ssh
(``mpiexec -launcher ssh -launcher-exec <script> -hosts h1:1,h2:1``): the script enters
the host's namespace. The MPI library must move data over TCP, not shared memory, or the
link is never used (the mpich wheel's UCX found shared memory between namespaces: a
16 MiB all-reduce took 7 ms "at 1 Gbit/s"); ``env()`` sets ``UCX_TLS=tcp`` and
``link_bytes()`` reads the qdisc counters so a measurement can check that data crossed.

Set-up and tear-down are idempotent: ``up()`` first removes whatever a crashed earlier
cluster of the same prefix left behind, and ``down()`` removes namespaces, links, the
bridge, the per-host ``/etc/netns/<host>`` files and the launcher script (only those
marked as this module's). Needs root and iproute2 (``ip``, ``tc``), ``unshare``,
``taskset``.

Example:
    with EmulatedCluster(hosts=2, rate="1gbit") as cluster:
        subprocess.run(cluster.mpiexec(["distnn", "train"]), env=cluster.env(), check=True)
        print(cluster.link_bytes())
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from typing import Sequence

MARK = "distnn-emulated-cluster"
STATE_DIR = "/run/distnn-cluster"
_TOOLS = ("ip", "tc", "unshare", "taskset", "mount")
_RATE = re.compile(r"^\d+(\.\d+)?(bit|kbit|mbit|gbit|tbit)$")
_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}


class ClusterError(RuntimeError):
    """The emulated cluster could not be set up, used or torn down (the message says why)."""


def missing_reason(what: str, root_for: str, tools: tuple[str, ...],
                   packages: str) -> str | None:
    """Why ``what`` cannot run here: not root (``root_for`` says what needs it), or some of
    ``tools`` not installed (``packages``: the Debian packages that bring them); else None."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return f"{what} needs root ({root_for})"
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        return f"{what} needs {', '.join(missing)} (Debian: apt-get install {packages})"
    return None


def unavailable_reason() -> str | None:
    """Why an emulated cluster cannot be made here (not root, a tool missing), or None."""
    return missing_reason("an emulated cluster", "network namespaces, veth links, tc", _TOOLS,
                          "iproute2 util-linux")


def rate_bits(rate: str) -> float:
    """'1gbit' -> 1e9 (tc's rate units)."""
    m = _RATE.match(rate)
    if not m:
        raise ValueError(f"rate must be a tc rate like '1gbit', '10gbit' or '100mbit', got "
                         f"{rate!r}")
    return float(rate[:-len(m.group(2))]) * _UNITS[m.group(2)]


@dataclass(frozen=True)
class Host:
    """One emulated host: its name (namespace and hostname), address, cores and the
    root-namespace end of its link."""

    name: str
    address: str
    cores: tuple[int, ...]
    link: str


def tbf_burst_bytes(rate: str) -> int:
    """The token bucket's depth a link of ``rate`` is shaped with (tc tbf ``burst``): 2 ms
    of the rate, at least 256 KiB. After a pause, that many bytes pass at once, not at
    the rate (the cost model's ``Link.burst_bytes`` for these links)."""
    return max(256, int(rate_bits(rate) / 8 / 1000 / 1024) * 2) * 1024


def _run(*argv: str, check: bool = True, quiet: bool = False) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise ClusterError(f"{' '.join(argv)} failed: {(proc.stderr or proc.stdout).strip()}")
    return proc


class EmulatedCluster:
    """Hosts as network namespaces joined by (optionally shaped) links to one bridge.

    Args:
        hosts: how many hosts (1-200).
        rate: bandwidth of every link, as ``tc`` writes it ('1gbit', '10gbit'); None for
            unshaped veth links.
        prefix: names: hosts are PREFIX1..PREFIXn, the bridge PREFIXbr, links PREFIXv1..
        net: the third octet of the cluster's /24 in 198.18.0.0/16 (two clusters on one
            machine need different prefixes and nets).
        cores: 'split' gives each host its own share of this process's cores (hosts beyond
            the core count share round-robin); 'all' gives every host all of them.
        private_dirs: folders that are private per host (node-local storage): on each host
            the folder is replaced by ``backing(host, folder)``, empty at ``up()``.

    Example:
        cluster = EmulatedCluster(3, rate="10gbit").up(); ...; cluster.down()
    """

    def __init__(self, hosts: int = 2, *, rate: str | None = "1gbit", prefix: str = "h",
                 net: int = 0, cores: str = "split", private_dirs: Sequence[str] = (),
                 state_dir: str = STATE_DIR):
        if not isinstance(hosts, int) or not 1 <= hosts <= 200:
            raise ValueError(f"hosts must be an integer from 1 to 200, got {hosts!r}")
        if rate is not None:
            rate_bits(rate)
        if not re.fullmatch(r"[a-z][a-z0-9]{0,5}", prefix):
            raise ValueError(f"prefix must be 1-6 lowercase letters/digits starting with a "
                             f"letter, got {prefix!r}")
        if not isinstance(net, int) or not 0 <= net <= 255:
            raise ValueError(f"net must be 0-255 (198.18.NET.0/24), got {net!r}")
        if cores not in ("split", "all"):
            raise ValueError(f"cores must be 'split' or 'all', got {cores!r}")
        self.rate, self.prefix, self.net, self.cores_mode = rate, prefix, net, cores
        self.private_dirs = tuple(os.path.abspath(d) for d in private_dirs)
        self.state = os.path.join(state_dir, prefix)
        self.bridge = f"{prefix}br"
        self.bridge_address = f"198.18.{net}.1"
        cpus = sorted(os.sched_getaffinity(0))
        self.hosts = tuple(Host(f"{prefix}{i}", f"198.18.{net}.{10 + i}",
                                self._cores(i - 1, hosts, cpus), f"{prefix}v{i}")
                           for i in range(1, hosts + 1))
        self.launcher_script = os.path.join(self.state, "launch")
        self._up = False

    def _cores(self, i: int, n: int, cpus: list[int]) -> tuple[int, ...]:
        if self.cores_mode == "all" or n == 1:
            return tuple(cpus)
        if n >= len(cpus):
            return (cpus[i % len(cpus)],)
        share = len(cpus) // n
        return tuple(cpus[i * share:(i + 1) * share])

    # -- set-up and tear-down ----------------------------------------------------------
    def up(self) -> "EmulatedCluster":
        """Create the bridge, hosts, links and launcher script (removing leftovers first)."""
        why = unavailable_reason()
        if why:
            raise ClusterError(why)
        self.down()
        try:
            self._create()
        except BaseException:
            self.down()
            raise
        self._up = True
        return self

    def _create(self) -> None:
        os.makedirs(self.state, exist_ok=True)
        with open(os.path.join(self.state, "cluster.json"), "w") as f:
            json.dump({"mark": MARK, "hosts": len(self.hosts), "rate": self.rate,
                       "prefix": self.prefix, "net": self.net, "cores": self.cores_mode,
                       "private_dirs": list(self.private_dirs)}, f)
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        _run("ip", "link", "set", self.bridge, "alias", MARK)
        _run("ip", "addr", "add", f"{self.bridge_address}/24", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")
        launcher_name = socket.gethostname()
        hosts_file = "".join(f"{h.address} {h.name}\n" for h in self.hosts)
        for h in self.hosts:
            folder = f"/etc/netns/{h.name}"
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, "hosts"), "w") as f:
                f.write(f"# {MARK}\n127.0.0.1 localhost\n"
                        f"{self.bridge_address} {launcher_name}\n{hosts_file}")
            _run("ip", "netns", "add", h.name)
            _run("ip", "link", "add", h.link, "type", "veth", "peer", "name", "eth0",
                 "netns", h.name)
            _run("ip", "link", "set", h.link, "alias", MARK)
            _run("ip", "link", "set", h.link, "master", self.bridge, "up")
            _run("ip", "-n", h.name, "addr", "add", f"{h.address}/24", "dev", "eth0")
            _run("ip", "-n", h.name, "link", "set", "eth0", "up")
            _run("ip", "-n", h.name, "link", "set", "lo", "up")
            if self.rate:
                burst = f"{tbf_burst_bytes(self.rate) // 1024}kb"
                for ns in ((), ("-n", h.name)):
                    dev = h.link if not ns else "eth0"
                    _run("tc", *ns, "qdisc", "add", "dev", dev, "root", "tbf", "rate",
                         self.rate, "burst", burst, "latency", "50ms")
            for d in self.private_dirs:
                os.makedirs(d, exist_ok=True)
                os.makedirs(self.backing(h.name, d), exist_ok=True)
        self._write_launcher()

    @classmethod
    def existing(cls, prefix: str = "h", state_dir: str = STATE_DIR) -> "EmulatedCluster":
        """The cluster of ``prefix`` that an earlier ``up()`` (another process) left up."""
        try:
            with open(os.path.join(state_dir, prefix, "cluster.json")) as f:
                spec = json.load(f)
        except (OSError, ValueError):
            raise ClusterError(f"no emulated cluster {prefix!r} is up (no "
                               f"{os.path.join(state_dir, prefix, 'cluster.json')}); start "
                               "one with: distnn cluster up") from None
        cluster = cls(spec["hosts"], rate=spec["rate"], prefix=spec["prefix"], net=spec["net"],
                      cores=spec["cores"], private_dirs=spec["private_dirs"],
                      state_dir=state_dir)
        cluster._up = True
        return cluster

    def backing(self, host: str, folder: str) -> str:
        """Where ``folder`` lives on ``host`` when it is one of ``private_dirs``."""
        return os.path.join(self.state, "disk", host, os.path.abspath(folder).lstrip("/"))

    def _write_launcher(self) -> None:
        cases = []
        for h in self.hosts:
            mounts = "".join(f"mount --bind {shlex.quote(self.backing(h.name, d))} "
                             f"{shlex.quote(d)} && " for d in self.private_dirs)
            cpus = ",".join(map(str, h.cores))
            cases.append(f'  {h.name}) pre="hostname {h.name} && {mounts}"; cpus={cpus}; '
                         f'link={h.link} ;;')
        script = "\n".join([
            "#!/bin/sh",
            f"# {MARK}: hydra runs this as it would run ssh: [options] host command...",
            'while [ $# -gt 0 ]; do case "$1" in -*) shift ;; *) break ;; esac; done',
            'host="$1"; shift',
            'case "$host" in', *cases,
            '  *) echo "emulated cluster: no host $host" >&2; exit 255 ;;',
            "esac",
            # ssh needs the network: a host whose link is down does not answer (a probe,
            # a launch), as a real one would not
            'if [ "$(cat /sys/class/net/$link/operstate 2>/dev/null)" = down ]; then echo '
            '"ssh: connect to host $host: Network is unreachable (emulated link $link down)"'
            ' >&2; exit 255; fi',
            # The command arrives as words for a remote shell (hydra quotes the proxy's
            # path): the inner sh joins and re-parses them, as sshd's shell would.
            'ip netns exec "$host" unshare --uts --mount --propagation private -- '
            'sh -c "$pre exec taskset -c $cpus $*"',
            "status=$?",
            # As ssh says "Connection to HOST closed" when a host goes away: a launch
            # whose processes were killed names its host (hydra's own message does not).
            'if [ $status -gt 128 ]; then echo "[$host] lost: its processes ended by '
            'signal $((status - 128)) (emulated host $host died or was killed)" >&2; fi',
            "exit $status",
            ""])
        with open(self.launcher_script, "w") as f:
            f.write(script)
        os.chmod(self.launcher_script, 0o755)

    def down(self) -> None:
        """Remove this prefix's namespaces, links, bridge, /etc/netns files and script.

        Safe to call at any time, also when nothing exists or after a crash."""
        marked = _marked_links()
        for h in self.hosts:
            self.kill(h.name, signal.SIGKILL, quiet=True)
        for name in _run("ip", "netns", "list", check=False).stdout.split():
            if re.fullmatch(rf"{self.prefix}\d+", name) and _netns_is_ours(name):
                self.kill(name, signal.SIGKILL, quiet=True)
                _run("ip", "netns", "del", name, check=False)
                shutil.rmtree(f"/etc/netns/{name}", ignore_errors=True)
        for link in marked:
            if re.fullmatch(rf"{self.prefix}(v\d+|br)", link):
                _run("ip", "link", "del", link, check=False)
        for h in self.hosts:  # files of a set-up that failed before its namespace existed
            if _netns_is_ours(h.name) and h.name not in _netns_names():
                shutil.rmtree(f"/etc/netns/{h.name}", ignore_errors=True)
        shutil.rmtree(self.state, ignore_errors=True)
        self._up = False

    def __enter__(self) -> "EmulatedCluster":
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()

    # -- use -----------------------------------------------------------------------------
    def host_list(self, ranks_per_host: int = 1, hosts: Sequence[str] | None = None) -> str:
        names = list(hosts) if hosts is not None else [h.name for h in self.hosts]
        return ",".join(f"{n}:{ranks_per_host}" for n in names)

    def mpiexec(self, argv: Sequence[str], ranks_per_host: int = 1,
                hosts: Sequence[str] | None = None, mpiexec: str | None = None) -> list[str]:
        """The argv of an ``mpiexec`` that starts ``argv`` on the hosts (hydra, ssh
        launcher through this cluster's script)."""
        names = list(hosts) if hosts is not None else [h.name for h in self.hosts]
        launcher = mpiexec or _default_mpiexec()
        return [launcher, "-launcher", "ssh", "-launcher-exec", self.launcher_script,
                "-hosts", self.host_list(ranks_per_host, names),
                "-n", str(ranks_per_host * len(names)), *argv]

    def env(self, base: dict | None = None) -> dict:
        """Environment for an mpiexec on the cluster: MPI over TCP only (never shared
        memory between the emulated hosts), gloo on the hosts' link."""
        env = dict(os.environ if base is None else base)
        env.update(UCX_TLS="tcp", UCX_NET_DEVICES="eth0", GLOO_SOCKET_IFNAME="eth0",
                   FI_PROVIDER="tcp")
        return env

    def exec_argv(self, host: str, argv: Sequence[str]) -> list[str]:
        """argv that runs ``argv`` on ``host`` (its namespace, hostname, cores, disks)."""
        return [self.launcher_script, host, shlex.join(argv)]

    def pids(self, host: str) -> list[int]:
        out = _run("ip", "netns", "pids", host, check=False).stdout
        return [int(p) for p in out.split() if p.isdigit()]

    def kill(self, host: str, sig: int = signal.SIGKILL, quiet: bool = False) -> list[int]:
        """Send ``sig`` to every process running on ``host``; returns their pids."""
        pids = self.pids(host)
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        return pids

    def link_bytes(self) -> dict[str, dict[str, int]]:
        """Bytes each host's link carried so far: {'h1': {'sent': .., 'received': ..}} —
        from the tbf qdiscs' counters when the links are shaped, else veth counters."""
        out = {}
        for h in self.hosts:
            if self.rate:
                sent = _qdisc_bytes(("-n", h.name), "eth0")
                received = _qdisc_bytes((), h.link)
            else:
                stats = f"/sys/class/net/{h.link}/statistics"
                with open(f"{stats}/rx_bytes") as f:
                    sent = int(f.read())
                with open(f"{stats}/tx_bytes") as f:
                    received = int(f.read())
            out[h.name] = {"sent": sent, "received": received}
        return out

    def wait_gone(self, host: str, timeout: float = 10.0) -> bool:
        end = time.monotonic() + timeout
        while self.pids(host) and time.monotonic() < end:
            time.sleep(0.05)
        return not self.pids(host)


def total_sent(before: dict, after: dict) -> int:
    """Bytes all hosts sent between two ``link_bytes()`` readings."""
    return sum(after[h]["sent"] - before[h]["sent"] for h in after)


def _qdisc_bytes(ns: tuple[str, ...], dev: str) -> int:
    text = _run("tc", *ns, "-s", "qdisc", "show", "dev", dev).stdout
    m = re.search(r"Sent (\d+) bytes", text)
    if not m:
        raise ClusterError(f"no qdisc counters on {dev}: {text.strip()!r}")
    return int(m.group(1))


def _netns_names() -> list[str]:
    return [line.split()[0] for line in
            _run("ip", "netns", "list", check=False).stdout.splitlines() if line.strip()]


def _netns_is_ours(name: str) -> bool:
    try:
        with open(f"/etc/netns/{name}/hosts") as f:
            return MARK in f.readline()
    except OSError:
        return False


def _marked_links() -> list[str]:
    out = _run("ip", "-o", "link", "show", check=False).stdout
    names = []
    for line in out.splitlines():
        if f"alias {MARK}" in line:
            names.append(line.split(":")[1].strip().split("@")[0])
    return names


def _default_mpiexec() -> str:
    import sys
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return here if os.path.exists(here) else (shutil.which("mpiexec") or "mpiexec")
