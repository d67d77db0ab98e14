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
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from .host import (HZ, capacities, children_cpu_s, core_capacity, cpu_busy_s,  # noqa: F401
                   foreign_load, loadavg, log, machine_info, memory_capacity, wait_idle)
from .report import (BEST_TARGET, DDP_SYSTEMS, MODE_SUFFIX, TORCH_SYSTEMS,  # noqa: F401
                     median, parse_config, quantile, render, summarize)

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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
