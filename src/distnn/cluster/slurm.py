"""Slurm on the emulated cluster: ``srun`` launches ranks on the namespace hosts.

Layout (for an ``EmulatedCluster`` with prefix ``s`` and net 5, hosts s1, s2, ...):

* one ``munged`` in the root namespace with this instance's own key and socket
  (``STATE/munge/munge.socket``; Slurm finds it through ``AuthInfo=socket=...``), so it
  neither needs nor touches the machine's ``/etc/munge`` or ``/run/munge``. A Unix socket
  is a path, not a network address: the daemons in the host namespaces reach it too.
* ``slurmctld`` in the root namespace (where ``srun`` runs, as on a login node), in a UTS
  namespace of its own whose hostname is ``PREFIXctl`` (a controller must run on the host
  named by ``SlurmctldHost``); the hosts reach it at the bridge address,
  ``SlurmctldHost=sctl(198.18.5.1)``. It listens on ``port`` (6817) of the root namespace.
* one ``slurmd`` per host, started like an MPI rank of the cluster (the host's network
  namespace, hostname and cores), as ``NodeName=s1 NodeAddr=198.18.5.11 CPUs=<the host's
  cores>``. It finds its node by its hostname, so one ordinary ``slurmd`` per host works
  without ``--enable-multiple-slurmd``. A synthetic hwloc topology of the host's cores
  (``HWLOC_SYNTHETIC``) makes its hardware detection agree (hwloc reads the machine, not
  the affinity). Each host gets a private ``/dev/shm`` (tmpfs in slurmd's mount
  namespace) and ``TmpFS=STATE/tmp/%n`` (PMIx's per-step folders): the hosts share one
  file system, and both would collide between hosts or with an aborted job's leftovers.
  The tasks it starts inherit the host's namespace, hostname, cores and ``/dev/shm``.
* a minimal ``slurm.conf`` (``STATE/slurm.conf``; ``env()`` sets ``SLURM_CONF``):
  ``SlurmUser=root``, ``ProctrackType=proctrack/linuxproc``, ``TaskPlugin=task/none``,
  ``SelectType=select/cons_tres``, ``MpiDefault=pmi2``, no accounting; ``cgroup.conf``
  names ``cgroup/v1`` because slurmd 22.05 loads a cgroup plugin even so and cannot
  autodetect one under ``ip netns exec``'s fresh ``/sys``. State, spool, logs and pid files
  live under ``STATE`` (``/run/distnn-slurm/PREFIX``).

MPI: ``srun --mpi=pmi2`` serves the PMI-1 and PMI-2 wire protocols on the ``PMI_FD`` it
gives each task; the mpich wheel's ``libmpi`` speaks PMI-1 (it has no PMI-2 or PMIx
client: ``MPIR_CVAR_PMI_VERSION=2`` or ``x`` aborts in ``MPIR_pmi_init`` even under its own
hydra, and under ``srun --mpi=pmix`` it says "Runtime environment uses unsupported PMI
version PMIx"). ``env()`` forces MPI over TCP (``EmulatedCluster.env()``) and MPICH's OFI
netmod, whose address fits Slurm's PMI-1 requests (see ``env()``).

Set-up and tear-down are idempotent: ``up()`` first ends what a crashed earlier instance of
the same prefix left (its daemons are found by the state folder in their command line, the
slurmd's and their jobs by being in a host namespace) and ``down()`` ends munged,
slurmctld, every slurmd with its steps and tasks, and removes the state folder. Needs root
and Debian's ``slurmctld``, ``slurmd``, ``slurm-client`` and ``munge`` packages
(``--mpi=pmix`` also ``libpmix-dev``: Slurm's plugin opens ``libpmix.so``).

Example:
    with EmulatedCluster(2, prefix="s", net=5) as cluster, EmulatedSlurm(cluster) as slurm:
        subprocess.run(slurm.srun_argv(["distnn", "info"]), env=slurm.env(), check=True)
"""
from __future__ import annotations

import os
import random
import re
import shlex
import shutil
import signal
import subprocess
import time
from typing import Sequence

from .emulated import ClusterError, EmulatedCluster, missing_reason
from ..launch.procs import _alive, _kill, _netns_inode, _processes, _signal_group

STATE_DIR = "/run/distnn-slurm"
_TOOLS = ("munged", "slurmctld", "slurmd", "srun", "sinfo", "scontrol")
_DAEMONS = ("munged", "slurmctld", "slurmd", "slurmstepd")


