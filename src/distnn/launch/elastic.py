"""The elastic side of ``distnn launch``: any command (a script using ``hvd.elastic``) on
a set of hosts that may change, with the job's last commit kept in the supervisor's memory.

MPICH cannot shrink or grow a running world, so a change of hosts restarts the world:
every rank is a new process, and ``hvd.elastic.run`` in the new world's rank 0 loads the
last commit from the supervisor (``launch/commits.py``) and broadcasts it.

- A rank or host dies: mpiexec ends the job; the hosts named lost or not answering a probe
  are dropped, and the world restarts on the rest (counts against ``max_restarts``).
- The host discovery script (Horovod's ``--host-discovery-script``: prints ``host`` or
  ``host:slots`` lines; run every ``interval`` seconds) lists a host the world lacks, or no
  longer lists one it has: rank 0 learns it at its next ``commit()`` or
  ``check_host_updates()``, every rank raises ``HostsUpdatedInterrupt``, rank 0 hands its
  state to the supervisor, the ranks exit with ``EXIT_RESET`` and the world restarts on
  the hosts discovered (not counted as a restart). A host dropped after a failure stays out
  until the script stops listing it; listed again later, it joins as a new host.

Example:
    sup = ElasticSupervisor(["h1", "h2"], ["python", "train.py"], discovery="./hosts.sh")
    sys.exit(sup.run())
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from typing import Callable, Sequence

from .commits import EXIT_RESET, CommitStore
from .netprobe import Health
from .supervisor import NO_RESTART, LaunchError, Supervisor

__all__ = ["ElasticSupervisor", "parse_hosts"]

_LOCAL = {"localhost", "127.0.0.1", socket.gethostname()}


def parse_hosts(text: str, slots: int) -> dict[str, int]:
    """'h1:2\\nh2' -> {'h1': 2, 'h2': slots} (a discovery script's output or --hosts)."""
    out: dict[str, int] = {}
    for word in text.replace(",", "\n").split():
        name, _, n = word.partition(":")
        out[name] = int(n) if n else slots
    return out


class ElasticSupervisor(Supervisor):
    """Runs ``command`` under mpiexec on changing hosts; restarts the world from the last
    commit when a host dies, or is added or removed by the discovery script.

    Args:
        hosts: the first hosts (rank 0 on the first); with ``discovery``, may be empty.
        command: the job's argv on each rank (e.g. ``["python", "train.py"]``).
        ranks_per_host: ranks on a host whose slots are not given.
        max_restarts: restarts allowed after failures (host changes do not count).
        min_hosts: fewest hosts to go on with.
        discovery: the host discovery script, or None for a fixed host list.
        interval: seconds between two runs of the discovery script.
        store_address: where the commit store listens (an address every host reaches).
        mpiexec, launcher_args, env, probe, out: as ``Supervisor``'s.
    """

    def __init__(self, hosts: Sequence[str], command: Sequence[str], *,
                 ranks_per_host: int = 1, max_restarts: int = 3, min_hosts: int = 1,
                 discovery: str | None = None, interval: float = 1.0,
                 store_address: str = "127.0.0.1", mpiexec: str | None = None,
                 launcher_args: Sequence[str] = (), env: dict | None = None,
                 probe: Callable[[str], bool] | None = None, out=None):
        if not command:
            raise LaunchError("give the command to run after --: distnn launch --hosts "
                              "h1,h2 -- python train.py")
        if ranks_per_host < 1 or max_restarts < 0 or min_hosts < 1 or interval <= 0:
            raise LaunchError(f"--ranks_per_host (>= 1), --max_restarts (>= 0), --min_hosts "
                              f"(>= 1) and --discovery_interval (> 0) got {ranks_per_host}, "
                              f"{max_restarts}, {min_hosts}, {interval}")
        self.command, self.discovery, self.interval = list(command), discovery, interval
        self.ranks_per_host, self.max_restarts = ranks_per_host, max_restarts
        self.min_hosts, self.out = min_hosts, out
        self.mpiexec = mpiexec or os.path.join(os.path.dirname(sys.executable), "mpiexec")
        self.launcher_args = list(launcher_args)
        self.env = dict(os.environ if env is None else env)
        self.probe = probe or self._probe
        self.health = Health(self.probe, None, self.say, min_hosts=min_hosts, backoff=1.0,
                             backoff_cap=30.0, timeout=600.0)
        self.proc: subprocess.Popen | None = None
        self._stopping = False
        self.store_address = store_address
        self.hosts = parse_hosts(",".join(hosts), ranks_per_host)
        if not self.hosts and not discovery:
            raise LaunchError("--hosts: give at least one host, or --host_discovery_script")
        self.blacklist: set[str] = set()

    def _probe(self, host: str) -> bool:
        return host in _LOCAL or self._default_probe(host)

    # -- hosts --------------------------------------------------------------------------
    def discover(self) -> dict[str, int] | None:
        """The hosts the script lists now, less those dropped after a failure (None when
        the script fails). A dropped host the script no longer lists is forgiven."""
        try:
            proc = subprocess.run([self.discovery], capture_output=True, text=True,
                                  timeout=30, env=self.env)
        except (OSError, subprocess.TimeoutExpired):
            return None
        if proc.returncode != 0:
            return None
        found = parse_hosts(proc.stdout, self.ranks_per_host)
        self.blacklist &= set(found)
        return {h: n for h, n in found.items() if h not in self.blacklist}

    def _watch(self, world: dict[str, int], store: CommitStore, done: threading.Event):
        """While a world runs: tell the store when the discovered hosts differ from it."""
        while not done.wait(self.interval):
            found = self.discover()
            if found is None or found == world:
                continue
            # a new host counts once it answers (else every commit would restart the world)
            found = {h: n for h, n in found.items() if h in world or self.probe(h)}
            if found == world:
                continue
            added = any(found.get(h, 0) > n for h, n in world.items()) or \
                any(h not in world for h in found)
            removed = any(found.get(h, 0) < n for h, n in world.items())
            for kind in ("added",) * added + ("removed",) * removed:
                store.hosts_changed(kind)
            return  # one notice per world: it ends this world

    def _next_hosts(self, hosts: dict[str, int]) -> dict[str, int]:
        if not self.discovery:
            return hosts
        found = self.discover()
        return {h: n for h, n in (found if found is not None else hosts).items()
                if self.probe(h)}

    # -- the loop -----------------------------------------------------------------------
    def run(self) -> int:
        previous = {s: signal.signal(s, self.stop) for s in (signal.SIGINT, signal.SIGTERM)}
        store = CommitStore(self.store_address, say=self.say)
        restarts, world = 0, 0
        hosts = self.hosts if self.hosts else self._next_hosts({})
        try:
            while True:
                if len(hosts) < self.min_hosts:
                    self.say(f"{len(hosts)} host{'s' * (len(hosts) != 1)} available, fewer "
                             f"than --min_hosts {self.min_hosts}; stopping"
                             + (f" (last commit: #{store.commits})" if store.commit else ""))
                    return 1
                rc, lost = self._world(hosts, store, world)
                world += 1
                if self._stopping:
                    self.say("interrupted: the job was stopped, nothing is left running")
                    return 130
                if rc == 0:
                    self.say(f"finished on {len(hosts)} host{'s' * (len(hosts) != 1)} "
                             f"after {world} world"
                             f"{'s' * (world != 1)} ({restarts} restart"
                             f"{'s' * (restarts != 1)} after failures)")
                    return 0
                if rc in NO_RESTART:
                    self.say(f"not restarting: {NO_RESTART[rc]}")
                    return rc
                if rc == EXIT_RESET:
                    new = self._next_hosts(hosts)
                    self.say(f"hosts changed ({_diff(hosts, new)}): restarting on "
                             f"{_names(new)} from commit #{store.commits}")
                    hosts = new
                    continue
                alive = {h: n for h, n in hosts.items() if h not in lost and self.probe(h)}
                dropped = [h for h in hosts if h not in alive]
                self.blacklist.update(dropped)
                why = (f"lost host{'s' * (len(dropped) > 1)} {','.join(dropped)}" if dropped
                       else f"the job failed (exit {rc}), every host still answers")
                if restarts >= self.max_restarts:
                    self.say(f"{why}; the restart budget (--max_restarts "
                             f"{self.max_restarts}) is spent")
                    return rc or 1
                restarts += 1
                hosts = self._next_hosts(alive) if self.discovery else alive
                start = (f"from commit #{store.commits}" if store.commit
                         else "from the start (nothing committed yet)")
                self.say(f"restart {restarts}/{self.max_restarts}: {why}; {start} on "
                         f"{_names(hosts)}")
        finally:
            self._reap()
            store.close()
            for s, handler in previous.items():
                signal.signal(s, handler)

    def _world(self, hosts: dict[str, int], store: CommitStore, world: int):
        store.new_world()
        ranks = sum(hosts.values())
        self.say(f"world {world}: {len(hosts)} host{'s' * (len(hosts) > 1)} ({_names(hosts)}), "
                 f"{ranks} rank{'s' * (ranks != 1)}"
                 + (f", from commit #{store.commits}" if store.commit else ""))
        cmd = [self.mpiexec, *self.launcher_args, "-hosts",
               ",".join(f"{h}:{n}" for h, n in hosts.items()), "-n", str(ranks),
               *self.command]
        done = threading.Event()
        watcher = None
        if self.discovery:
            watcher = threading.Thread(target=self._watch, args=(dict(hosts), store, done),
                                       daemon=True)
            watcher.start()
        try:
            return self._run_job(cmd, dict(self.env, **store.env(world)))
        finally:
            done.set()
            if watcher is not None:
                watcher.join(self.interval + 35)


def _names(hosts: dict[str, int]) -> str:
    return ",".join(f"{h}:{n}" for h, n in hosts.items()) or "no hosts"


def _diff(old: dict[str, int], new: dict[str, int]) -> str:
    added = [h for h in new if new[h] > old.get(h, 0)]
    removed = [h for h in old if old[h] > new.get(h, 0)]
    return "; ".join(filter(None, [added and "added " + ",".join(added),
                                   removed and "removed " + ",".join(removed)])) or "none"
