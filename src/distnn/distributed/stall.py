"""The stall inspector: name the ranks a waiting rank is waiting for, and end a hung job.

Each rank publishes where it is (step, phase, when it got there, how many collectives it
has started, whether it is waiting, a heartbeat) in float64 slots of a one-sided window
(``MPIComm.slot_window``: the inspector talks to MPI only through its communicator).
Publishing is a store into local memory: no MPI call, nothing sent, and the waits
stay MPI's own blocking calls (``_watched``/``enter``/``leave`` only mark them), so a step
costs what it cost without the inspector (``benchmarks/stall.py``). A watchdog thread beats
every 0.2 s and watches the clock: when the main thread has waited past ``warning``
seconds it reads every rank's slots with ``Rget`` (passive target: it needs nothing from
the target, so a SIGSTOPped or deadlocked rank is read all the same; a rank whose slots
cannot be read within a second is "not answering") and prints which ranks have not
arrived (busy elsewhere, or their heartbeat stopped) and where each last was. Past
``timeout`` seconds it prints the same as an error and ends the job with
MPI_Abort(``EXIT_STALL``) (4), leaving the last (atomically written) checkpoint resumable.
Reading other ranks from the watchdog needs ``MPI.THREAD_MULTIPLE`` (mpi4py asks for it;
MPICH grants it); at a lower level the report has this rank's own position only. Only the
lowest-numbered rank that has arrived prints.

Interruptible mode (``interruptible = True``; ``distnn search``'s blocks): the waits poll
(the communicator tests the non-blocking twin of each collective between
``coordination.Backoff`` pauses) and a rank that failed says so
with ``fail()``, a ``Put`` into the others' FAILED slot; their waits then end with
``PeerFailed`` instead of waiting for a rank that will never come (MPICH has no
``MPIX_Comm_revoke`` to do this).

The inspector is passed explicitly to what publishes phases: ``Trainer(stall=)`` (which
hands it to its checkpoints and to the rule's ``DistributedOptimizer``/``Reducer``).

Example:
    inspector = watch_stalls(comm, warning=60, timeout=600)
    trainer = Trainer(model, opt, comm=comm, stall=inspector)
"""
from __future__ import annotations

import socket
import sys
import time
from typing import Sequence

import numpy as np

from .coordination import Backoff

__all__ = ["StallInspector", "PeerFailed", "watch_stalls", "PHASES", "EXIT_STALL"]

EXIT_STALL = 4
PHASES = ("start", "forward", "backward", "allreduce bucket", "optimizer step", "loss check",
          "epoch end", "evaluate", "checkpoint write", "collective", "waiting for master",
          "waiting for workers", "waiting for a peer", "done", "exchange")
_CODES = {name: i for i, name in enumerate(PHASES)}
STEP, PHASE, ARG, SINCE, STARTED, WAITING, BEAT, FAILED = range(8)
SLOTS = 8
BEAT_S = 0.2  # the watchdog's period
STALE = 1.0  # a rank whose watchdog has not beaten for this long is stopped (or its host)


