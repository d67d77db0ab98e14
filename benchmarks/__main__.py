"""Side-by-side training benchmarks: distnn against PyTorch eager, PyTorch DDP and PyDTNN.

    python -m benchmarks                         # the full suite, 3 repetitions
    python -m benchmarks --models simplecnn,lenet --configs 1p1t,2r1t --reps 5
    python -m benchmarks --quick                 # tiny smoke run (not a measurement)
    python -m benchmarks --write-results         # also append to benchmarks/RESULTS.md
    python -m benchmarks --task infer            # forward only (distnn predict's), batch 256

Each measurement is a fresh subprocess (a worker in benchmarks/workers/) with its thread
count fixed before numpy/torch load. It trains ``warmup`` untimed steps, then ``windows``
timed windows of ``steps`` steps, and reports per-window samples/s, time per step split
into compute and communication wait, and each rank's peak RSS (``ru_maxrss``). The
harness runs the systems one after another on the same (model, config), repeats the whole
sweep ``--reps`` times (A B A B ...), pools the windows and reports medians and ratios
distnn / peer. PyTorch runs in each of ``--torch-modes`` (eager, channels_last,
torch.compile; DDP too): the ratio that counts is distnn ÷ the fastest of them per model
and config, and torch.compile's compile time (its first warm-up step) is reported apart,
not counted in samples/s. It also measures how much CPU *other* processes used during each run (from
/proc/stat minus its own children) and re-runs a measurement they disturbed.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import importlib.util
import json
import os
import platform
import re
import resource
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORKERS = HERE / "workers"
RESULTS_MD = HERE / "RESULTS.md"
MARKER = "BENCH_JSON "
PYDTNN_HOME = Path(os.environ.get("PYDTNN_PEER_HOME",
                                  Path.home() / ".cache" / "distnn-peers" / "pydtnn"))
PYDTNN_SETUP = "/work/shared/peers/pydtnn/setup.sh"

MODELS = ("simplecnn", "lenet", "vgg11bn", "resnet20", "simplecnn_pydtnn")
CONFIGS = ("1p1t", "1p2t", "2r1t")
PEERS = ("torch", "ddp", "pydtnn")
TORCH_MODES = ("eager", "channels_last", "compile")
MODE_SUFFIX = {"eager": "", "channels_last": "-cl", "compile": "-compile"}
TORCH_SYSTEMS = tuple("torch" + s for s in MODE_SUFFIX.values())
DDP_SYSTEMS = tuple("torch-ddp" + s for s in MODE_SUFFIX.values())
# (warmup steps, timed windows, steps per window) per model: windows of >= ~0.5 s each.
WINDOWS = {"simplecnn": (20, 7, 30), "simplecnn_pydtnn": (20, 7, 30), "lenet": (20, 7, 30),
           "resnet20": (4, 5, 4), "vgg11bn": (2, 5, 2)}
QUICK_WINDOWS = (2, 2, 3)
PYDTNN_MODELS = {"simplecnn_pydtnn"}  # the only zoo model PyDTNN defines layer for layer
PYDTNN_MISMATCH = {
    "simplecnn": "PyDTNN's simplecnn is not the seed's (padding 1, FC 1568, dropout)",
    "lenet": "PyDTNN 3.11 has no LeNet",
    "vgg11bn": "PyDTNN's vgg11bn differs in the head (dropout first, BN after each FC)",
    "resnet20": "PyDTNN's resnet20 differs in the head (extra FC(64)+BN+ReLU) and convs "
                "with bias",
}
# Targets of issue 13 (ratios of medians, same run).
ENGINE_TARGET = {"simplecnn": 1.0, "lenet": 1.0, "vgg11bn": 1.0, "resnet20": 1.0,
                 "simplecnn_pydtnn": 1.0}
ENGINE_TARGET_1T = {"simplecnn": 1.5, "lenet": 1.5}  # stricter at 1 process x 1 thread
PYDTNN_TARGET = 3.0  # 1p1t
DDP_TARGET = {"simplecnn": 1.3, "lenet": 1.3, "vgg11bn": 1.3, "resnet20": 1.3,
              "simplecnn_pydtnn": 1.3}
SCALING_TARGET = 0.9
SCALING_MODELS = ("vgg11bn", "resnet20")
THREADS_TARGET = 1.6  # distnn 1p2t ÷ 1p1t
BEST_TARGET = 1.0  # distnn ÷ the fastest PyTorch mode (issue 39), every model and config
THREADS_MODELS = ("resnet20", "vgg11bn")
HZ = os.sysconf("SC_CLK_TCK")


# ----------------------------------------------------------------------------- helpers
def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def parse_config(name: str) -> tuple[int, int]:
    """'1p2t' -> (1 rank, 2 threads); '2r1t' -> (2 ranks, 1 thread each)."""
    m = re.fullmatch(r"(\d+)([pr])(\d+)t", name)
    if not m or int(m.group(1)) < 1 or int(m.group(3)) < 1 or (m.group(2) == "p"
                                                               and m.group(1) != "1"):
        raise argparse.ArgumentTypeError(
            f"config {name!r} must look like 1p<T>t (1 process, T threads) or <R>r<T>t "
            "(R ranks x T threads), e.g. 1p1t, 1p2t, 2r1t")
    return int(m.group(1)), int(m.group(3))


def csv_list(choices, kind):
    def parse(text):
        items = [s.strip() for s in text.split(",") if s.strip()]
        if choices is not None:
            bad = [s for s in items if s not in choices]
            if bad:
                raise argparse.ArgumentTypeError(
                    f"{kind} {bad} not known; choose from {', '.join(choices)}")
        if kind == "config":
            for s in items:
                parse_config(s)
        return items
    return parse


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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def quantile(xs, q):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    pos = q * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


# ----------------------------------------------------------------------------- systems
class Systems:
    """Which systems exist here and how to launch their workers."""

    def __init__(self, peers, torch_modes=TORCH_MODES, task="train"):
        self.py = sys.executable
        self.torch_modes, self.task = tuple(torch_modes), task
        self.mpiexec = shutil.which("mpiexec", path=str(Path(self.py).parent)) or \
            shutil.which("mpiexec")
        # DDP is launched the way PyTorch users launch it: torchrun picks its own free port
        # (no race between choosing a port and binding it) and supervises its ranks.
        self.torchrun = shutil.which("torchrun", path=str(Path(self.py).parent))
        self.skips: list[str] = []
        self.available = {"distnn": self._check_module("distnn", "distnn",
                                                       "pip install -e . in this venv")}
        if "torch" in peers or "ddp" in peers:
            ok = self._check_module("torch", "torch", "pip install torch==2.13.0")
            if "torch" in peers:
                self.available["torch"] = ok
            if "ddp" in peers:
                self.available["torch-ddp"] = ok and (bool(self.torchrun) or
                                                      self._check_mpiexec("torch-ddp"))
        if "pydtnn" in peers:
            self.available["pydtnn"] = self._check_pydtnn()
        self.pydtnn_py = PYDTNN_HOME / "venv" / "bin" / "python"
        self.pydtnn_mpiexec = PYDTNN_HOME / "venv" / "bin" / "mpiexec"

    def _skip(self, line):
        self.skips.append(line)
        log(line)

    def _check_module(self, system, module, how):
        if importlib.util.find_spec(module) is None:
            self._skip(f"SKIP {system}: Python module {module!r} is not installed in "
                       f"{sys.executable} ({how}).")
            return False
        return True

    def _check_mpiexec(self, system):
        if not self.mpiexec:
            self._skip(f"SKIP {system} (multi-rank configs): no mpiexec next to "
                       f"{self.py} or on PATH (pip install mpich mpi4py).")
            return False
        return True

    def _check_pydtnn(self):
        py = PYDTNN_HOME / "venv" / "bin" / "python"
        data = PYDTNN_HOME / "data" / "fashion-mnist" / "train-images-idx3-ubyte"
        if not py.exists():
            self._skip(f"SKIP pydtnn: not installed (no {py}); run {PYDTNN_SETUP} "
                       "(needs Python 3.13), or set PYDTNN_PEER_HOME.")
            return False
        r = subprocess.run([str(py), "-c", "import pydtnn.datasets.mnist, mpi4py"],
                           capture_output=True, text=True, env=self.env(1, pydtnn=True))
        if r.returncode != 0:
            tail = (r.stderr.strip().splitlines() or ["?"])[-1]
            self._skip(f"SKIP pydtnn: {py} cannot import pydtnn/mpi4py ({tail}); "
                       f"re-run {PYDTNN_SETUP}.")
            return False
        if not data.exists():
            self._skip(f"SKIP pydtnn: no un-gzipped Fashion-MNIST at {data.parent}; "
                       f"re-run {PYDTNN_SETUP}.")
            return False
        return True

    @staticmethod
    def env(threads, pydtnn=False):
        env = dict(os.environ)
        for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                    "BLIS_NUM_THREADS", "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS"):
            env[var] = str(threads)
        env["PYTHONUNBUFFERED"] = "1"
        env["MPICH_UNBUFFERED_STDIO"] = "true"
        if pydtnn:  # another interpreter: nothing of this venv may leak into it
            for var in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"):
                env.pop(var, None)
        return env

    def for_cell(self, model, ranks, peers):
        """Systems measured on (model, ranks), distnn first; plus skip notes."""
        out, notes = [], []
        if self.available.get("distnn"):
            out.append("distnn")
        suffixes = [MODE_SUFFIX[m] for m in self.torch_modes]
        if ranks == 1 and "torch" in peers and self.available.get("torch"):
            out += ["torch" + s for s in suffixes]
        if ranks > 1 and "ddp" in peers and self.available.get("torch-ddp"):
            out += ["torch-ddp" + s for s in suffixes]
        if "pydtnn" in peers and self.available.get("pydtnn"):
            if model in PYDTNN_MODELS:
                out.append("pydtnn")
            else:
                why = PYDTNN_MISMATCH.get(model, "no layer-for-layer PyDTNN definition")
                notes.append(f"SKIP pydtnn on {model}: {why}; the PyDTNN comparison uses "
                             "simplecnn_pydtnn.")
        return out, notes

    def command(self, system, model, ranks, threads, batch, win):
        warmup, windows, steps = win
        common = ["--model", model, "--threads", str(threads), "--batch", str(batch),
                  "--warmup", str(warmup), "--windows", str(windows), "--steps", str(steps),
                  "--task", self.task]
        mode = next((m for m, s in MODE_SUFFIX.items() if s and system.endswith(s)), "eager")
        if system.startswith("torch"):
            system = system[:len(system) - len(MODE_SUFFIX[mode])] if MODE_SUFFIX[mode] \
                else system
            common += ["--mode", mode]
        if system == "distnn":
            cmd = [self.py, str(WORKERS / "distnn_worker.py")] + common
            launcher = self.mpiexec
        elif system == "torch":
            cmd = [self.py, str(WORKERS / "torch_worker.py")] + common
            launcher = None
        elif system == "torch-ddp" and self.torchrun:
            cmd = [self.torchrun, "--standalone", "--nnodes=1", f"--nproc-per-node={ranks}",
                   str(WORKERS / "torch_worker.py")] + common + ["--ddp"]
            return cmd, self.env(threads)
        elif system == "torch-ddp":
            cmd = [self.py, str(WORKERS / "torch_worker.py")] + common + [
                "--ddp", "--port", str(free_port())]
            launcher = self.mpiexec
        elif system == "pydtnn":
            cmd = [str(self.pydtnn_py), str(WORKERS / "pydtnn_worker.py")] + common
            launcher = str(self.pydtnn_mpiexec)
        else:
            raise ValueError(system)
        if ranks > 1 or system == "torch-ddp":
            if not launcher:
                raise RuntimeError(f"{system}: {ranks} ranks need mpiexec, none found")
            cmd = [launcher, "-n", str(ranks)] + cmd
        return cmd, self.env(threads, pydtnn=system == "pydtnn")


# ----------------------------------------------------------------------------- running
def run_one(cmd, env, timeout):
    """Run a worker; return (parsed JSON or None, error text, wall s, others' cores)."""
    b0, c0, t0 = cpu_busy_s(), children_cpu_s(), time.time()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, cwd=str(HERE.parent))
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the worker's own session: mpiexec + ranks
        out, err = proc.communicate()
        err += f"\n[bench] killed after {timeout} s"
    wall = time.time() - t0
    own = children_cpu_s() - c0
    others = max(0.0, (cpu_busy_s() - b0) - own) / wall if wall > 0 else 0.0
    lines = [ln for ln in out.splitlines() if ln.startswith(MARKER)]
    if lines and (proc.returncode == 0 or '"samples_per_s"' in lines[-1]):
        # A rank that dies after rank 0 printed the complete record (torch-ddp's rank 1 has
        # aborted with SIGABRT at interpreter exit) keeps the measurement, with a note.
        note = "" if proc.returncode == 0 else \
            f"exited with rc={proc.returncode} after reporting complete results"
        return json.loads(lines[-1][len(MARKER):]), note, wall, others
    lines = err.strip().splitlines() + out.strip().splitlines()
    # the cause is usually the first error a rank printed, not the launcher's last words
    first = [ln for ln in lines if "Error" in ln or "error:" in ln or "Traceback" in ln][:2]
    tail = "\n".join(first + [ln for ln in lines[-6:] if ln not in first])
    return None, f"rc={proc.returncode}: {tail}", wall, others


