"""Run one rank's command and say so when a signal ends it (``distnn launch`` starts every
rank through this): ``python rankwatch.py CMD ARGS...``.

mpiexec (hydra) kills the other ranks within milliseconds of one's death and then reports
the first of its processes with a bad status, which is not the one that died first; this
parent of the rank sees its own child's end at once and prints, before hydra can clean up
(hydra watches this process, which is still alive then), one line

    distnn: rank 2 (pid 1234, host node1), sub-master of worker 4 (master group 1 of 2):
    ended by signal 9 (Killed)

and then ends the same way, so the launcher sees the status it would have seen. The role
is the last line ``distnn train`` wrote to the pipe this watcher gives it in
``DISTNN_ROLE_FD`` (``FD:INODE``; a pipe, so nothing is left behind when hydra kills the
watchers of the other ranks). Run as a file (as ``distnn launch`` does) it imports nothing
of distnn and starts in milliseconds; under plain mpiexec:
``mpiexec -n N python -m distnn.launch.rankwatch distnn train ...``. The rank's command
inherits every file descriptor (hydra's PMI connection) and dies with this process
(``PR_SET_PDEATHSIG``).
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


def _read_role(fd: int) -> str:
    """The last line the rank wrote to the pipe (what is there now: a process the rank
    started may still hold the pipe open)."""
    os.set_blocking(fd, False)
    data = b""
    try:
        while chunk := os.read(fd, 65536):
            data += chunk
    except BlockingIOError:
        pass
    lines = data.decode(errors="replace").strip().splitlines()
    return lines[-1].strip() if lines else ""


def main(argv: list[str]) -> int:
    if not argv:
        print("rankwatch: give the command to run", file=sys.stderr)
        return 2
    r, w = os.pipe()
    os.set_inheritable(w, True)
    # the descriptor and its pipe's inode: a process that did not inherit this pipe and
    # has another file under that number (the variable inherited, not the descriptor) can tell
    role_fd = f"{w}:{os.fstat(w).st_ino}"
    child = subprocess.Popen(argv, env=dict(os.environ, DISTNN_ROLE_FD=role_fd),
                             close_fds=False, preexec_fn=_die_with_parent)
    os.close(w)

    asked: list[int] = []

    def forward(signum, frame):  # Ctrl-C, a supervisor's SIGTERM: the rank decides
        asked.append(signum)
        try:
            child.send_signal(signum)
        except ProcessLookupError:
            pass

    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, forward)
    rc = child.wait()
    if rc >= 0:
        return rc
    role = _read_role(r)
    sig = -rc
    if sig in asked:  # stopped as asked (Ctrl-C, the supervisor): nothing to name
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    name = signal.strsignal(sig) or f"signal {sig}"
    rank = os.environ.get("PMI_RANK", "?")
    sys.stderr.write(f"distnn: rank {rank} (pid {child.pid}, host {socket.gethostname()})"
                     f"{', ' + role if role else ''}: ended by signal {sig} ({name})\n")
    sys.stderr.flush()
    if sig not in (signal.SIGKILL, signal.SIGSTOP):
        signal.signal(sig, signal.SIG_DFL)
    os.kill(os.getpid(), sig)
    return 128 + sig


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