class StallInspector:
    """Publishes this rank's position and watches its waits (see the module doc).

    Args:
        comm: the ``MPIComm`` to watch (``comm.watch(self)``: it marks its waits here).
        warning: seconds of waiting before the ranks not arrived are named (stderr).
        timeout: seconds of waiting before the job ends with exit status 4 (None: never).
        hint: appended to the timeout message (e.g. how to resume).
        out: where the lines go (default sys.stderr).
    """

    def __init__(self, comm, warning: float = 60.0, timeout: float | None = None,
                 hint: str = "", out=None):
        if not warning > 0:
            raise ValueError(f"warning (--stall_warning) must be > 0 seconds, got {warning!r}")
        if timeout is not None and not timeout > 0:
            raise ValueError(f"timeout (--stall_timeout) must be > 0 seconds or None, got "
                             f"{timeout!r}")
        self.comm = comm
        self.warning, self.timeout, self.hint = float(warning), timeout, hint
        self.out = out
        self.hosts = comm.allgather_obj(socket.gethostname())
        self.win = comm.slot_window(SLOTS)
        self.state = self.win.local
        self.state[:] = (0, 0, -1, time.time(), 0, -1, 0, 0)
        self.seq = 0
        self.step = 0
        self._waiting = None
        self.interruptible = False  # waits poll and end with PeerFailed (see ``fail``)
        self._abandoned: list = []  # requests of waits given up (their buffers stay alive)
        # the watchdog reads other ranks' slots while the main thread is inside MPI
        self.threaded = comm.thread_multiple
        comm.watch(self)
        import atexit
        import threading
        atexit.register(self.close)  # before MPI finalizes (the window is collective)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="distnn-stall-watchdog",
                                        daemon=True)
        self._thread.start()

    # -- publishing (cheap: stores into this rank's slots) ---------------------------------
    def phase(self, name: str, arg: int = -1, step: int | None = None) -> None:
        """Say this rank is now in phase ``name`` (one of PHASES) of ``step``."""
        s = self.state
        if step is not None:
            self.step = step
            s[STEP] = step
        s[PHASE] = _CODES[name]
        s[ARG] = arg
        s[SINCE] = time.time()

    def started(self) -> int:
        """Count a collective this rank starts; returns its number."""
        self.seq += 1
        self.state[STARTED] = self.seq
        return self.seq

    # -- a failure on some ranks only (distnn search's blocks) -----------------------------
    def fail(self) -> None:
        """Tell every other rank that this rank has failed and will join no more collectives
        on this communicator: a ``Put`` into their FAILED slot, so that their interruptible
        waits end with ``PeerFailed`` instead of waiting forever."""
        me = self.comm.rank
        self.state[FAILED] = me + 1
        mark = np.array([me + 1], dtype=np.float64)
        for r in range(self.comm.size):
            if r != me:
                self.win.put(mark, r, FAILED)
        self.win.flush()

    @property
    def any_failed(self) -> bool:
        """Whether some rank (this one included) has said it failed."""
        return bool(self.state[FAILED])

    def check(self) -> None:
        """Raise ``PeerFailed`` when another rank has said it failed (see ``fail``)."""
        failed = int(self.state[FAILED]) - 1
        if failed >= 0 and failed != self.comm.rank:
            raise PeerFailed(failed)

    def give_up(self, request, keep=None) -> None:
        """``check``, keeping ``request`` and ``keep`` (what MPI may still use) alive when it
        raises: that wait is abandoned, never completed."""
        try:
            self.check()
        except PeerFailed:
            self._abandoned.append((request, keep))
            raise

    # -- waiting (the caller blocks in MPI; the watchdog thread watches the clock) --------
    def enter(self, seq: int | None = None, peers: Sequence[int] | None = None) -> None:
        """This rank now waits in collective number ``seq`` (or for ``peers``)."""
        self._waiting = (time.monotonic(), seq, peers)
        self.state[WAITING] = seq if seq is not None else -2

    def leave(self) -> None:
        self.state[WAITING] = -1
        self._waiting = None

    def _watch(self) -> None:
        """The watchdog: beats every ``BEAT_S`` (so a stopped process is told from a waiting
        one) and reports a wait that passes the warning or the timeout."""
        seen, next_check = None, None
        while not self._stop.wait(BEAT_S):
            self.state[BEAT] = time.time()
            waiting = self._waiting
            if waiting is None:
                continue
            if waiting is not seen:
                seen, next_check = waiting, min([self.warning] + (
                    [self.timeout] if self.timeout is not None else []))
            t0, seq, peers = waiting
            waited = time.monotonic() - t0
            if waited >= next_check:
                fatal = self.timeout is not None and waited >= self.timeout
                self._report(waited, seq, peers, fatal)
                next_check = min([waited + self.warning] + (
                    [self.timeout] if self.timeout is not None and self.timeout > waited
                    else []))

    def read(self, ranks: Sequence[int], patience: float = 1.0) -> dict[int, np.ndarray | None]:
        """Every rank's published slots (None: could not be read within ``patience`` s)."""
        bufs, reqs = {}, {}
        for r in ranks:
            if r == self.comm.rank:
                bufs[r] = self.state.copy()
                continue
            bufs[r] = np.zeros(SLOTS)
            reqs[r] = self.win.get_(bufs[r], r)
        deadline = time.monotonic() + patience
        backoff = Backoff(1e-3, min_sleep=1e-3)
        while reqs and time.monotonic() < deadline:
            for r in [r for r, q in reqs.items() if q.test()]:
                del reqs[r]
            self.state[BEAT] = time.time()  # reading others is no reason to look stopped
            backoff.pause()
        for r in reqs:  # left pending: this rank is about to be reported (or to end)
            bufs[r] = None
        return bufs

    def where(self, s: np.ndarray, now: float) -> str:
        name = PHASES[int(s[PHASE])] if 0 <= int(s[PHASE]) < len(PHASES) else "?"
        if s[ARG] >= 0:
            name += f" {int(s[ARG])}"
        return f"step {int(s[STEP])}, {name}, {now - s[SINCE]:.1f} s ago"

    def _report(self, waited: float, seq, peers, fatal: bool) -> None:
        me = self.comm.rank
        # ages are measured from when the reads were sent: waiting for a rank that does not
        # answer must not make the others' heartbeats look old
        now = time.time()
        if self.threaded:
            everyone = self.read(range(self.comm.size))
        else:  # MPI calls from this thread are not allowed: own slots only
            everyone = {r: (self.state.copy() if r == me else None)
                        for r in range(self.comm.size)}

        def stuck(s):  # not waiting (busy elsewhere), or its watchdog stopped beating
            return s is None or s[WAITING] == -1 or now - s[BEAT] > STALE

        if seq is not None:
            late = [r for r, s in everyone.items() if r != me and stuck(s)]
            arrived = [r for r in everyone if r not in late]
        else:
            late = [r for r in dict.fromkeys(peers or []) if r != me]
            arrived = [me]
        printer = min(arrived) if arrived else me
        names = []
        for r in late:
            s = everyone[r]
            if s is None:
                where = "not answering (stopped, or its host lost)"
            else:
                where = self.where(s, now)
                if now - s[BEAT] > STALE:
                    where += f" (not running for {now - s[BEAT]:.1f} s: stopped?)"
            names.append(f"rank {r} (host {self.hosts[r]}): {where}")
        mine = self.where(self.state, now).rsplit(",", 1)[0]
        if seq is not None:
            head = f"[rank {me}] stall: waited {waited:.1f} s in {mine} (collective); not arrived: "
        else:
            whom = ", ".join(f"rank {r}" for r in late)
            head = f"[rank {me}] stall: waited {waited:.1f} s in {mine}, for {whom}: "
        line = head + ("; ".join(names) or "none found (still waiting)")
        out = self.out if self.out is not None else sys.stderr
        if fatal:
            late_ranks = ", ".join(str(r) for r in late) or "?"
            plural = "s" * (len(late) > 1)
            line = (f"{line}\n[rank {me}] stall timeout: rank{plural} {late_ranks} did not "
                    f"arrive within {self.timeout:g} s (--stall_timeout); ending the job with exit "
                    f"status {EXIT_STALL}{'; ' + self.hint if self.hint else ''}")
        if me == printer:
            out.write(line + "\n")
            out.flush()
        if fatal:
            time.sleep(0.5 if me == printer else 2.0)  # the printer's line goes out first
            self.comm.abort(EXIT_STALL)

    def close(self) -> None:
        """Release the window (collective)."""
        if getattr(self, "win", None) is not None and self.win.open:
            # the watchdog writes into the window's memory: stop it before the memory goes
            self._stop.set()
            self._thread.join(5.0)
            self.state = self.state.copy()
            self.comm.watch(None)
            self._waiting = None
            self.win.free()
            self.win = None


class PeerFailed(RuntimeError):
    """Another rank of the communicator failed (``StallInspector.fail``) while this one
    waited for it; ``rank`` is its rank in that communicator."""

    def __init__(self, rank: int):
        super().__init__(f"rank {rank} of this communicator failed")
        self.rank = rank


def watch_stalls(comm, warning: float = 60.0, timeout: float | None = None,
                 hint: str = "") -> StallInspector | None:
    """A ``StallInspector`` watching ``comm`` (collective; the one already watching it, with
    these settings, if any); None for a communicator without MPI (one process: nothing
    to wait for). Pass it to what publishes phases (``Trainer(stall=)``)."""
    if getattr(comm, "size", 1) < 2 or not hasattr(comm, "MPI"):
        return None
    current = comm.stall  # the inspector already watching this communicator's waits
    if current is not None:
        current.warning, current.timeout, current.hint = float(warning), timeout, hint
        return current
    return StallInspector(comm, warning, timeout, hint)
