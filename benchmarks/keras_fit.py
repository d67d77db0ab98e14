"""A Keras 3 model trained through distnn against the same model through Keras's own
``fit()``, both on Keras's torch backend, one process.

    python benchmarks/keras_fit.py                    # 5 repetitions, 1 thread
    python benchmarks/keras_fit.py --reps 3 --threads 2 --write-results
    python benchmarks/keras_fit.py --quick            # tiny smoke run (not a measurement)

The model is a Keras ``Sequential`` CNN for Fashion-MNIST-sized inputs (two Conv2D+ReLU+
MaxPooling2D, Dense(64)+ReLU, Dense(10)+softmax; 56k parameters), written once as a model
file. The same samples (random, Fashion-MNIST's shape; speed does not depend on the
values), batch 64, SGD with momentum 0.9, categorical cross-entropy and accuracy:

* ``distnn``: ``distnn.run.build_run`` on that model file, what ``distnn train --model
  FILE.py`` runs (``distnn.torch.keras.KerasModel``, distnn's optimizer and trainer);
* ``keras fit``: ``model.compile(...)`` and ``model.fit(...)`` (Keras's torch trainer).

Each measurement is a fresh interpreter with its thread count fixed before torch loads; it
trains ``--epochs`` epochs of ``--samples`` samples and reports samples/s of every epoch
but the first (warm-up). Systems alternate (A B A B ...) ``--reps`` times; the table shows
medians of the pooled epochs and the ratio distnn / keras fit (above 1: distnn is faster).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS_MD = HERE / "RESULTS.md"
MARKER = "BENCH_JSON "

MODEL_FILE = '''
import keras


def get_model():
    return keras.Sequential([
        keras.Input((28, 28, 1)),
        keras.layers.Conv2D(16, 3, activation="relu"),
        keras.layers.MaxPooling2D(2),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.MaxPooling2D(2),
        keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10, activation="softmax"),
    ])
'''

DISTNN = r"""
import json, sys
from distnn.run import build_config, build_run
cfg = build_config("train", {{"model": {model!r}, "dataset": "synthetic",
    "input_shape": (1, 28, 28), "num_classes": 10, "num_samples": {samples},
    "batch_size": 64, "num_epochs": {epochs}, "optimizer": "sgd", "momentum": 0.9,
    "learning_rate": 0.01, "evaluate": False, "validation_split": 0.0, "quiet": True,
    "threads": {threads}}})
run = build_run(cfg)
history = run.fit()
rates = [r["samples_per_s"] for r in history.records]
print({marker!r} + json.dumps({{"rates": rates[1:]}}))
"""

KERAS = r"""
import json, os, sys, time
os.environ["KERAS_BACKEND"] = "torch"
import torch
torch.set_num_threads({threads})
import numpy as np
import keras
sys.path.insert(0, {folder!r})
from kmodel import get_model
keras.utils.set_random_seed(0)
model = get_model()
model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
              loss="categorical_crossentropy", metrics=["accuracy"])
rng = np.random.default_rng(0)
x = rng.normal(size=({samples}, 28, 28, 1)).astype(np.float32)
y = keras.utils.to_categorical(rng.integers(0, 10, {samples}), 10)
times = []
class Clock(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        self.t0 = time.perf_counter()
    def on_epoch_end(self, epoch, logs=None):
        times.append(time.perf_counter() - self.t0)
model.fit(x, y, batch_size=64, epochs={epochs}, shuffle=True, verbose=0, callbacks=[Clock()])
print({marker!r} + json.dumps({{"rates": [{samples} / t for t in times[1:]]}}))
"""


def measure(code: str, threads: int) -> list[float]:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads),
               MKL_NUM_THREADS=str(threads), DISTNN_NUM_THREADS=str(threads),
               KERAS_BACKEND="torch")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(MARKER)]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"a measurement failed (exit {proc.returncode}):\n"
                         f"{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len(MARKER):])["rates"]


def report(rates: dict[str, list[float]], args) -> str:
    med = {k: statistics.median(v) for k, v in rates.items()}
    host = os.uname().nodename
    lines = [f"## A Keras model: distnn against Keras's fit(), torch backend, one process "
             f"({_dt.datetime.now():%Y-%m-%d %H:%M})", "",
             f"`python benchmarks/keras_fit.py --reps {args.reps} --threads {args.threads} "
             f"--samples {args.samples} --epochs {args.epochs}` on {host}: 56k-parameter "
             "Keras CNN, batch 64, SGD; median samples/s over "
             f"{len(next(iter(rates.values())))} epochs (first epoch of each run dropped).",
             "", "| system | samples/s (median) | min | max |", "|---|---|---|---|"]
    for name, values in rates.items():
        lines.append(f"| {name} | {med[name]:,.0f} | {min(values):,.0f} | "
                     f"{max(values):,.0f} |")
    lines += ["", f"distnn / keras fit: **{med['distnn'] / med['keras fit']:.2f}x**", ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--samples", type=int, default=3200)
    ap.add_argument("--epochs", type=int, default=3, help="per run, the first is warm-up")
    ap.add_argument("--quick", action="store_true", help="tiny smoke run (not a measurement)")
    ap.add_argument("--write-results", action="store_true",
                    help="append the report to benchmarks/RESULTS.md")
    args = ap.parse_args()
    if args.quick:
        args.reps, args.samples, args.epochs = 1, 128, 2
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "kmodel.py"
        path.write_text(MODEL_FILE)
        codes = {"distnn": DISTNN.format(model=str(path), samples=args.samples,
                                         epochs=args.epochs, threads=args.threads,
                                         marker=MARKER),
                 "keras fit": KERAS.format(folder=folder, samples=args.samples,
                                           epochs=args.epochs, threads=args.threads,
                                           marker=MARKER)}
        rates: dict[str, list[float]] = {name: [] for name in codes}
        for rep in range(args.reps):
            for name, code in codes.items():
                rates[name] += measure(code, args.threads)
                print(f"rep {rep + 1}/{args.reps} {name}: "
                      f"{statistics.median(rates[name]):,.0f} samples/s so far", flush=True)
    text = report(rates, args)
    print(text)
    if args.write_results:
        with open(RESULTS_MD, "a") as f:
            f.write("\n" + text)


if __name__ == "__main__":
    main()
