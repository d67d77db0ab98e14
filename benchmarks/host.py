"""The host a benchmark runs on: CPU time of this process tree and of others, the
load, waiting for an idle host, the two-core capacity probes and the machine's description."""
from __future__ import annotations

import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

HZ = os.sysconf("SC_CLK_TCK")


# ----------------------------------------------------------------------------- helpers
def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def cpu_busy_s() -> float:
    """Seconds of CPU time the whole machine has spent busy since boot."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (v[0] + v[1] + v[2] + v[5] + v[6]) / HZ


def children_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def foreign_load(window: float = 2.0) -> float:
    """Cores used by other processes over the next ``window`` seconds (we are idle)."""
    b0 = cpu_busy_s()
    time.sleep(window)
    return (cpu_busy_s() - b0) / window


def wait_idle(max_wait: float, threshold: float) -> float:
    t_end = time.time() + max_wait
    while True:
        load = foreign_load()
        if load < threshold or time.time() >= t_end:
            return load
        log(f"[bench] machine busy ({load:.2f} cores used by others), waiting")
        time.sleep(5)


# One process counting 384^3 float32 GEMMs on one BLAS thread for a fixed time (stdin
# closes when to start; it prints the count).
_PROBE = ("import os, sys, time; os.environ['OPENBLAS_NUM_THREADS'] = '1'; import numpy as np; "
          "a = np.ones((384, 384), np.float32); c = np.empty_like(a); "
          "[np.matmul(a, a, out=c) for _ in range(20)]; sys.stdin.read(); n = 0; "
          "t = time.perf_counter() + float(sys.argv[1])\n"
          "while time.perf_counter() < t:\n np.matmul(a, a, out=c); n += 1\n"
          "print(n)")


# 64 MiB copied again and again: twice the L3 of the hosts seen, so this is memory traffic
_COPY_PROBE = ("import sys, time; import numpy as np; "
               "a = np.ones(1 << 24, np.float32); c = np.empty_like(a); np.copyto(c, a); "
               "sys.stdin.read(); n = 0; t = time.perf_counter() + float(sys.argv[1])\n"
               "while time.perf_counter() < t:\n np.copyto(c, a); n += 1\n"
               "print(n)")


def core_capacity(seconds: float = 1.0, probe: str = _PROBE) -> float:
    """How many cores' worth of work the host gives two processes at once: the GEMMs two
    one-thread processes do side by side ÷ those one does alone (2.0 on two free cores).
    A shared host's second core is sometimes taken by other guests (no steal time shows in
    a KVM guest): this is the ceiling that a 1p2t ÷ 1p1t speed-up is measured under.
    ``memory_capacity`` is the same with copies of 64 MiB arrays: memory bandwidth."""
    counts = []
    for procs in (1, 2):
        ps = [subprocess.Popen([sys.executable, "-c", probe, str(seconds)], text=True,
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})
              for _ in range(procs)]
        time.sleep(0.5 + 0.3 * procs)  # numpy imported and warm in each
        for p in ps:
            p.stdin.close()
        counts.append(sum(int(p.stdout.read().strip() or 0) for p in ps))
        for p in ps:
            p.wait()
    return counts[1] / counts[0] if counts[0] else float("nan")


def memory_capacity(seconds: float = 1.0) -> float:
    """Two processes' copies of 64 MiB arrays side by side ÷ one's alone: how much of a
    second stream of memory traffic the host gives (2.0 = bandwidth not shared). Models
    whose passes over activations are memory-bound cannot scale past it at 2 threads."""
    return core_capacity(seconds, _COPY_PROBE)


def capacities() -> tuple[float, float]:
    """(compute, memory) two-core capacities, measured now."""
    return core_capacity(), memory_capacity()


def machine_info():
    info = {"host": platform.node(), "kernel": platform.release(),
            "python": platform.python_version(), "cpus": os.cpu_count()}
    try:
        with open("/proc/cpuinfo") as f:
            names = [ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")]
        info["cpu"] = names[0] if names else "?"
        with open("/proc/cpuinfo") as f:
            flags = next((ln for ln in f if ln.startswith("flags")), "").split()
        info["isa"] = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "?"
        with open("/proc/meminfo") as f:
            kb = int(f.readline().split()[1])
        info["mem_gib"] = round(kb / 2**20, 1)
    except OSError:
        pass
    for mod in ("numpy", "torch", "mpi4py", "numba"):
        try:
            info[mod] = __import__("importlib.metadata").metadata.version(mod)
        except Exception:
            info[mod] = "not installed"
    try:
        info["git"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE.parent,
                                     capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=HERE.parent,
                               capture_output=True, text=True).stdout.strip()
        info["git"] += " (+ uncommitted changes)" if dirty else ""
    except OSError:
        pass
    return info


def loadavg():
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"