# slurmd (22.05) loads a cgroup plugin even with proctrack/linuxproc and task/none, and by
# default picks v1 or v2 from the file system on /sys/fs/cgroup. ``ip netns exec`` mounts a
# fresh /sys for the host's namespace, without the cgroup mounts, so the autodetection
# fails ("No filesystem mounted on /sys/fs/cgroup", "slurmd initialization failed").
# Naming the plugin skips the detection; with these plugins nothing else uses cgroups.
CGROUP_CONF = "CgroupPlugin=cgroup/v1\nCgroupAutomount=no\n"


class SlurmError(ClusterError):
    """Slurm could not be started, used or stopped on the emulated cluster."""


def unavailable_reason() -> str | None:
    """Why Slurm cannot run on an emulated cluster here (not root, a program missing)."""
    return missing_reason("Slurm on the emulated cluster", "namespaces, daemons as root",
                          _TOOLS, "slurmctld slurmd slurm-client munge")


class EmulatedSlurm:
    """munged, slurmctld and one slurmd per host of an (up) ``EmulatedCluster``.

    Args:
        cluster: the emulated cluster (already up) whose hosts become Slurm nodes.
        port: slurmctld's port in the root namespace (slurmd's is ``port + 1``, in each
            host's own namespace).
        partition: the one (default) partition, holding every host.
        timeout: seconds to wait for the daemons and for every node to be idle.
        state_dir: parent of the state folder (``state_dir/PREFIX``).

    Example:
        slurm = EmulatedSlurm(cluster).up(); slurm.srun_argv(["hostname"]); slurm.down()
    """

    def __init__(self, cluster: EmulatedCluster, *, port: int = 6817, partition: str = "emu",
                 timeout: float = 60.0, state_dir: str = STATE_DIR):
        if not 1024 <= port <= 65534:
            raise ValueError(f"port must be 1024-65534, got {port!r}")
        if not re.fullmatch(r"[a-z][a-z0-9_]{0,14}", partition):
            raise ValueError(f"partition must be a short lowercase name, got {partition!r}")
        self.cluster, self.port, self.partition, self.timeout = cluster, port, partition, timeout
        self.state = os.path.join(state_dir, cluster.prefix)
        self.conf = os.path.join(self.state, "slurm.conf")
        self.munge_socket = os.path.join(self.state, "munge", "munge.socket")
        self.controller = f"{cluster.prefix}ctl"
        # job ids (and so PMI kvsnames) differ from one instance to the next
        self.first_job_id = random.randint(1000, 60_000_000)
        self._procs: list[subprocess.Popen] = []

    # -- set-up and tear-down ----------------------------------------------------------
    def up(self) -> "EmulatedSlurm":
        """Start munged, slurmctld and the slurmds; wait until every node is idle."""
        why = unavailable_reason()
        if why:
            raise SlurmError(why)
        if not os.path.exists(self.cluster.launcher_script):
            raise SlurmError(f"the emulated cluster {self.cluster.prefix!r} is not up "
                             "(EmulatedCluster.up() first)")
        self.down()
        try:
            self._start()
        except BaseException:
            self.down()
            raise
        return self

    def _start(self) -> None:
        for sub in ("munge", "ctld", "spool", "log"):
            os.makedirs(os.path.join(self.state, sub), exist_ok=True)
        # munged checks that everyone can reach its socket's folder and that only its
        # user can read the key.
        for folder in (os.path.dirname(self.state), self.state,
                       os.path.join(self.state, "munge")):
            os.chmod(folder, 0o755)
        key = os.path.join(self.state, "munge.key")
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o400)
        with os.fdopen(fd, "wb") as f:
            f.write(os.urandom(1024))
        for h in self.cluster.hosts:
            for sub in ("spool", "tmp"):
                os.makedirs(os.path.join(self.state, sub, h.name), exist_ok=True)
        with open(self.conf, "w") as f:
            f.write(self.slurm_conf())
        with open(self._path("cgroup.conf"), "w") as f:
            f.write(CGROUP_CONF)
        self._spawn("munged", ["munged", "-F", f"--socket={self.munge_socket}",
                               f"--key-file={key}", f"--pid-file={self._path('munge/pid')}",
                               f"--log-file={self._path('log/munged.log')}",
                               f"--seed-file={self._path('munge/seed')}"])
        self._wait(lambda: os.path.exists(self.munge_socket), "munged's socket")
        self._spawn("slurmctld", ["unshare", "--uts", "--", "sh", "-c",
                                  f'hostname {self.controller} && exec "$@"', "sh",
                                  "slurmctld", "-D", "-f", self.conf])
        self._wait(lambda: self._ping(), "slurmctld to answer (scontrol ping)")
        for h in self.cluster.hosts:
            # Each host gets its own /dev/shm (a tmpfs in slurmd's private mount namespace,
            # gone with its last process): MPICH names its shared-memory segment after the
            # PMI kvsname (the Slurm job and step ids), and a segment an aborted job left
            # in the machine's /dev/shm made the next job of that id fail in
            # MPIDI_POSIX_comm_bootstrap ("Out of memory").
            script = (f"mount -t tmpfs -o mode=1777 {h.name}shm /dev/shm && "
                      f"exec slurmd -D -f {shlex.quote(self.conf)}")
            # hwloc (slurmd's hardware detection) reads the machine, not the taskset: a
            # synthetic topology of the host's cores makes slurmd find CPUs=<its cores>.
            topology = (f"package:1 core:{len(h.cores)} "
                        f"pu:1(indexes={','.join(map(str, h.cores))})")
            self._spawn(f"slurmd.{h.name}", self.cluster.exec_argv(h.name, ["sh", "-c", script]),
                        HWLOC_SYNTHETIC=topology, HWLOC_THISSYSTEM="1")
        self._wait(self._all_idle, "every node idle (sinfo)")

    def _path(self, rel: str) -> str:
        return os.path.join(self.state, rel)

    def _spawn(self, name: str, argv: Sequence[str], **env: str) -> None:
        log = open(self._path(f"log/{name}.out"), "ab")
        try:
            proc = subprocess.Popen(list(argv), stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True,
                                    env={**self.env(), **env})
        finally:
            log.close()
        self._procs.append(proc)

    def _wait(self, ready, what: str) -> None:
        end = time.monotonic() + self.timeout
        while time.monotonic() < end:
            for proc in self._procs:
                if proc.poll() is not None:
                    raise SlurmError(f"{' '.join(map(str, proc.args))} exited with "
                                     f"{proc.returncode} while waiting for {what}:\n"
                                     f"{self.logs()}")
            if ready():
                return
            time.sleep(0.2)
        raise SlurmError(f"timed out after {self.timeout:g} s waiting for {what}:\n"
                         f"{self.logs()}")

    def _ping(self) -> bool:
        proc = subprocess.run(["scontrol", "ping"], capture_output=True, text=True,
                              env=self.env())
        return proc.returncode == 0 and "UP" in proc.stdout

    def node_states(self) -> dict[str, str]:
        """{'s1': 'idle', ...} as ``sinfo`` reports them."""
        proc = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True,
                              text=True, env=self.env())
        states = {}
        for line in proc.stdout.splitlines():
            parts = line.split()
            if len(parts) == 2:
                states[parts[0]] = parts[1]
        return states

    def _all_idle(self) -> bool:
        states = self.node_states()
        return all(states.get(h.name) == "idle" for h in self.cluster.hosts)

    def logs(self, tail: int = 20) -> str:
        """The last lines of every daemon's log (for error messages)."""
        out = []
        folder = self._path("log")
        for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
            with open(os.path.join(folder, name), errors="replace") as f:
                lines = f.read().splitlines()[-tail:]
            if lines:
                out.append(f"--- {name}\n" + "\n".join(lines))
        return "\n".join(out)

    def down(self) -> None:
        """End this prefix's munged, slurmctld, slurmds (with their steps and tasks) and
        remove the state folder. Safe at any time, also after a crash."""
        for proc in self._procs:
            _signal_group(proc.pid, signal.SIGTERM)
        victims = self._leftovers()
        for pid in victims:
            _kill(pid, signal.SIGTERM)
        # slurmctld and slurmd take seconds to end after a job (they save state and talk
        # to each other); the state is thrown away, so they get one second.
        end = time.monotonic() + 1
        while time.monotonic() < end and any(_alive(p) for p in victims):
            time.sleep(0.1)
        for pid in victims:
            _kill(pid, signal.SIGKILL)
        for proc in self._procs:
            _signal_group(proc.pid, signal.SIGKILL)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        self._procs = []
        shutil.rmtree(self.state, ignore_errors=True)
        try:
            os.rmdir(os.path.dirname(self.state))  # only when no other prefix uses it
        except OSError:
            pass

    def _leftovers(self) -> list[int]:
        """Our daemons (by the state folder in their command line), and every slurmd or
        slurmstepd in one of the cluster's host namespaces with all their descendants."""
        procs = _processes()
        host_ns = {_netns_inode(h.name) for h in self.cluster.hosts} - {None}
        roots = []
        for pid, (_ppid, comm, cmdline, netns) in procs.items():
            if pid == os.getpid() or comm not in _DAEMONS:
                continue
            if self.state + "/" in cmdline or (netns in host_ns and comm in
                                               ("slurmd", "slurmstepd")):
                roots.append(pid)
        children: dict[int, list[int]] = {}
        for pid, (ppid, *_rest) in procs.items():
            children.setdefault(ppid, []).append(pid)
        out, todo = [], list(roots)
        while todo:
            pid = todo.pop()
            if pid not in out:
                out.append(pid)
                todo.extend(children.get(pid, []))
        return out

    def __enter__(self) -> "EmulatedSlurm":
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()

    # -- configuration and use ---------------------------------------------------------
    def slurm_conf(self) -> str:
        """The text of ``slurm.conf`` for this cluster."""
        c = self.cluster
        nodes = "\n".join(f"NodeName={h.name} NodeAddr={h.address} CPUs={len(h.cores)} "
                          "State=UNKNOWN" for h in c.hosts)
        names = ",".join(h.name for h in c.hosts)
        return f"""\
# distnn emulated Slurm ({c.prefix}): written by distnn.cluster.slurm, removed by down()
ClusterName=distnn{c.prefix}
SlurmctldHost={self.controller}({c.bridge_address})
SlurmctldPort={self.port}
SlurmdPort={self.port + 1}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.munge_socket}
StateSaveLocation={self._path('ctld')}
SlurmdSpoolDir={self._path('spool')}/%n
TmpFS={self._path('tmp')}/%n
SlurmctldPidFile={self._path('ctld/slurmctld.pid')}
SlurmdPidFile={self._path('spool')}/slurmd.%n.pid
SlurmctldLogFile={self._path('log/slurmctld.log')}
SlurmdLogFile={self._path('log')}/slurmd.%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
MpiDefault=pmi2
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
FirstJobId={self.first_job_id}
SlurmdTimeout=120
InactiveLimit=0
KillWait=5
MinJobAge=60
{nodes}
PartitionName={self.partition} Nodes={names} Default=YES MaxTime=INFINITE State=UP
"""

    def env(self, base: dict | None = None) -> dict:
        """Environment for ``srun``/``sinfo`` on this cluster: ``SLURM_CONF``, the
        cluster's MPI-over-TCP settings (``EmulatedCluster.env()``) and MPICH's OFI netmod
        (libfabric's tcp provider) instead of UCX, unless ``base`` names a netmod.

        Why not UCX: Slurm's PMI-1 server (mpi/pmi2 plugin, 22.05) takes each request
        from a single ``read()`` of at most 1024 bytes ("TODO: read until newline" in
        its pmi1.c), while MPICH's PMI-1 client sends a UCX address of ~4 KB as ``put``
        lines whose value alone may be 1023 characters: a longer line arrives in two
        pieces, Slurm rejects both ("mpi/pmi2: value not properly terminated in client
        request") and MPI_Init fails or hangs. Whether a line passes 1024 depends on how
        well the address compresses: it failed every time for ``distnn info`` run from
        pytest and never in a shell. The OFI address fits in one 65-byte line."""
        env = self.cluster.env(base)
        env["SLURM_CONF"] = self.conf
        if "MPIR_CVAR_CH4_NETMOD" not in (os.environ if base is None else base):
            env["MPIR_CVAR_CH4_NETMOD"] = "ofi"
        return env

    def srun_argv(self, argv: Sequence[str], nodes: int | None = None,
                  ntasks: int | None = None, mpi: str = "pmi2",
                  extra: Sequence[str] = ()) -> list[str]:
        """``srun --mpi=MPI -N nodes -n ntasks [extra] argv`` (default: every host, one
        task each); run it with ``env=self.env()``."""
        nodes = len(self.cluster.hosts) if nodes is None else nodes
        ntasks = nodes if ntasks is None else ntasks
        return ["srun", f"--mpi={mpi}", "-N", str(nodes), "-n", str(ntasks), *extra, *argv]
