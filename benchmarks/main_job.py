"""The README main job end to end against the same recipe in a plain PyTorch DDP script.

    python benchmarks/main_job.py [--reps 3] [--json FILE]

distnn: ``mpiexec -n 2 distnn train`` exactly as README.md runs it (simplecnn, Fashion-MNIST,
3 epochs, batch 64 per rank, SGD 0.01 momentum 0.9, 20% of the training images validate),
plus ``--history_file`` to read the per-epoch validation accuracy. PyTorch:
benchmarks/workers/ddp_main_job.py, the same recipe, launched by ``torchrun --standalone
--nproc_per_node 2`` (gloo; torchrun gives each rank 1 thread, distnn picks 1 per rank).

Measured per system, runs alternating, medians over ``--reps``:
- wall: launch of the launcher to its exit (imports, data, model, 3 epochs with validation,
  the final test, shutdown), and the final test accuracy;
- time to first step: a separate launch that stops after one training step; the time from
  the launch to the end of rank 0's first optimizer step (distnn: the end of the first
  ``optimizer.update`` event of its Chrome trace; PyTorch: a time.time() stamp after
  ``opt.step()``), so it holds the launcher, interpreter start, imports, JIT/extension
  loading, reading the data, building the model and one step.
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent
MPIEXEC = str(BIN / "mpiexec") if (BIN / "mpiexec").exists() else shutil.which("mpiexec")
DISTNN = str(BIN / "distnn")
TORCHRUN = str(BIN / "torchrun") if (BIN / "torchrun").exists() else shutil.which("torchrun")


def _run(cmd: list[str], cwd: Path, timeout: float = 900) -> tuple[float, float, str]:
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    t1 = time.time()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n"
                           f"{proc.stdout[-1500:]}\n{proc.stderr[-1500:]}")
    return t0, t1, proc.stdout


def distnn_full(folder: Path) -> dict:
    t0, t1, out = _run([MPIEXEC, "-n", "2", DISTNN, "train", "--history_file", "h.json"],
                       folder)
    test = [ln for ln in out.splitlines() if ln.startswith("Test")]
    match = re.search(r"accuracy[^0-9]*([0-9.]+)(%?)", test[-1]) if test else None
    if match is None:
        raise RuntimeError(f"no test accuracy in distnn's output:\n{out[-1500:]}")
    acc = float(match.group(1)) / (100 if match.group(2) else 1)
    hist = json.loads((folder / "h.json").read_text())
    records = hist["records"] if isinstance(hist, dict) and "records" in hist else hist
    val = [r.get("val_accuracy") for r in records] if isinstance(records, list) else \
        records.get("val_accuracy")
    return {"wall": t1 - t0, "test_accuracy": acc, "val_accuracy": val}


def distnn_first_step(folder: Path) -> float:
    t0, _, _ = _run([MPIEXEC, "-n", "2", DISTNN, "train", "--num_epochs", "1",
                     "--steps_per_epoch", "1", "--evaluate", "false", "--quiet",
                     "--trace", "t.json"], folder)
    events = json.loads((folder / "t.json.rank0").read_text())["traceEvents"]
    ends = [e["ts"] + e["dur"] for e in events if e.get("name") == "optimizer.update"]
    return min(ends) / 1e6 - t0


def torch_full(folder: Path) -> dict:
    t0, t1, _ = _run([TORCHRUN, "--standalone", "--nproc_per_node", "2",
                      str(HERE / "workers" / "ddp_main_job.py"), "out.json"], folder)
    stamps = json.loads((folder / "out.json").read_text())
    return {"wall": t1 - t0, "test_accuracy": stamps["test_accuracy"],
            "val_accuracy": stamps["val_accuracy"]}


def torch_first_step(folder: Path) -> float:
    t0, _, _ = _run([TORCHRUN, "--standalone", "--nproc_per_node", "2",
                     str(HERE / "workers" / "ddp_main_job.py"), "out.json",
                     "--first-step-only"], folder)
    return json.loads((folder / "out.json").read_text())["first_step"] - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", help="also write every run's figures here")
    args = ap.parse_args()
    if not (MPIEXEC and TORCHRUN and Path(DISTNN).exists()):
        sys.exit("needs mpiexec, torchrun and the distnn command in this Python's bin folder")
    runs: dict[str, dict[str, list]] = {s: {"wall": [], "test_accuracy": [], "first": [],
                                           "val_accuracy": []} for s in ("distnn", "torch")}
    systems = {"distnn": (distnn_full, distnn_first_step),
               "torch": (torch_full, torch_first_step)}
    for rep in range(args.reps):
        for name, (full, first) in systems.items():
            with tempfile.TemporaryDirectory() as d:
                r = full(Path(d))
            with tempfile.TemporaryDirectory() as d:
                f = first(Path(d))
            for k in ("wall", "test_accuracy", "val_accuracy"):
                runs[name][k].append(r[k])
            runs[name]["first"].append(f)
            print(f"[rep {rep + 1}/{args.reps}] {name:6s} wall {r['wall']:6.1f} s  test "
                  f"{r['test_accuracy']:.4f}  first step {f:5.2f} s", flush=True)
    med = {n: {k: statistics.median(v) for k, v in runs[n].items() if k != "val_accuracy"}
           for n in runs}
    print()
    print(f"README main job (2 ranks, 3 epochs) vs plain PyTorch DDP; medians of {args.reps} "
          "runs, alternating")
    print()
    print("| system | wall s (launch to exit) | test accuracy | time to first step s | "
          "per-run wall s | per-run first step s | val accuracy by epoch (last run) |")
    print("|---|---:|---:|---:|---|---|---|")
    for name, label in (("distnn", "`mpiexec -n 2 distnn train`"),
                        ("torch", "PyTorch DDP (gloo), `torchrun`")):
        r = runs[name]
        print(f"| {label} | {med[name]['wall']:.1f} | {med[name]['test_accuracy']:.4f} | "
              f"{med[name]['first']:.2f} | {', '.join(f'{w:.1f}' for w in r['wall'])} | "
              f"{', '.join(f'{w:.2f}' for w in r['first'])} | "
              f"{', '.join(f'{a:.4f}' for a in r['val_accuracy'][-1])} |")
    print()
    print(f"distnn / PyTorch: wall {med['torch']['wall'] / med['distnn']['wall']:.2f}x faster, "
          f"time to first step {med['torch']['first'] / med['distnn']['first']:.2f}x faster")
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=1))


if __name__ == "__main__":
    main()
