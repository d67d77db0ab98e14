"""A supervisor that owns a training launch: it starts ``distnn train`` with mpiexec on a
list of hosts and, when the job fails because a rank or a host died, finds which hosts
still answer, drops the others, and relaunches on the rest with ``--resume`` of the last
checkpoint, until the run finishes or it runs out of restarts or hosts (``distnn launch``).

A host is alive when it answers the launcher (``HOST true`` through its remote shell) and
passes the probe over the data network (``netprobe.py``: it reaches the launcher's host
and the rank-0 host by the names MPI uses). Hosts that fail the data probe are a partition
that may heal: they are left out when ``--min_hosts`` allows; when it does not, the
supervisor waits, probing again after 1, 2, 4 ... seconds (``backoff`` doubling up to
``backoff_cap``), for at most the stall timeout, then ends naming each host and the probe
it failed. A relaunch that fails before training starts (no step reached) while a host
fails the data probe is not counted against ``max_restarts``; consecutive ones are spaced
by the same backoff.

It never restarts what a restart cannot fix: exit status 2 (a user error), 3 (a diverged
loss) or a checkpoint that will not load (neither the newest nor the previous one kept
beside it, ``ck.prev.npz``; a newest that will not load is named and the previous one
used). Each restart is one line on stderr: the host lost, where it resumes (epoch/step),
how many samples are redone. SIGINT/SIGTERM stop the
job (its whole process group) and the supervisor, leaving nothing running.

Example:
    sup = Supervisor(["h1", "h2", "h3"], ["--checkpoint", "ck.npz", ...], min_hosts=2)
    sys.exit(sup.run())
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from typing import Callable, Sequence

from .netprobe import DataProbe, Health, describe, remote_argv
from .resumepoint import describe_checkpoint, read_progress, resume_point

__all__ = ["Supervisor", "LaunchError", "expand_nodelist", "NO_RESTART"]

# exit statuses a restart cannot fix
NO_RESTART = {2: "a user error (exit 2)", 3: "the loss diverged (exit 3)"}
_LOST = re.compile(r"^\[([^\]\s]+)\] lost:")
_RANK_HOST = re.compile(r"rank (\d+) \(host ([^)]+)\)")
_TIMEOUT = re.compile(r"\] stall timeout: ranks? ([\d, ]+) did not arrive")
# a rank's watcher (rankwatch.py) saw its rank end by a signal
_DIED = re.compile(r"^distnn: rank (\d+) \(pid \d+, host ([^)]+)\)(?:, (.*))?: ended by "
                   r"(signal .*)$")
_WATCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rankwatch.py")
STALL_TIMEOUT = 600.0  # --stall_timeout the supervisor gives a run that sets none
EXIT_STALL = 4


class LaunchError(ValueError):
    """The launch is misconfigured (the message names the option); exit status 2."""


def expand_nodelist(nodelist: str) -> list[str]:
    """Slurm's compressed host list ('node[1-3,7],gpu05') as names."""
    out: list[str] = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\])?[^,]*", nodelist):
        m = re.fullmatch(r"(.*)\[([^\]]*)\](.*)", part)
        if not m:
            out.append(part)
            continue
        head, ranges, tail = m.groups()
        for r in ranges.split(","):
            lo, _, hi = r.partition("-")
            for i in range(int(lo), int(hi or lo) + 1):
                out.append(f"{head}{i:0{len(lo)}d}{tail}")
    return out


def _option(argv: Sequence[str], name: str) -> str | None:
    """The value of --name (or --name=..., dashes or underscores) in a train argv."""
    names = {f"--{name}", f"--{name.replace('_', '-')}"}
    value = None
    for i, word in enumerate(argv):
        key, eq, val = word.partition("=")
        if key in names:
            value = val if eq else (argv[i + 1] if i + 1 < len(argv) else None)
    return value


