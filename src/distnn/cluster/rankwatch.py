"""Run one rank's command and say so when a signal ends it (``distnn launch`` starts every
rank through this): ``python rankwatch.py CMD ARGS...``.

mpiexec (hydra) kills the other ranks within milliseconds of one's death and then reports
the first of its processes with a bad status, which is not the one that died first; this
parent of the rank sees its own child's end at once and prints, before hydra can clean up
(hydra watches this process, which is still alive then),

    distnn: rank 2 (pid 1234, host node1) ended by signal 9 (Killed)

and then ends the same way, so the launcher sees the status it would have seen. The
supervisor names the rank's role from the job's ranks file. Run as a file, it imports
nothing of distnn (it starts in milliseconds); the rank's command inherits every file
descriptor (hydra's PMI connection) and dies with it (``PR_SET_PDEATHSIG``).
"""
from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def main(argv: list[str]) -> int:
    if not argv:
        print("rankwatch: give the command to run", file=sys.stderr)
        return 2
    child = subprocess.Popen(argv, close_fds=False, preexec_fn=_die_with_parent)

    def forward(signum, frame):  # Ctrl-C, a supervisor's SIGTERM: the rank decides
        try:
            child.send_signal(signum)
        except ProcessLookupError:
            pass

    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, forward)
    rc = child.wait()
    if rc >= 0:
        return rc
    sig = -rc
    name = signal.strsignal(sig) or f"signal {sig}"
    rank = os.environ.get("PMI_RANK", "?")
    sys.stderr.write(f"distnn: rank {rank} (pid {child.pid}, host {socket.gethostname()}) "
                     f"ended by signal {sig} ({name})\n")
    sys.stderr.flush()
    if sig not in (signal.SIGKILL, signal.SIGSTOP):
        signal.signal(sig, signal.SIG_DFL)
    os.kill(os.getpid(), sig)
    return 128 + sig


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
