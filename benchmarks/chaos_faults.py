"""The faults of the chaos run (issue 44, benchmarks/chaos.py) and their seeded schedule.

Each fault is a function ``inject(ctx, fault)`` that does the harm and undoes it after
its duration (a link back up, a stopped rank continued, a filled disk emptied); ``ctx``
is the running ``chaos.Chaos`` (its cluster, job pids, checkpoint path, log).
"""
from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from dataclasses import dataclass, field

# kind -> (what the issue asks, expected outcome: "goes on" or "restart")
KINDS = {
    "kill_rank": "kill -9 of one rank (not rank 0)",
    "kill_host": "kill -9 of every process of a host",
    "kill_rank0": "kill -9 of rank 0",
    "kill_in_write": "kill -9 of rank 0 during a checkpoint write",
    "stop_short": "SIGSTOP of a rank, shorter than --stall_timeout",
    "stop_long": "SIGSTOP of a rank, longer than --stall_timeout",
    "link_down_5s": "ip link set down for 5 s",
    "link_down_60s": "ip link set down for 60 s",
    "throttle": "link at 10 Mbit/s (tc tbf) for 60 s",
    "disk_full": "checkpoint storage (tmpfs) full for 30 s",
    "corrupt_ck": "newest checkpoint truncated, then a rank killed",
    "host_back": "a dropped host comes back (taken at the next restart)",
}
GOES_ON = {"stop_short", "link_down_5s", "throttle", "disk_full"}


@dataclass
class Fault:
    kind: str
    at: float                  # seconds after the job started (planned)
    host: str = ""
    duration: float = 0.0
    injected: float = 0.0      # monotonic time it was injected
    ended: float = 0.0         # monotonic time it was undone
    notes: list = field(default_factory=list)


def schedule(seed: int, seconds: float, hosts: list[str], stall_timeout: float,
             repeat: int = 2) -> list[Fault]:
    """Every kind ``repeat`` times over ``seconds``, in seeded random order and spacing;
    some pairs close together (the second 3-10 s after the first)."""
    rng = random.Random(seed)
    kinds = [k for k in KINDS if k != "host_back"] * repeat  # host_back: watched, not made
    rng.shuffle(kinds)
    durations = {"stop_short": stall_timeout * 0.4, "stop_long": stall_timeout * 2.5,
                 "link_down_5s": 5.0, "link_down_60s": 60.0, "throttle": 60.0,
                 "disk_full": 30.0}
    faults, t = [], 45.0  # after the first steps (start-up takes 20-40 s here)
    gap = max(4.0, (seconds - 90.0) / max(1, len(kinds)))
    for i, kind in enumerate(kinds):
        close = i > 0 and rng.random() < 0.3
        t += rng.uniform(3, 10) if close else rng.uniform(0.6 * gap, 1.4 * gap)
        # never rank 0's host for a host-level fault: the supervisor reads its checkpoint
        host = rng.choice(hosts[1:])
        faults.append(Fault(kind, t, host, durations.get(kind, 0.0)))
    return faults


def _rank_pids(ctx, host: str) -> list[int]:
    """The distnn train processes on ``host``."""
    out = []
    for pid in ctx.cluster.pids(host):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if any(a.endswith(b"distnn") for a in argv) and b"train" in argv:
            out.append(pid)
    return out


def _signal(pids, sig) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _tc_rate(ctx, host: str, rate: str) -> None:
    h = next(x for x in ctx.cluster.hosts if x.name == host)
    for ns, dev in (((), h.link), (("-n", host), "eth0")):
        subprocess.run(["tc", *ns, "qdisc", "change", "dev", dev, "root", "tbf", "rate",
                        rate, "burst", "256kb", "latency", "50ms"], check=False,
                       capture_output=True)


def _link(ctx, host: str, state: str) -> None:
    h = next(x for x in ctx.cluster.hosts if x.name == host)
    subprocess.run(["ip", "link", "set", h.link, state], check=False, capture_output=True)


# faults aimed at one host's ranks or link: on a host the job has dropped they hurt nothing
ON_A_RANK = {"kill_rank", "kill_host", "stop_short", "stop_long", "link_down_5s",
             "link_down_60s", "throttle", "corrupt_ck"}


