"""Validation-loss curves of gpt_mini on 2 ranks: ``distnn train`` against the PyTorch peer
(``gpt_torch.py``: the same corpus, byte tokens, windows, initial weights, AdamW groups,
warm-up + cosine schedule and clipping), median over seeds, drawn to
docs/gpt_mini_curves.png, with a table of the medians.

distnn: ``mpiexec -n 2 distnn train --model gpt_mini --dataset text --context C
--batch_size B --optimizer adamw ... --validate_every K --steps_per_epoch S --num_epochs 1
--random_seed SEED`` (its "Validation after N updates" lines); torch: ``python
benchmarks/gpt_torch.py --ranks 2 ... --seed SEED`` (DDP on gloo). Both validate on the
whole validation split after every K updates.

    python benchmarks/gpt_curves.py                          # 3 seeds, 300 steps
    python benchmarks/gpt_curves.py --seeds 1 --steps 100 --validate_every 25
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
_VAL = re.compile(r"Validation after (\d+) updates: .*?val_loss=([0-9.]+)")


def recipe(args) -> dict:
    return {"context": args.context, "batch_size": args.batch_size, "lr": args.lr,
            "beta2": 0.99, "weight_decay": 0.1, "warmup_steps": args.warmup_steps,
            "min_lr_ratio": 0.1, "clip_grad_norm": 1.0}


def run_distnn(args, seed: int) -> dict:
    r = recipe(args)
    bin_dir = Path(sys.executable).parent
    cmd = [str(bin_dir / "mpiexec"), "-n", str(args.ranks), str(bin_dir / "distnn"), "train",
           "--model", "gpt_mini", "--dataset", "text", "--context", str(r["context"]),
           "--batch_size", str(r["batch_size"]), "--optimizer", "adamw",
           "--learning_rate", str(r["lr"]), "--beta2", str(r["beta2"]),
           "--decay", str(r["weight_decay"]), "--lr_schedule", "cosine",
           "--warmup_steps", str(r["warmup_steps"]), "--min_lr_ratio", str(r["min_lr_ratio"]),
           "--clip_grad_norm", str(r["clip_grad_norm"]), "--steps_per_epoch", str(args.steps),
           "--num_epochs", "1", "--validate_every", str(args.validate_every),
           "--random_seed", str(seed), "--evaluate", "false", "--threads", "1"]
    if args.save_weights and seed == 0:
        cmd += ["--save_weights", args.save_weights, "--overwrite", "true"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=7200)
    if p.returncode:
        raise RuntimeError(f"distnn train failed:\n{p.stderr[-3000:]}")
    curve = [(int(s), float(v)) for s, v in _VAL.findall(p.stdout + p.stderr)]
    if not curve:
        raise RuntimeError(f"distnn train printed no validation:\n{p.stdout[-2000:]}")
    return {"system": "distnn", "seed": seed, "seconds": time.perf_counter() - t0,
            "curve": curve}


def run_torch(args, seed: int) -> dict:
    r = recipe(args)
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "torch.json"
        cmd = [sys.executable, str(HERE / "gpt_torch.py"), "--ranks", str(args.ranks),
               "--steps", str(args.steps), "--validate_every", str(args.validate_every),
               "--seed", str(seed), "--out", str(out),
               *(f"--{k}={v}" for k, v in r.items())]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=7200,
                           env={**os.environ, "OMP_NUM_THREADS": "1"})
        if p.returncode:
            raise RuntimeError(f"gpt_torch.py failed:\n{p.stderr[-3000:]}")
        return json.loads(out.read_text())


def median_curve(runs: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    steps = sorted(set.intersection(*(set(s for s, _ in r["curve"]) for r in runs)))
    vals = np.array([[dict(r["curve"])[s] for s in steps] for r in runs])
    return np.array(steps), np.median(vals, axis=0)


def draw(curves: dict, path: Path, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, (steps, vals) in curves.items():
        ax.plot(steps, vals, marker="o", ms=3, label=name)
    ax.set_xlabel("updates")
    ax.set_ylabel("validation loss (nats/byte)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--validate_every", type=int, default=50)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--batch_size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup_steps", type=int, default=30)
    p.add_argument("--png", default=str(ROOT / "docs" / "gpt_mini_curves.png"))
    p.add_argument("--json", default=None, help="also write every run here")
    p.add_argument("--save_weights", default=None,
                   help="distnn's seed-0 weights (.npz), e.g. for distnn generate")
    args = p.parse_args(argv)
    runs = {"distnn": [], "torch": []}
    for seed in range(args.seeds):  # the systems alternate within each seed
        for name, fn in (("distnn", run_distnn), ("torch", run_torch)):
            r = fn(args, seed)
            runs[name].append(r)
            print(f"seed {seed} {name}: final val_loss {r['curve'][-1][1]:.4f} "
                  f"({r['seconds']:.0f} s, load {os.getloadavg()[0]:.1f})", flush=True)
            if args.json:  # after every run: a busy machine may not let all of them end
                Path(args.json).write_text(json.dumps(runs))
    curves = {name: median_curve(rs) for name, rs in runs.items()}
    title = (f"gpt_mini on fortunes, {args.ranks} ranks x batch {args.batch_size} x "
             f"{args.context} bytes, median of {args.seeds} seed(s)")
    draw(curves, Path(args.png), title)
    steps = curves["distnn"][0]
    print(f"\n{title}\n| updates | distnn val_loss | torch val_loss | distnn / torch |")
    print("|---|---|---|---|")
    tv = dict(zip(*curves["torch"]))
    for s, v in zip(*curves["distnn"]):
        if s in tv:
            print(f"| {s} | {v:.4f} | {tv[s]:.4f} | {v / tv[s]:.4f} |")
    final = curves["distnn"][1][-1] / tv[steps[-1]]
    print(f"\nfinal: distnn / torch = {final:.4f} ({(final - 1) * 100:+.2f} %); drawn to "
          f"{args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
