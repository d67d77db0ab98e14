"""What the stall inspector costs per step: median step time of the same training with the
inspector off, on, and on with its waits polled (interruptible, as in ``distnn search``'s
blocks) in alternating rounds, under mpiexec, and the cost of one ``phase``.

    .venv/bin/python benchmarks/stall.py                     # 2 ranks, simplemlp and simplecnn
    .venv/bin/python benchmarks/stall.py --ranks 3 --rounds 6 --steps 80

Prints a Markdown table (medians over every step of every round of a setting).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path


def worker(args) -> None:
    import distnn  # noqa: F401 - sets the thread variables before numpy
    from distnn.run import build_config, build_run
    from distnn.training import Callback

    class StepTimer(Callback):
        def __init__(self):
            self.times, self.last = [], None

        def on_batch_begin(self, trainer, step):
            self.last = time.perf_counter()

        def on_batch_end(self, trainer, step, logs):
            self.times.append(time.perf_counter() - self.last)

    rows = []
    for model in args.models.split(","):
        cfg = build_config("train", {"model": model, "dataset": "fashion_mnist",
                                     "batch_size": 32, "num_epochs": 1,
                                     "steps_per_epoch": args.steps, "evaluate": False,
                                     "validation_split": 0.0, "quiet": True})
        timer = StepTimer()
        run = build_run(cfg, callbacks=[timer])
        comm = run.comm
        inspector = comm.stall
        modes = ("off", "on", "polled")
        medians = {m: [] for m in modes}
        steps = {m: [] for m in modes}
        for r in range(len(modes) * (args.rounds + 1)):
            mode = modes[r % len(modes)]
            comm.stall = inspector if mode != "off" else None
            inspector.interruptible = mode == "polled"
            timer.times = []
            run.fit()
            if r >= len(modes):  # the first round of each warms up (numba, caches)
                steps[mode] += timer.times[2:]
                medians[mode].append(statistics.median(timer.times[2:]))
        comm.stall = inspector
        inspector.interruptible = False
        t0 = time.perf_counter()
        for _ in range(100_000):
            inspector.phase("forward", step=1)
        phase_ns = (time.perf_counter() - t0) / 100_000 * 1e9
        rows.append((model, comm.size, len(steps["off"]),
                     1e3 * statistics.median(steps["off"]), 1e3 * statistics.median(steps["on"]),
                     1e3 * statistics.median(steps["polled"]), phase_ns))
    if comm.rank == 0:
        print(f"\nStall inspector overhead ({comm.size} ranks, batch 32 per rank, "
              f"{args.rounds} alternating rounds of {args.steps} steps each)\n")
        print("| model | ranks | steps | median step off (ms) | median step on (ms) | "
              "on / off | polled, search blocks (ms) | polled / off | one phase() (ns) |")
        print("|---|---|---|---|---|---|---|---|---|")
        for model, ranks, n, off, on, polled, ns in rows:
            print(f"| {model} | {ranks} | {n} | {off:.3f} | {on:.3f} | {on / off:.3f} | "
                  f"{polled:.3f} | {polled / off:.3f} | {ns:.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--models", default="simplemlp,simplecnn")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    bindir = Path(sys.executable).parent
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    cmd = [str(bindir / "mpiexec"), "-n", str(args.ranks), sys.executable, __file__,
           "--worker", "--rounds", str(args.rounds), "--steps", str(args.steps),
           "--models", args.models]
    sys.exit(subprocess.run(cmd, env=env).returncode)


if __name__ == "__main__":
    main()
