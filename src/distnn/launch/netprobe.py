"""The health probe of ``distnn launch`` over the data network: does each host reach, by
the names and over the links MPI will use, the launcher's host (where hydra's proxies
connect back to mpiexec) and the rank-0 host (where the ranks meet)?

The launcher's own ``HOST true`` is not enough: on many clusters ssh runs on a management
network, so a host whose data link is down still answers it, and every relaunch on it
fails at its start with hydra's ``unable to connect from "h2" ... (No route to host)``.
This probe runs a small Python program on each host through the same remote shell:

1. every host connects to a port this process listens on, by this machine's name as the
   host resolves it (what hydra's proxies do), and then listens on a port of its own;
2. every other host connects to the rank-0 host's port, by the rank-0 host's name as it
   is given in ``-hosts`` (the first host that passed step 1 is rank 0's).

A host fails when its remote shell fails, a connection is refused, has no route or does
not complete within ``timeout`` seconds; the reason names the step, the peer and the
error (``from h2: connect to h1 port 40123: No route to host (the rank-0 host)``). A
connect needs only a listening port, not ICMP, and crosses the same firewalls as MPI's
TCP. The ports are the system's choice (port 0), on every interface, each open for the
probe's few seconds (a listener ends when its stdin closes, or after a minute).

Example:
    probe = DataProbe(lambda host, argv: ["ssh", host, shlex.join(argv)])
    failing = probe(["h1", "h2", "h3"])   # {"h2": "from h2: connect to h1 port ...: ..."}
"""
from __future__ import annotations

import shlex
import shutil
import socket
import subprocess
import sys
import threading
import time
from typing import Callable, Sequence

__all__ = ["DataProbe", "Health", "describe", "remote_argv"]

# Runs on a host: connect to argv[1]:argv[2] (timeout argv[3]); with "listen", then serve
# a port until stdin closes (the probe is done) or a minute passes.
_PROGRAM = r"""
import os, select, socket, sys, time
name, port, timeout = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
try:
    socket.create_connection((name, port), timeout=timeout).close()
except OSError as exc:
    print("fail connect to %s port %d: %s" % (name, port, exc.strerror or exc), flush=True)
    sys.exit(1)
if sys.argv[4:] != ["listen"]:
    sys.exit(0)
srv = socket.create_server(("", 0))
print("port %d" % srv.getsockname()[1], flush=True)
end = time.monotonic() + 60
while time.monotonic() < end:
    ready = select.select([srv, 0], [], [], 1.0)[0]
    if 0 in ready and not os.read(0, 1024):
        break
    if srv in ready:
        srv.accept()[0].close()
"""


class DataProbe:
    """Probes hosts over the data network (see the module's docstring).

    Args:
        remote: ``remote(host, argv) -> argv`` that runs ``argv`` on ``host`` (the
            launcher's remote shell; the program's words are passed as ``argv``).
        python: the Python on the hosts (default: this one, as the launch uses).
        timeout: seconds a connect may take.
        here: this machine's name as the hosts resolve it (default its hostname).
        env: the environment of the remote shell (default this process's).
    """

    def __init__(self, remote: Callable[[str, list[str]], list[str]], *,
                 python: str = sys.executable, timeout: float = 3.0,
                 here: str | None = None, env: dict | None = None):
        self.remote, self.python, self.timeout = remote, python, timeout
        self.here = here or socket.gethostname()
        self.env = env

    def _argv(self, host: str, name: str, port: int, *more: str) -> list[str]:
        # -S: no site (the program needs only the standard library; it starts faster)
        return self.remote(host, [self.python, "-S", "-c", _PROGRAM, name, str(port),
                                  f"{self.timeout:g}", *more])

    def __call__(self, hosts: Sequence[str]) -> dict[str, str]:
        """{host: why it fails} for the hosts that fail (an empty dict: all pass)."""
        failing: dict[str, str] = {}
        listeners: dict[str, subprocess.Popen] = {}
        ports: dict[str, int] = {}
        with socket.create_server(("", 0)) as server:
            server.settimeout(0.2)
            stop = threading.Event()
            acceptor = threading.Thread(target=_accept, args=(server, stop), daemon=True)
            acceptor.start()
            try:
                port = server.getsockname()[1]
                for h in hosts:
                    listeners[h] = self._start(h, self._argv(h, self.here, port, "listen"))
                for h, proc in listeners.items():
                    line = _first_line(proc, self.timeout + 15)
                    if line.startswith("port "):
                        ports[h] = int(line.split()[1])
                    else:
                        failing[h] = self._why(h, proc, line, f"connect to {self.here} "
                                               f"port {port}", "the launcher's host")
            finally:
                stop.set()
        checks: dict[str, subprocess.Popen] = {}
        try:
            first = next((h for h in hosts if h in ports), None)
            if first is not None:
                checks = {h: self._start(h, self._argv(h, first, ports[first]))
                          for h in hosts if h in ports and h != first}
                for h, proc in checks.items():
                    line = _first_line(proc, self.timeout + 15)
                    if _wait(proc, 5) != 0:
                        failing[h] = self._why(h, proc, line, f"connect to {first} port "
                                               f"{ports[first]}", "the rank-0 host")
        finally:
            _close(*listeners.values(), *checks.values())
        return failing

    def _start(self, host: str, argv: list[str]) -> subprocess.Popen:
        return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=self.env)

    def _why(self, host: str, proc: subprocess.Popen, line: str, what: str,
             peer: str) -> str:
        if line.startswith("fail "):
            return f"from {host}: {line[5:]} ({peer})"
        if proc.poll() is None:
            _close(proc)
            return f"from {host}: {what} ({peer}): no answer within {self.timeout + 15:g} s"
        err = (proc.stderr.read() if proc.stderr else "").strip().splitlines()
        return (f"the remote shell to {host} failed (exit {proc.returncode})"
                + (f": {err[-1]}" if err else ""))


