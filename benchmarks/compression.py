"""Gradient compression on real data: bytes per step and accuracy of dense, fp16, top-k and
PowerSGD training, 2 ranks on one machine.

For each model (simplecnn, resnet20) and each compression it runs itself under
``mpiexec -n RANKS`` (one BLAS thread per rank), trains on the first ``--train-samples``
Fashion-MNIST training images for ``--epochs`` epochs (SGD, momentum 0.9, the same seed
and batches for every compression), tests on the first ``--test-samples`` test images
and prints a Markdown table: bytes per step each rank handed to the collectives before
(dense, in the gradients' dtype) and after compression (mean over all steps), their
ratio on the compressed steps (after the warm-up), the final test
accuracy, its gap to dense in points, the wall time. Each compressed spec also runs with
every ``--warmups`` value (dense steps first), so the table shows which warm-up, if any,
closes the gap. Bytes are counted, not timed: they do not depend on the machine's load;
the wall times do (run it on an idle machine).

    python benchmarks/compression.py                          # the full run (see --help)
    python benchmarks/compression.py --models simplecnn --train-samples 512 \\
        --test-samples 256 --epochs 1 --warmups 0           # smoke run, ~1 min
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SPECS = ["none", "fp16", "topk:0.01", "powersgd:2"]


def run_rank(args) -> None:
    """One rank of one run (under mpiexec): train, test, rank 0 writes the JSON."""
    import numpy as np

    from distnn import distributed as dist
    from distnn.data import ArrayDataset, load_dataset
    from distnn.models import get_model
    from distnn.optim import SGD
    from distnn.rules import DataParallel
    from distnn.training import Trainer

    comm = dist.init()
    with dist.abort_on_error(comm):
        splits = load_dataset("fashion_mnist", download=False)
        x, y = splits.train.arrays()
        tx, ty = splits.test.arrays()
        if args.model.startswith("vgg"):  # five 2x2 poolings: 28x28 padded to 32x32
            pad = ((0, 0), (0, 0), (2, 2), (2, 2))
            x, tx = np.pad(x[:args.train_samples], pad), np.pad(tx[:args.test_samples], pad)
        train = ArrayDataset(x[:args.train_samples], y[:args.train_samples], 10)
        test = ArrayDataset(tx[:args.test_samples], ty[:args.test_samples], 10)
        model = get_model(args.model, input_shape=train.input_shape, num_classes=10,
                          dtype=np.float32, rng=0)
        rule = DataParallel(compression=args.run,
                            compression_warmup_steps=args.warmup)
        trainer = Trainer(model, SGD(model, lr=args.lr, momentum=0.9), comm=comm, rule=rule,
                          progress=False, verbose=False, seed=0)
        t0 = time.perf_counter()
        trainer.fit(train, epochs=args.epochs, batch_size=args.batch, shuffle=True)
        wall = time.perf_counter() - t0
        logs = trainer.evaluate(test, batch_size=256)
        stats = comm.allgather_obj(rule.stats())
        if comm.rank == 0:
            Path(args.out).write_text(json.dumps({
                "stats": stats, "wall": wall, "steps": trainer.global_step,
                "accuracy": float(logs["accuracy"]), "size": comm.size}))


def launch(model: str, spec: str, warmup: int, args, folder: Path) -> dict:
    out = folder / f"{model}_{spec.replace(':', '_')}_{warmup}.json"
    mpiexec = shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or "mpiexec"
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
               MKL_NUM_THREADS="1")
    cmd = [mpiexec, "-n", str(args.ranks), sys.executable, __file__, "--run", spec,
           "--model", model, "--warmup", str(warmup), "--out", str(out),
           "--epochs", str(args.epochs), "--batch", str(args.batch), "--lr", str(args.lr),
           "--train-samples", str(args.train_samples),
           "--test-samples", str(args.test_samples)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        return {"error": (proc.stderr or proc.stdout).strip().splitlines()[-1:]}
    return json.loads(out.read_text())


def row(model: str, spec: str, warmup: int, res: dict, dense: dict | None) -> str:
    if "error" in res:
        return f"| {model} | {spec} | {warmup} | failed: {res['error']} |" + " |" * 5
    stats, steps = res["stats"], max(res["steps"], 1)
    sent = sum(s["bytes"] for s in stats) / len(stats)
    before = sum(s.get("bytes_dense", s["bytes"]) for s in stats) / len(stats) / steps
    after = sent / steps
    # the warm-up steps are dense all-reduces of `before` bytes each
    compressed = (sent - warmup * before) / (steps - warmup) if steps > warmup else after
    gap = "—"
    if dense is not None and "error" not in dense:
        gap = f"{100 * (res['accuracy'] - dense['accuracy']):+.2f}"
    return (f"| {model} | {spec} | {warmup} | {before / 1e3:.1f} | {after / 1e3:.1f} | "
            f"1/{before / max(compressed, 1e-9):.1f} | {res['accuracy']:.4f} | {gap} | "
            f"{res['wall']:.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["simplecnn", "resnet20"])
    parser.add_argument("--specs", nargs="+", default=SPECS)
    parser.add_argument("--warmups", default="0,100",
                        help="comma-separated dense warm-up steps for the compressed specs")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch", type=int, default=64, help="per rank")
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--train-samples", type=int, default=12000)
    parser.add_argument("--test-samples", type=int, default=2000)
    parser.add_argument("--json", help="also write every run's raw results here")
    parser.add_argument("--run", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--warmup", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        run_rank(args)
        return
    warmups = [int(w) for w in args.warmups.split(",")]
    print(f"Fashion-MNIST (first {args.train_samples} training / {args.test_samples} test "
          f"images), {args.ranks} ranks, SGD lr {args.lr} momentum 0.9, batch {args.batch} "
          f"per rank, {args.epochs} epochs, float32; bytes: per step per rank, handed to "
          "the collectives")
    print("| model | compression | warm-up steps | kB/step before | kB/step after (mean) "
          "| ratio after warm-up | test acc | gap to dense (points) | wall s |")
    print("|---|---|---|---|---|---|---|---|---|")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models:
            dense = None
            for spec in args.specs:
                compressing = spec not in ("none", "fp16")
                for warmup in (warmups if compressing else [0]):
                    res = launch(model, spec, warmup, args, Path(tmp))
                    results[f"{model}/{spec}/{warmup}"] = res
                    if spec == "none":
                        dense = res
                    print(row(model, spec, warmup, res, dense), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