class Supervisor:
    """Runs ``distnn train TRAIN_ARGV`` on ``hosts`` and restarts it on the hosts left.

    Args:
        hosts: host names, in rank order (rank 0 on the first).
        train_argv: the arguments of ``distnn train`` (must name ``--checkpoint``).
        ranks_per_host: ranks on each host.
        max_restarts: relaunches allowed after failures.
        min_hosts: fewest hosts to go on with.
        mpiexec: the launcher (default: the one next to this Python).
        launcher_args: more arguments for mpiexec (e.g. "-launcher ssh -launcher-exec X").
        env: the job's environment (default os.environ).
        probe: ``probe(host) -> bool``: does the host answer (default: ``true`` through
            the launcher's -launcher-exec program, else ``ssh -o BatchMode=yes``).
        distnn: the distnn command (default: the one next to this Python).
        out: where the supervisor's lines go (default sys.stderr).
        stall_timeout: the ``--stall_timeout`` given to a train command that has none, so
            a hung rank ends the job (exit 4) and its host is dropped like a lost one;
            also the longest wait for a partition to heal (the train command's value when
            it sets one).
        data_probe: ``data_probe(hosts) -> {host: why}`` for the hosts that fail the data
            network (default: ``netprobe.DataProbe`` through the launcher's remote shell;
            none when ``probe`` is given and this is not).
        backoff, backoff_cap: the first wait (s) before probing again while hosts fail the
            data probe, doubled after each failed round up to ``backoff_cap``.
    """

    def __init__(self, hosts: Sequence[str], train_argv: Sequence[str], *,
                 ranks_per_host: int = 1, max_restarts: int = 3, min_hosts: int = 1,
                 mpiexec: str | None = None, launcher_args: Sequence[str] = (),
                 env: dict | None = None, probe: Callable[[str], bool] | None = None,
                 distnn: str | None = None, out=None,
                 stall_timeout: float | None = STALL_TIMEOUT,
                 data_probe: Callable[[Sequence[str]], dict[str, str]] | None = None,
                 backoff: float = 1.0, backoff_cap: float = 30.0):
        hosts = list(dict.fromkeys(hosts))
        if not hosts:
            raise LaunchError("--hosts: give at least one host (or run inside a Slurm "
                              "allocation, whose SLURM_JOB_NODELIST is used)")
        if ranks_per_host < 1 or max_restarts < 0 or min_hosts < 1:
            raise LaunchError(f"--ranks_per_host (>= 1), --max_restarts (>= 0) and "
                              f"--min_hosts (>= 1) got {ranks_per_host}, {max_restarts}, "
                              f"{min_hosts}")
        if not 0 < backoff <= backoff_cap:
            raise LaunchError(f"--backoff (> 0) and --backoff_cap (>= --backoff) got "
                              f"{backoff:g}, {backoff_cap:g}")
        if min_hosts > len(hosts):
            raise LaunchError(f"--min_hosts {min_hosts} is more than the {len(hosts)} hosts "
                              "given; lower it or give more --hosts")
        self.checkpoint = _option(train_argv, "checkpoint") or _option(train_argv, "resume")
        if not self.checkpoint:
            raise LaunchError("the train command needs --checkpoint FILE (on storage every "
                              "host sees) so that a restart can --resume it; add "
                              "--checkpoint_steps N to lose at most N steps")
        self.hosts, self.train_argv = hosts, list(train_argv)
        if stall_timeout and _option(train_argv, "stall_timeout") is None:
            self.train_argv += ["--stall_timeout", f"{stall_timeout:g}"]
        self.ranks_per_host, self.max_restarts = ranks_per_host, max_restarts
        self.min_hosts = min_hosts
        bindir = os.path.dirname(sys.executable)
        self.mpiexec = mpiexec or os.path.join(bindir, "mpiexec")
        self.distnn = distnn or os.path.join(bindir, "distnn")
        self.launcher_args = list(launcher_args)
        self.env = dict(os.environ if env is None else env)
        if self.env.get("SLURM_JOB_ID"):
            # a step of a lost host never ends (its slurmd is gone): the relaunch's srun
            # (mpiexec's, for its proxies) and the probes share the CPUs it still holds
            self.env.setdefault("SLURM_OVERLAP", "1")
        self.data_probe = data_probe if data_probe is not None or probe is not None else \
            DataProbe(self._remote, env=self.env)
        self.probe = probe or self._default_probe
        given = _option(self.train_argv, "stall_timeout")
        try:
            heal = float(given) if given else float(stall_timeout or 0) or STALL_TIMEOUT
        except ValueError:  # train refuses it at its start (exit 2)
            heal = float(stall_timeout or STALL_TIMEOUT)
        heal = heal if heal > 0 else STALL_TIMEOUT  # 0: the job's stall never times out
        self.out = out
        self.proc: subprocess.Popen | None = None
        self._stopping = False
        self.health = Health(lambda h: self.probe(h), self.data_probe, self.say,
                             min_hosts=min_hosts, backoff=backoff, backoff_cap=backoff_cap,
                             timeout=heal)

    def say(self, line: str) -> None:
        out = self.out if self.out is not None else sys.stderr
        out.write(f"distnn launch: {line}\n")
        out.flush()

    # -- hosts --------------------------------------------------------------------------
    def _remote(self, host: str, argv: list[str]) -> list[str]:
        return remote_argv(self.launcher_args, self.env, host, argv)

    def _default_probe(self, host: str) -> bool:
        try:
            return subprocess.run(self._remote(host, ["true"]), env=self.env,
                                  stdin=subprocess.DEVNULL,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  timeout=15).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            return False

    # -- one launch -------------------------------------------------------------------------
    def _launch(self, hosts: list[str], resume: bool, progress: str,
                again: bool = False) -> tuple[int, set[str]]:
        argv = list(self.train_argv)
        if resume:
            argv += ["--resume", self.checkpoint]
        elif again and "--overwrite" not in argv:
            # starting over (no checkpoint yet): the failed attempt's outputs (history,
            # trace) are replaced, as a resume would replace them
            argv += ["--overwrite"]
        argv += ["--progress_file", progress]
        hostlist = ",".join(f"{h}:{self.ranks_per_host}" for h in hosts)
        cmd = [self.mpiexec, *self.launcher_args, "-hosts", hostlist,
               "-n", str(self.ranks_per_host * len(hosts)), sys.executable, _WATCH, self.distnn,
               "train", *argv]
        return self._run_job(cmd, self.env)

    def _run_job(self, cmd: list[str], env: dict) -> tuple[int, set[str]]:
        """Run the job's mpiexec ``cmd``; (exit status, hosts its stderr named lost)."""
        lost: set[str] = set()
        stalled: list[str] = []
        where: dict[int, str] = {}
        self.dead: list[tuple[str, ...]] = []
        self.proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True,
                                     start_new_session=True)

        def forward():  # the job's stderr, passed on, watched for "[host] lost:"
            for line in self.proc.stderr:
                m = _LOST.match(line)
                if m:
                    lost.add(m.group(1))
                for rank, host in _RANK_HOST.findall(line):
                    where[int(rank)] = host
                m = _DIED.match(line)
                if m and not self.dead:  # the first: the others are hydra's clean-up
                    self.dead.append(m.groups())
                m = _TIMEOUT.search(line)
                if m and not stalled:  # the first (the lowest waiting rank's) verdict
                    stalled[:] = [where.get(int(r), "?") for r in m.group(1).split(",")]
                sys.stderr.write(line)
            sys.stderr.flush()

        reader = threading.Thread(target=forward, daemon=True)
        reader.start()
        rc = self.proc.wait()
        reader.join(10)
        self._reap()
        if rc == EXIT_STALL:
            lost.update(h for h in stalled if h != "?")
        return rc, lost

    def _name_dead(self) -> None:
        """One line naming the rank whose end (by a signal) ended the job, and its role
        (its watcher's line, rankwatch.py)."""
        if self.dead:
            rank, host, role, how = self.dead[0]
            self.say(f"lost rank {rank} (host {host}){', ' + role if role else ''}: ended by "
                     f"{how}")

    def _reap(self) -> None:
        """Nothing of the job left running (its whole process group)."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def stop(self, signum=None, frame=None) -> None:
        """SIGINT/SIGTERM: stop the job (its process group) and do not restart."""
        self._stopping = True
        self.health.stopped.set()
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    # -- the loop -----------------------------------------------------------------------
    def run(self) -> int:
        """Launch, restart as needed; returns the exit status (the job's, or 1 when the
        restarts or hosts ran out, 130 when interrupted)."""
        previous = {s: signal.signal(s, self.stop) for s in (signal.SIGINT, signal.SIGTERM)}
        hosts, restarts, failed_starts = list(self.hosts), 0, 0
        resume = _option(self.train_argv, "resume") is not None
        tmp = tempfile.mkdtemp(prefix="distnn-launch-")
        progress = os.path.join(tmp, "progress")
        reached = None
        try:
            while True:
                self.say(f"starting on {len(hosts)} host{'s' * (len(hosts) > 1)} "
                         f"({','.join(hosts)}), {self.ranks_per_host * len(hosts)} ranks"
                         + (f", resuming {self.checkpoint}" if resume else ""))
                if os.path.exists(progress):
                    os.unlink(progress)  # rank 0 creates it when training starts
                rc, lost = self._launch(hosts, resume, progress, again=restarts > 0)
                ended = self._ended(rc, hosts, restarts)
                if ended is not None:
                    return ended
                started = os.path.exists(progress)
                reached = read_progress(progress) if started else reached
                step = self._restart_hosts(rc, hosts, lost, started, restarts)
                if isinstance(step, int):
                    return step
                alive, why, counted, waited, failing = step
                failed_starts = 0 if started else failed_starts + 1
                if not started and failing and not waited and self._space_start(failed_starts):
                    return 130
                restarts += counted
                resume, where, redo = resume_point(self.checkpoint, self.train_argv, reached)
                if resume is None:
                    self.say(f"{why}; not restarting: {where}")
                    return 2
                label = f"restart {restarts}/{self.max_restarts}" if counted else \
                    f"relaunch (restart budget {restarts}/{self.max_restarts} kept)"
                self.say(f"{label}: {why}; {where} on "
                         f"{len(alive)} host{'s' * (len(alive) > 1)} ({','.join(alive)}); "
                         f"{redo}")
                hosts = alive
        finally:
            self._reap()
            for s, handler in previous.items():
                signal.signal(s, handler)
            shutil.rmtree(tmp, ignore_errors=True)


    def _ended(self, rc: int, hosts: list[str], restarts: int) -> int | None:
        """The exit status where the job's end is final (done, stopped, or an exit that a
        restart cannot mend), else None."""
        if rc and not self._stopping:
            self._name_dead()
        if self._stopping:
            self.say("interrupted: the job was stopped, nothing is left running")
            return 130
        if rc == 0:
            self.say(f"finished on {len(hosts)} hosts after {restarts} restart"
                     f"{'s' * (restarts != 1)}")
            return 0
        if rc in NO_RESTART:
            self.say(f"not restarting: {NO_RESTART[rc]}; fix the cause, then resume "
                     f"the last checkpoint: --resume {self.checkpoint}")
            return rc
        return None

    def _restart_hosts(self, rc: int, hosts: list[str], lost, started: bool, restarts: int):
        """(alive, why, counted, waited, failing) for the restart after a failed job, or the
        exit status where there is none (the budget spent, too few hosts, stopped)."""
        # every host given is probed again: one dropped earlier that answers now
        # (its power or link back) is taken again, in its place in --hosts (with
        # node-local checkpoints its copy may be older: the ranks agree on the
        # newest, run/resume.py). A host named lost is left out of this restart;
        # probed all the same, its failing the data probe tells a partition.
        alive, failing = self.health.check(self.hosts)
        alive = [h for h in alive if h not in lost]
        why = _why(rc, hosts, alive, failing)
        # a start that a partition broke is not a lost run
        counted = started or not failing
        if counted and restarts >= self.max_restarts:
            self.say(f"{why}; the restart budget (--max_restarts "
                     f"{self.max_restarts}) is spent; the last good checkpoint: "
                     f"{describe_checkpoint(self.checkpoint)}")
            return rc or 1
        waited = len(alive) < self.min_hosts and bool(failing)
        if waited:
            passing = "1 host passes" if len(alive) == 1 else f"{len(alive)} hosts pass"
            self.say(f"{why}; {passing}, fewer than --min_hosts {self.min_hosts}")
            answer = self.health.wait_out(self.hosts, failing)
            if answer is None:
                if self._stopping:
                    self.say("interrupted: nothing is left running")
                    return 130
                self.say(f"the last good checkpoint: {describe_checkpoint(self.checkpoint)}")
                return rc or 1
            alive, failing = answer
            why = _why(rc, hosts, alive, failing) + "; after waiting for the partition"
        elif len(alive) < self.min_hosts:
            self.say(f"{why}; {len(alive)} host{'s' * (len(alive) != 1)} left, "
                     f"fewer than --min_hosts {self.min_hosts}; the last good "
                     f"checkpoint: {describe_checkpoint(self.checkpoint)}")
            return rc or 1
        return alive, why, counted, waited, failing

    def _space_start(self, failed_starts: int) -> bool:
        """Wait before the next start (not a restart); True where it was interrupted."""
        wait = self.health.delay(failed_starts - 1)
        self.say(f"the start failed while hosts fail the data probe (not counted "
                 f"as a restart); relaunching in {wait:g} s")
        if self.health.stopped.wait(wait):
            self.say("interrupted: nothing is left running")
            return True
        return False

def _why(rc: int, hosts: list[str], alive: list[str], failing: dict[str, str]) -> str:
    """Why the restart: the hosts of the last job left out (and the probe each failed),
    those taken back."""
    dropped = [h for h in hosts if h not in alive]
    back = [h for h in alive if h not in hosts]
    why = (f"lost host{'s' * (len(dropped) > 1)} {','.join(dropped)}" if dropped
           else f"the job failed (exit {rc}), every host still answers")
    if failing:
        why += f" ({describe(failing)})"
    if back:
        why += f"; host{'s' * (len(back) > 1)} {','.join(back)} back"
    return f"a rank hung (exit {EXIT_STALL}): " + why if rc == EXIT_STALL else why


def launcher_words(text: str) -> list[str]:
    """--launcher_args as words (shell quoting)."""
    return shlex.split(text or "")