def sweep(args, systems, capacity: list | None = None):
    results: dict[tuple, list[dict]] = {}
    errors: dict[tuple, str] = {}
    notes: list[str] = []
    for rep in range(1, args.reps + 1):
        for model in args.models:
            win = QUICK_WINDOWS if args.quick else WINDOWS[model]
            if args.windows:
                win = (win[0], args.windows, win[2])
            if args.steps:
                win = (win[0], win[1], args.steps)
            for config in args.configs:
                ranks, threads = parse_config(config)
                cell_systems, cell_notes = systems.for_cell(model, ranks, args.peers)
                if rep == 1:
                    for n in cell_notes:
                        if n not in notes:
                            notes.append(n)
                            log(n)
                for system in cell_systems:
                    key = (model, config, system)
                    if key in errors:
                        continue  # a worker that failed once fails again; don't burn time
                    cmd, env = systems.command(system, model, ranks, threads, args.batch, win)
                    best = None  # of the attempts, the one others disturbed least
                    for attempt in range(args.retries + 1):
                        got = run_one(cmd, env, args.timeout)
                        if got[0] is None:
                            best = got
                            break
                        if best is None or got[3] < best[3]:
                            best = got
                        if got[3] <= args.max_foreign or attempt == args.retries:
                            break
                        log(f"[bench] {model} {config} {system}: others used {got[3]:.2f} "
                            f"cores, re-running")
                        wait_idle(args.retry_wait, args.max_foreign)
                    res, err, wall, others = best
                    if res is None:
                        errors[key] = err
                        log(f"ERROR {system} {model} {config}: {err}\n  command: "
                            f"{shlex.join(cmd)}")
                        continue
                    if err:
                        note = f"NOTE {system} {model} {config} rep {rep}: {err}"
                        notes.append(note)
                        log(note)
                    res.update(rep=rep, wall_s=wall, others_cores=others, command=cmd)
                    results.setdefault(key, []).append(res)
                    log(f"[rep {rep}/{args.reps}] {model:16s} {config} {system:9s} "
                        f"{median(res['samples_per_s']):8.0f} samples/s  step "
                        f"{1e3 * median(res['step_s']):7.2f} ms  rss "
                        f"{'/'.join(f'{m:.0f}' for m in res['peak_rss_mib'])} MiB  "
                        f"others {others:.2f} cores  ({wall:.1f} s)")
        if capacity is not None:
            capacity.append(capacities())
            log(f"[bench] host two-core capacity after rep {rep}: compute "
                f"{capacity[-1][0]:.2f}, memory {capacity[-1][1]:.2f}")
    return results, errors, notes


