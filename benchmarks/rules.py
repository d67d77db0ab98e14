"""The training rules on real data: simplecnn on Fashion-MNIST, every rule, N ranks.

Runs itself under ``mpiexec -n N`` (one BLAS thread per rank) for each rule and N, trains
with the command's defaults (SGD lr 0.01, momentum 0.9, batch 64 per training rank, each
rule's default options), validates on the test split after every epoch, and prints a
Markdown table: epochs and wall time until the test accuracy first reaches the target,
the final test accuracy, messages and MB sent per epoch per rank (mean over the ranks),
the time ranks spent waiting, and for the rules with a master (rank 0) the share of its
serving time it was idle and the CPU it used while serving.

    python benchmarks/rules.py                                   # all rules, 2 and 4 ranks
    python benchmarks/rules.py --rules downpour gem --ranks 3 --epochs 3
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

RULES = ["data", "localsgd", "downpour", "easgd", "gossip", "gem", "partial"]


def step_evaluator(every: int, x, y):
    """A callback that, on rank 0, every ``every`` global steps, measures the accuracy of
    rank 0's replica on the fixed held-out ``x, y`` (no communication: the other ranks go
    on) and records (step, training seconds so far without the evaluations, accuracy), so
    that time to a target is located within ``every`` steps instead of at epoch ends."""
    import numpy as np

    from distnn.training.callback_base import Callback

    class StepEval(Callback):
        def __init__(self):
            self.records, self.eval_s, self.t0 = [], 0.0, None

        def on_train_begin(self, trainer):
            self.t0 = time.perf_counter()

        def on_batch_end(self, trainer, step, logs):
            if trainer.comm.rank != 0 or trainer.global_step % every:
                return
            t = time.perf_counter()
            pred = trainer.model.predict(x, batch_size=500).argmax(axis=1)
            acc = float(np.mean(pred == y))
            now = time.perf_counter()
            self.eval_s += now - t
            self.records.append({"step": trainer.global_step, "accuracy": acc,
                                 "train_s": t - self.t0 - (self.eval_s - (now - t))})
    return StepEval()


def run_rank(args) -> None:
    """One rank of one run (under mpiexec): train, then rank 0 writes the JSON."""
    import numpy as np

    from distnn import distributed as dist
    from distnn.data import load_dataset
    from distnn.models import get_model
    from distnn.optim import get_optimizer
    from distnn.rules import get_rule
    from distnn.training import Trainer

    comm = dist.init()
    with dist.abort_on_error(comm):
        splits = load_dataset("fashion_mnist", test_as_validation=True)
        model = get_model("simplecnn", input_shape=splits.train.input_shape, num_classes=10,
                          dtype=np.float32, rng=0)
        opt = get_optimizer("sgd", model, lr=args.lr, momentum=0.9)
        rule = get_rule(args.run, **json.loads(args.options))
        callbacks = []
        if args.eval_every:  # a fixed held-out set: the first samples of the test split
            x, y = splits.val.arrays()
            y = y.argmax(axis=1) if y.ndim > 1 else y
            callbacks.append(step_evaluator(args.eval_every, x[:args.eval_samples],
                                            y[:args.eval_samples]))
        trainer = Trainer(model, opt, comm=comm, rule=rule, progress=False, verbose=False,
                          seed=0, callbacks=callbacks)
        t0 = time.perf_counter()
        history = trainer.fit(splits.train, epochs=args.epochs, batch_size=args.batch,
                              validation=splits.val, steps_per_epoch=args.steps_per_epoch,
                              validation_steps=args.steps_per_epoch)
        wall = time.perf_counter() - t0
        stats = comm.allgather_obj(rule.stats())
        if comm.rank == 0:
            Path(args.out).write_text(json.dumps({
                "history": history.records, "stats": stats, "wall": wall,
                "steps": trainer.global_step,
                "step_evals": callbacks[0].records if callbacks else [],
                "size": comm.size, "rule": repr(rule)}))


def launch(rule: str, n: int, args, folder: Path) -> dict:
    out = folder / f"{rule}_{n}.json"
    mpiexec = shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or "mpiexec"
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
               MKL_NUM_THREADS="1")
    cmd = [mpiexec, "-n", str(n), sys.executable, __file__, "--run", rule, "--out", str(out),
           "--epochs", str(args.epochs), "--batch", str(args.batch), "--lr", str(args.lr),
           "--options", json.dumps(args.rule_options.get(rule, {}))]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        return {"error": (proc.stderr or proc.stdout).strip().splitlines()[-1:]}
    return json.loads(out.read_text())


def row(rule: str, n: int, res: dict, target: float) -> str:
    if "error" in res:
        return f"| {rule} | {n} | failed: {res['error']} |" + " |" * 7
    hist = res["history"]
    acc_key = "val_accuracy"
    reach = next((h for h in hist if h[acc_key] >= target), None)
    epochs = len(hist)
    to_target = "—"
    if reach is not None:
        upto = [h for h in hist if h["epoch"] <= reach["epoch"]]
        to_target = f"{reach['epoch']} / {sum(h['time'] for h in upto):.1f} s"
    stats = res["stats"]
    msgs = sum(s.get("messages", 0) for s in stats) / len(stats) / epochs
    mb = sum(s.get("bytes", 0) for s in stats) / len(stats) / epochs / 2**20
    wait = max(s.get("wait_s", 0) for s in stats)
    master = stats[0]
    if "serve_s" in master and master["serve_s"] > 0:
        share = (f"{100 * master['idle_s'] / master['serve_s']:.0f}% / "
                 f"{100 * master['busy_s'] / master['serve_s']:.0f}% "
                 f"(CPU {100 * master['serve_cpu_s'] / master['serve_s']:.0f}%)")
    else:
        share = "no master"
    return (f"| {rule} | {n} | {to_target} | {hist[-1][acc_key]:.4f} | {epochs} | "
            f"{res['wall']:.1f} | {msgs:.0f} | {mb:.1f} | {wait:.1f} | {share} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rules", nargs="+", default=RULES, choices=RULES)
    parser.add_argument("--ranks", nargs="+", type=int, default=[2, 4])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--target", type=float, default=0.85)
    parser.add_argument("--json", help="also write every run's raw results here")
    parser.add_argument("--run", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--options", default="{}", help=argparse.SUPPRESS)
    parser.add_argument("--steps-per-epoch", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--eval-every", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--eval-samples", type=int, default=2000, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        run_rank(args)
        return
    args.rule_options = {}
    print(f"simplecnn, Fashion-MNIST (60000 train, test as validation), SGD lr {args.lr} "
          f"momentum 0.9, batch {args.batch} per training rank, {args.epochs} epochs, "
          f"target test accuracy {args.target}")
    print("| rule | ranks | epochs / time to target | final test acc | epochs | wall s "
          "| msgs/epoch/rank | MB/epoch/rank | max wait s | master idle / busy (CPU) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.ranks:
            for rule in args.rules:
                res = launch(rule, n, args, Path(tmp))
                results[f"{rule}_{n}"] = res
                print(row(rule, n, res, args.target), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