def _host_in_the_job(ctx, f: Fault) -> str:
    """``f.host`` when ranks of the job run there, else another host (not rank 0's) that
    has some, waiting up to 60 s for a restart to bring them; "" when none does."""
    end = time.monotonic() + 60
    while not ctx.stopping:
        if _rank_pids(ctx, f.host):
            return f.host
        live = [h for h in ctx.hosts[1:] if _rank_pids(ctx, h)]
        if live:
            f.notes.append(f"{f.host} is not in the job now: aimed at {live[0]}")
            return live[0]
        if time.monotonic() > end:
            break
        time.sleep(0.2)
    f.notes.append(f"not reached: no rank of the job on {f.host} or another host")
    return ""


def _fill(path: str) -> int:
    """Write zeros to ``path`` until its disk is full; the bytes written."""
    block, done = bytes(1 << 16), 0
    with open(path, "ab", buffering=0) as out:
        while True:
            try:
                n = out.write(block)
            except OSError:  # ENOSPC: full (a short write came before it)
                return done
            done += n or 0
            if not n:
                return done


def inject(ctx, f: Fault) -> None:
    """Do fault ``f`` now (blocking for its duration; the driver runs it in a thread)."""
    if f.kind in ON_A_RANK:
        f.host = _host_in_the_job(ctx, f) or f.host
    f.injected = time.monotonic()
    k, host = f.kind, f.host
    rank0 = ctx.hosts[0]
    if k == "kill_rank":
        pids = _rank_pids(ctx, host)
        _signal(pids, signal.SIGKILL)
        f.notes.append(f"{host} pids {pids}")
    elif k == "kill_host":
        f.notes.append(f"{host}: {len(ctx.cluster.kill(host))} processes")
    elif k == "kill_rank0":
        pids = _rank_pids(ctx, rank0)
        _signal(pids, signal.SIGKILL)
        f.notes.append(f"{rank0} pids {pids}")
        f.host = rank0
    elif k == "kill_in_write":
        f.host = rank0
        end = time.monotonic() + 120
        while time.monotonic() < end and not ctx.stopping:
            tmp = [n for n in os.listdir(ctx.ck_dir)
                   if n.startswith(".") and n.endswith(".part")]
            if tmp and _rank_pids(ctx, rank0):
                break
            time.sleep(0.005)
        pids = _rank_pids(ctx, rank0)
        f.notes.append(("in write (temp file seen)" if tmp else "just after a write")
                       + f"; killed {pids or 'nothing: no rank 0 running'}")
        _signal(pids, signal.SIGKILL)
        f.injected = time.monotonic()
    elif k in ("stop_short", "stop_long"):
        pids = _rank_pids(ctx, host)
        _signal(pids, signal.SIGSTOP)
        ctx.sleep(f.duration)
        _signal(pids, signal.SIGCONT)
    elif k.startswith("link_down"):
        _link(ctx, host, "down")
        ctx.sleep(f.duration)
        _link(ctx, host, "up")
    elif k == "throttle":
        _tc_rate(ctx, host, "10mbit")
        ctx.sleep(f.duration)
        _tc_rate(ctx, host, ctx.rate)
    elif k == "disk_full":
        # Full for the whole duration, as a disk another writer keeps filling: a fill
        # made once can land while a checkpoint's finished temporary file waits for its
        # rename; the rename then frees the previous copy, and every later write fits in
        # the space the copy before it leaves (the likely cause of one CI run in which no
        # write failed).
        filler = os.path.join(ctx.ck_dir, "filler")
        end, fills, topped = time.monotonic() + f.duration, 0, 0
        while time.monotonic() < end and not ctx.stopping:
            topped += _fill(filler) > 0 and fills > 0  # space freed since: filled again
            fills += 1
            time.sleep(0.02)
        f.notes.append(f"full for {f.duration:g} s; space came free and was filled again "
                       f"{topped} times")
        if os.path.exists(filler):  # a relaunch by the driver may have emptied it
            os.unlink(filler)
    elif k == "corrupt_ck":
        if os.path.exists(ctx.ck):
            size = os.path.getsize(ctx.ck)
            os.truncate(ctx.ck, size // 2)
            ctx.truncated.add(os.stat(ctx.ck).st_mtime_ns)  # not a checkpoint the run lost
            f.notes.append(f"truncated {size} -> {size // 2} bytes")
        _signal(_rank_pids(ctx, host), signal.SIGKILL)
    f.ended = time.monotonic()