# ----------------------------------------------------------------------------- summary
def summarize(runs):
    sps = [v for r in runs for v in r["samples_per_s"]]
    step = [v for r in runs for v in r["step_s"]]
    comm = [v for r in runs for v in r["comm_wait_s"]]
    nranks = len(runs[0]["peak_rss_mib"])
    rss = [median([r["peak_rss_mib"][k] for r in runs]) for k in range(nranks)]
    med = median(sps)
    return {"sps": med, "iqr_pct": 100 * (quantile(sps, .75) - quantile(sps, .25)) / med,
            "step_ms": 1e3 * median(step), "comm_ms": 1e3 * median(comm),
            "compute_ms": 1e3 * median([s - c for s, c in zip(step, comm)]),
            "rss": rss, "rss_max": max(rss), "windows": len(sps), "runs": len(runs),
            "others": max(r["others_cores"] for r in runs)}


def fmt_ratio(x):
    return "—" if x is None else f"{x:.2f}x"


def build_tables(args, results, errors):
    summ = {k: summarize(v) for k, v in results.items()}
    rows = ["| model | config | system | samples/s | IQR | distnn ÷ system | step ms | "
            "compute ms | comm wait ms | peak RSS/rank MiB | windows | others' load |",
            "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    order = ["distnn", *TORCH_SYSTEMS, *DDP_SYSTEMS, "pydtnn"]
    for model in args.models:
        for config in args.configs:
            base = summ.get((model, config, "distnn"))
            for system in order:
                key = (model, config, system)
                if key in errors and key not in summ:
                    rows.append(f"| {model} | {config} | {system} | error | | | | | | | | |")
                    continue
                s = summ.get(key)
                if s is None:
                    continue
                ratio = (base["sps"] / s["sps"]) if base and system != "distnn" else None
                rows.append(
                    f"| {model} | {config} | {system} | {s['sps']:.0f} | {s['iqr_pct']:.0f}% "
                    f"| {fmt_ratio(ratio)} | {s['step_ms']:.2f} | {s['compute_ms']:.2f} | "
                    f"{s['comm_ms']:.2f} | {' / '.join(f'{m:.0f}' for m in s['rss'])} | "
                    f"{s['windows']} | {s['others']:.2f} |")
    best = []
    for model in args.models:
        for config in args.configs:
            base = summ.get((model, config, "distnn"))
            peer = best_torch(summ, model, config)
            if base and peer:
                best.append(f"| {model} | {config} | {peer[0]} | {peer[1]['sps']:.0f} | "
                            f"{base['sps']:.0f} | {base['sps'] / peer[1]['sps']:.2f}x |")
    if best:
        rows += ["", "Against the fastest PyTorch mode of each model and config:", "",
                 "| model | config | fastest PyTorch | its samples/s | distnn samples/s | "
                 "distnn ÷ it |", "|---|---|---|---:|---:|---:|"] + best
    compile_s = [(k, median([r["first_step_s"] for r in v])) for k, v in results.items()
                 if k[2].endswith("-compile") and all("first_step_s" in r for r in v)]
    if compile_s:
        rows += ["", "torch.compile's compile time (the first warm-up step, median over "
                 "repetitions; not in samples/s): " + ", ".join(
                     f"{m} {c} {s:.1f} s" for (m, c, _), s in compile_s)]
    return summ, "\n".join(rows)


def best_torch(summ, model, config):
    """(system, summary) of the fastest PyTorch mode measured on (model, config)."""
    ranks, _ = parse_config(config)
    found = [(s, summ[(model, config, s)]) for s in
             (TORCH_SYSTEMS if ranks == 1 else DDP_SYSTEMS) if (model, config, s) in summ]
    return max(found, key=lambda item: item[1]["sps"]) if found else None


def target_rows(args, summ):
    """[(target, value text, status)] for every target the run has data for."""
    out = []

    def ratio(model, config, peer):
        a, b = summ.get((model, config, "distnn")), summ.get((model, config, peer))
        return (a["sps"] / b["sps"]) if a and b else None

    def judge(name, value, target, unit="x"):
        if value is None:
            return
        if value >= target:
            status = f"met (+{100 * (value / target - 1):.0f}% margin)"
        else:
            status = (f"**MISSED** by {target - value:.2f}{unit} "
                      f"({100 * (1 - value / target):.0f}% short)")
        out.append((name, f"{value:.2f}{unit} (target ≥ {target:g}{unit})", status))

    def judge_best(model, config):
        peer, a = best_torch(summ, model, config), summ.get((model, config, "distnn"))
        if peer and a:
            judge(f"engine {config} {model}: distnn ÷ fastest PyTorch ({peer[0]})",
                  a["sps"] / peer[1]["sps"], BEST_TARGET)

    for config in args.configs:
        ranks, threads = parse_config(config)
        if ranks != 1:
            continue
        for model, tgt in ENGINE_TARGET.items():
            if config == "1p1t":
                tgt = ENGINE_TARGET_1T.get(model, tgt)
            judge(f"engine {config} {model}: distnn ÷ torch eager",
                  ratio(model, config, "torch"), tgt)
            judge_best(model, config)
        if config == "1p1t":
            judge(f"engine {config} simplecnn (PyDTNN's): distnn ÷ PyDTNN",
                  ratio("simplecnn_pydtnn", config, "pydtnn"), PYDTNN_TARGET)
        if threads > 1 and "1p1t" in args.configs:
            for model in THREADS_MODELS:
                a, b = summ.get((model, config, "distnn")), summ.get((model, "1p1t", "distnn"))
                if a and b:
                    judge(f"threads 1p1t → {config} {model}: distnn speed-up",
                          a["sps"] / b["sps"], THREADS_TARGET)
    for config in args.configs:
        ranks, threads = parse_config(config)
        if ranks == 1:
            continue
        for model, tgt in DDP_TARGET.items():
            judge(f"{config} {model}: distnn ÷ torch DDP (gloo)",
                  ratio(model, config, "torch-ddp"), tgt)
            judge_best(model, config)
        if threads == 1 and "1p1t" in args.configs:
            for model in SCALING_MODELS:
                a, b = summ.get((model, config, "distnn")), summ.get((model, "1p1t", "distnn"))
                if a and b:
                    judge(f"scaling 1p1t → {config} {model}: distnn efficiency",
                          a["sps"] / (ranks * b["sps"]), SCALING_TARGET, unit="")
    for (model, config, system), s in sorted(summ.items()):
        if system != "distnn":
            continue
        ranks, _ = parse_config(config)
        peer = summ.get((model, config, "torch" if ranks == 1 else "torch-ddp"))
        if not peer:
            continue
        over = s["rss_max"] / peer["rss_max"] - 1
        name = f"peak RSS/rank {model} {config}: distnn ≤ {'torch' if ranks == 1 else 'DDP'}"
        value = f"{s['rss_max']:.0f} vs {peer['rss_max']:.0f} MiB"
        status = (f"met ({-100 * over:.0f}% less)" if over <= 0
                  else f"**MISSED** by {s['rss_max'] - peer['rss_max']:.0f} MiB "
                       f"({100 * over:.0f}% more)")
        out.append((name, value, status))
    return out


def scaling_rows(args, summ):
    lines = []
    for system, peer1 in (("distnn", "distnn"), ("torch-ddp", "torch"), ("pydtnn", "pydtnn")):
        for model in args.models:
            for config in args.configs:
                ranks, threads = parse_config(config)
                if ranks == 1:
                    continue
                a = summ.get((model, config, system))
                b = summ.get((model, f"1p{threads}t", peer1))
                if a and b:
                    lines.append(f"| {system} | {model} | 1p{threads}t → {config} | "
                                 f"{a['sps'] / (ranks * b['sps']):.2f} |")
    if not lines:
        return ""
    return ("| system | model | configs | efficiency = N-rank ÷ (N × 1-rank) |\n"
            "|---|---|---|---:|\n" + "\n".join(lines))


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


def render(args, results, errors, notes, skips, load_before, load_after, idle_before,
           started, elapsed, capacity=()):
    summ, table = build_tables(args, results, errors)
    # A --quick run is a smoke test, not a measurement: its numbers judge no target.
    targets = [] if args.quick else target_rows(args, summ)
    mi = machine_info()
    cmd = "python -m benchmarks " + shlex.join(sys.argv[1:])
    lines = [f"## {started:%Y-%m-%d %H:%M} — `{cmd}`", ""]
    if args.quick:
        lines += ["*`--quick`: a smoke run with 2 tiny windows; not a measurement, so no "
                  "target is judged.*", ""]
    lines += [
        f"- machine: {mi.get('cpu', '?')}, {mi.get('cpus')} CPUs, {mi.get('mem_gib', '?')} GiB, "
        f"Linux {mi['kernel']}; Python {mi['python']}, numpy {mi['numpy']}, torch "
        f"{mi['torch']}, mpi4py {mi['mpi4py']}, numba {mi['numba']}; distnn git "
        f"{mi.get('git', '?')}; distnn kernels "
        f"{os.environ.get('DISTNN_KERNELS') or 'default (numba when installed)'}",
        # numpy's OpenBLAS (distnn's GEMMs, PyDTNN's) follows this variable; torch does not
        f"- CPU instruction set {mi.get('isa', '?')}; OPENBLAS_CORETYPE="
        f"{os.environ.get('OPENBLAS_CORETYPE', '(unset: OpenBLAS detects the core)')} "
        "in the environment of every system",
        f"- load average before / after: {load_before} / {load_after}; other processes used "
        f"{idle_before:.2f} cores just before the run; the last column is the most any "
        "measurement saw (cores, averaged over that run)",
        f"- task {args.task}; batch {args.batch} per rank, float32; {args.reps} "
        f"repetition(s), systems "
        f"alternated; wall time {elapsed / 60:.1f} min",
    ]
    if capacity:
        lines.append(
            "- host two-core capacity (two one-thread processes side by side ÷ one alone; "
            "2.00 = nothing shared), before the run and after each repetition: compute "
            "(384³ sgemm) " + ", ".join(f"{c:.2f}" for c, _ in capacity)
            + "; memory (64 MiB copies) " + ", ".join(f"{m:.2f}" for _, m in capacity))
    lines += [
        "",
        table, "",
        "samples/s: median over all timed windows of all repetitions (global: all ranks' "
        "samples over the slowest rank's window time); IQR: interquartile range of those "
        "windows ÷ median; distnn ÷ system: ratio of medians; step ms = compute + comm wait "
        "(medians per window); peak RSS: each rank's `ru_maxrss` (interpreter, libraries, "
        "data shard, model), median over repetitions.",
        "",
    ]
    sc = scaling_rows(args, summ)
    if sc:
        lines += ["Scaling:", "", sc, ""]
    if targets:
        lines += ["Targets (issues 13 and 39):", "", "| target | value | status |", "|---|---|---|"]
        lines += [f"| {n} | {v} | {s} |" for n, v, s in targets]
        lines.append("")
    extra = skips + notes + [f"ERROR {s} {m} {c}: {e.splitlines()[-1] if e else '?'}"
                             for (m, c, s), e in errors.items()]
    if extra:
        lines += ["Skipped / failed:", ""] + [f"- {x}" for x in extra] + [""]
    return "\n".join(lines), summ, targets


def loadavg():
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", type=csv_list(MODELS, "model"), default=list(MODELS),
                    help=f"comma list (default: {','.join(MODELS)})")
    ap.add_argument("--configs", type=csv_list(None, "config"), default=list(CONFIGS),
                    help=f"comma list of 1p<T>t / <R>r<T>t (default: {','.join(CONFIGS)})")
    ap.add_argument("--peers", type=csv_list(PEERS, "peer"), default=list(PEERS),
                    help=f"comma list (default: {','.join(PEERS)}); '' for distnn alone")
    ap.add_argument("--reps", type=int, default=None, help="repetitions (default 3; 1 quick)")
    ap.add_argument("--batch", type=int, default=None,
                    help="samples per rank per step (default 64; 256 with --task infer)")
    ap.add_argument("--task", choices=("train", "infer"), default="train",
                    help="train: training steps; infer: forward only (distnn predict's path, "
                         "PyTorch under inference_mode)")
    ap.add_argument("--torch-modes", type=csv_list(TORCH_MODES, "torch mode"),
                    default=list(TORCH_MODES),
                    help=f"PyTorch's modes to run (default: {','.join(TORCH_MODES)})")
    ap.add_argument("--windows", type=int, default=None, help="override timed windows")
    ap.add_argument("--steps", type=int, default=None, help="override steps per window")
    ap.add_argument("--quick", action="store_true", help="tiny smoke run (not a measurement)")
    ap.add_argument("--write-results", action="store_true",
                    help=f"append the report to {RESULTS_MD.relative_to(HERE.parent)}")
    ap.add_argument("--results-file", type=Path, default=RESULTS_MD)
    ap.add_argument("--json", type=Path, default=None, help="also dump raw results here")
    ap.add_argument("--wait-idle", type=float, default=0.0, metavar="S",
                    help="first wait up to S seconds for other processes to go quiet")
    ap.add_argument("--max-foreign", type=float, default=0.10, metavar="CORES",
                    help="re-run a measurement during which others used more (default 0.10)")
    ap.add_argument("--retries", type=int, default=None,
                    help="re-runs of a disturbed measurement (default 1; 0 with --quick)")
    ap.add_argument("--retry-wait", type=float, default=60.0, metavar="S",
                    help="before a re-run, wait up to S seconds for quiet")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per measurement")
    args = ap.parse_args(argv)
    if args.reps is None:
        args.reps = 1 if args.quick else 3
    if args.retries is None:
        args.retries = 0 if args.quick else 1
    if args.batch is None:
        args.batch = 256 if args.task == "infer" else 64
    if args.reps < 1 or args.batch < 1:
        ap.error("--reps and --batch must be >= 1")

    started = _dt.datetime.now()
    load_before = loadavg()
    idle_before = (wait_idle(args.wait_idle, 0.15) if args.wait_idle > 0 else foreign_load(1.0))
    log(f"[bench] load average {load_before}; others use {idle_before:.2f} cores now")
    systems = Systems(args.peers, args.torch_modes, args.task)
    t0 = time.time()
    capacity = [] if args.quick else [capacities()]
    if capacity:
        log(f"[bench] host two-core capacity: compute {capacity[0][0]:.2f}, memory "
            f"{capacity[0][1]:.2f}")
    results, errors, notes = sweep(args, systems, capacity if capacity else None)
    report, summ, targets = render(args, results, errors, notes, systems.skips, load_before,
                                   loadavg(), idle_before, started, time.time() - t0,
                                   capacity)
    print(report)
    if args.json:
        args.json.write_text(json.dumps(
            {"argv": sys.argv, "results": [{"key": list(k), "runs": v}
                                           for k, v in results.items()],
             "errors": {" ".join(k): e for k, e in errors.items()}}, indent=1))
    if args.write_results:
        path = args.results_file
        head = "" if path.exists() else (
            "# Benchmark results\n\nAppended by `python -m benchmarks --write-results`; "
            "see benchmarks/README.md for what is measured and how.\n\n")
        with open(path, "a") as f:
            f.write(head + report + "\n")
        log(f"[bench] appended to {path}")
    return 1 if errors and not results else 0


if __name__ == "__main__":
    sys.exit(main())
