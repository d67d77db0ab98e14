"""Time to first step: wall time from launching a fresh interpreter to the end of the first
training step (imports, JIT/cache load, data shard, model build, one step), per system.

    python benchmarks/first_step.py [--model simplecnn] [--reps 5]

Systems: distnn with the compiled kernels (numba, from its disk cache), distnn on the NumPy
path, and PyTorch eager; one thread each; runs alternate; medians are printed.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

DISTNN = r"""
import os, sys, time
sys.path.insert(0, {workers!r})
import _common as C
C.pin_threads(1)
import distnn  # first, as the command does
import numpy as np
from distnn.models import get_model
from distnn.nn.losses import CategoricalCrossEntropy
from distnn.optim import SGD
x, y = C.rank_shard({model!r}, 0, 1, 0)
model = get_model({model!r}, input_shape=C.INPUT_SHAPES[{model!r}], num_classes=10,
                  dtype=np.float32, rng=0)
opt = SGD(model, lr=0.01, momentum=0.9)
logits = model.forward(x[:64], training=True)
_, dy = CategoricalCrossEntropy()(logits, y[:64])
model.backward(dy)
opt.step()
print("DONE", time.time())
"""

def run(code: str, env: dict) -> float:
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True)
    if proc.returncode != 0:
        raise SystemExit(f"a first-step run failed:\n{proc.stderr[-2000:]}")
    out = proc.stdout
    done = float([ln for ln in out.splitlines() if ln.startswith("DONE")][-1].split()[1])
    return done - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="simplecnn", choices=["simplecnn", "lenet"])
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    here = os.path.dirname(os.path.abspath(__file__))
    workers = os.path.join(here, "workers")
    code = DISTNN.format(workers=workers, model=args.model)
    tcode = TORCH_STEP.format(workers=workers, model=args.model)
    systems = {
        "distnn (numba, cached)": (code, {"DISTNN_KERNELS": "numba"}),
        "distnn (numpy)": (code, {"DISTNN_KERNELS": "numpy"}),
        "torch eager": (tcode, {}),
    }
    times = {k: [] for k in systems}
    for _ in range(args.reps):
        for name, (src, extra) in systems.items():
            times[name].append(run(src, dict(os.environ, **extra)))
    print(f"time to first step, {args.model}, batch 64, 1 thread; median of {args.reps} "
          "fresh processes (s)")
    print()
    print("| system | median s | min s |")
    print("|---|---:|---:|")
    for name, ts in times.items():
        print(f"| {name} | {statistics.median(ts):.2f} | {min(ts):.2f} |")


TORCH_STEP = r"""
import os, sys, time
sys.path.insert(0, {workers!r})
import _common as C
C.pin_threads(1)
import torch
import torch.nn as nn
torch.set_num_threads(1)
x, y = C.rank_shard({model!r}, 0, 1, 0)
if {model!r} == "lenet":
    net = nn.Sequential(nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                        nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                        nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(),
                        nn.Linear(84, 10))
else:
    net = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Conv2d(4, 8, 3), nn.ReLU(),
                        nn.MaxPool2d(2), nn.Flatten(), nn.Linear(1152, 128), nn.ReLU(),
                        nn.Linear(128, 10))
opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
loss = nn.CrossEntropyLoss()(net(torch.from_numpy(x[:64])), torch.from_numpy(y[:64]))
loss.backward()
opt.step()
print("DONE", time.time())
"""

if __name__ == "__main__":
    main()