def _accept(server: socket.socket, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            server.accept()[0].close()
        except (socket.timeout, OSError):
            continue


def _first_line(proc: subprocess.Popen, timeout: float) -> str:
    """The first line the program prints ('' when it ends or says nothing in time)."""
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    return out[0].strip() if out else ""


def _wait(proc: subprocess.Popen, timeout: float) -> int | None:
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        _close(proc)
        return None


def _close(*procs: subprocess.Popen) -> None:
    """End the programs: their stdin closed (a remote one ends on that), then, after 5 s
    for all of them together, killed."""
    for proc in procs:
        try:
            proc.stdin.close()
        except OSError:
            pass
    end = time.monotonic() + 5
    while any(p.poll() is None for p in procs) and time.monotonic() < end:
        time.sleep(0.02)
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def remote_argv(launcher_args: Sequence[str], env: dict, host: str,
                argv: Sequence[str]) -> list[str]:
    """argv that runs ``argv`` on ``host`` the way mpiexec will start its proxies there:
    the launcher's ``-launcher-exec`` program, else ``srun`` inside a Slurm allocation,
    else ``ssh`` (a remote shell joins and re-parses its words, hence one quoted word)."""
    args = list(launcher_args)
    if "-launcher-exec" in args and args.index("-launcher-exec") + 1 < len(args):
        return [args[args.index("-launcher-exec") + 1], host, shlex.join(argv)]
    if env.get("SLURM_JOB_ID") and shutil.which("srun", path=env.get("PATH")):
        # inside an allocation mpiexec starts its proxies with srun: ask the same way
        return ["srun", "--overlap", "--nodelist", host, "-N", "1", "-n", "1", "--quiet",
                *argv]
    return ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", host, shlex.join(argv)]


def describe(failing: dict[str, str]) -> str:
    """'host h2 fails the data-network probe: from h2: connect to ...' for each host."""
    return "; ".join(f"host {h} fails the data-network probe: {why}"
                     for h, why in failing.items())


class Health:
    """Which hosts are alive, and the wait for a partition to heal.

    Args:
        probe: ``probe(host) -> bool``: does the host answer the launcher.
        data_probe: ``data_probe(hosts) -> {host: why}`` (a ``DataProbe``), or None.
        say: where the waiting's lines go.
        min_hosts: the fewest hosts that let the job go on.
        backoff, backoff_cap: the first wait (s), doubled after each round up to the cap.
        timeout: the longest wait (s) for enough hosts to pass.
    """

    def __init__(self, probe: Callable[[str], bool],
                 data_probe: Callable[[Sequence[str]], dict[str, str]] | None,
                 say: Callable[[str], None], *, min_hosts: int, backoff: float,
                 backoff_cap: float, timeout: float):
        self.probe, self.data_probe, self.say = probe, data_probe, say
        self.min_hosts, self.timeout = min_hosts, timeout
        self.backoff, self.backoff_cap = backoff, backoff_cap
        self.stopped = threading.Event()  # set: the wait ends at once (Ctrl-C)
        self.took = 0.0  # seconds the last check took

    def delay(self, rounds: int) -> float:
        """The wait after ``rounds`` failed rounds: backoff * 2**rounds, capped."""
        return min(self.backoff * 2 ** min(rounds, 60), self.backoff_cap)

    def check(self, hosts: Sequence[str]) -> tuple[list[str], dict[str, str]]:
        """(the hosts alive, in order; {host: why} of those that answer the launcher but
        fail the data probe). A host that does not answer the launcher is in neither."""
        start = time.monotonic()
        answering = [h for h in hosts if self.probe(h)]
        failing = self.data_probe(answering) if self.data_probe and answering else {}
        self.took = time.monotonic() - start
        return [h for h in answering if h not in failing], failing

    def wait_out(self, hosts: Sequence[str], failing: dict[str, str]
                 ) -> tuple[list[str], dict[str, str]] | None:
        """Probe ``hosts`` again after each backoff until ``min_hosts`` pass (returns
        ``check``'s answer then) or ``timeout`` has passed (None, and one line naming
        each host still failing and its probe). A round that could not end within
        ``timeout`` (as long as the last check took) is not begun."""
        start, rounds = time.monotonic(), 0
        while not self.stopped.is_set():
            spent = time.monotonic() - start
            left = self.timeout - spent - self.took
            if left <= 0:
                self.say(f"{describe(failing) or 'fewer hosts answer'}; still failing after "
                         f"{spent:.0f} s (--stall_timeout {self.timeout:g}), fewer than "
                         f"--min_hosts {self.min_hosts} pass: giving up")
                return None
            wait = min(self.delay(rounds), left)
            self.say(f"waiting for a partition to heal: {describe(failing)}; probing again "
                     f"in {wait:.3g} s ({self.timeout - spent:.0f} s left of --stall_timeout "
                     f"{self.timeout:g})")
            if self.stopped.wait(wait):
                return None
            alive, failing = self.check(hosts)
            if len(alive) >= self.min_hosts:
                self.say(f"{len(alive)} host{'s' * (len(alive) != 1)} pass the probes after "
                         f"{time.monotonic() - start:.0f} s of waiting: "
                         f"{','.join(alive)}")
                return alive, failing
            rounds += 1
        return None
