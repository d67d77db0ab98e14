"""The process table as ``distnn.cluster.slurm`` tears down with it: every process's
parent, name, command line and network namespace (from ``/proc``), whether a pid is still
alive (a zombie is not), and signals that ignore a process already gone.
"""
from __future__ import annotations

import os

from distnn import fileio


def _processes() -> dict[int, tuple[int, str, str, int | None]]:
    """{pid: (ppid, comm, command line, network namespace inode)} of every process."""
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        try:
            netns = os.stat(f"/proc/{name}/ns/net").st_ino
        except OSError:
            netns = None
        out[int(name)] = (ppid, comm, cmdline, netns)
    return out


def _netns_inode(name: str) -> int | None:
    try:
        return os.stat(f"/run/netns/{name}").st_ino
    except OSError:
        return None


def _alive(pid: int) -> bool:
    if not fileio._alive(pid):
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:  # a zombie is gone for our purposes
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
