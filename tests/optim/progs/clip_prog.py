"""Trains a tiny float64 model with AdamW (parameter groups), --clip_grad_norm and the
cosine schedule under the data rule, and evaluates a bigram model's perplexity on token
windows; writes this rank's final weights, the last gradient norm and the perplexity logs.
Usage: clip_prog.py OUT_DIR (under mpiexec, or plain: then one rank). ``result(comm)`` is
what the test compares with one process."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from distnn import distributed as dist
from distnn.data import ArrayDataset, Preprocess
from distnn.data.text import TextDataset
from distnn.nn import Dense, ReLU, Sequential
from distnn.optim import AdamW
from distnn.training import MetricSet, Trainer, evaluate
from distnn.training.callbacks import CosineDecay

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "data"))
from bigram_model import Bigram  # noqa: E402

FEATURES, CLASSES, SAMPLES, GLOBAL_BATCH, MAX_NORM = 5, 3, 48, 12, 0.05


def result(comm) -> dict:
    rng = np.random.default_rng(7)
    x, y = rng.normal(size=(SAMPLES, FEATURES)), rng.integers(0, CLASSES, SAMPLES)
    ds = ArrayDataset(x, y, CLASSES, preprocess=Preprocess(dtype=np.float64, normalize=False))
    model = Sequential([Dense(8), ReLU(), Dense(CLASSES)],
                       input_shape=(FEATURES,), dtype=np.float64, rng=0)
    opt = AdamW(model, lr=0.05, weight_decay=0.5)
    opt.clip_grad_norm = MAX_NORM
    trainer = Trainer(model, opt, comm=comm, progress=False, verbose=False, seed=1,
                      callbacks=[CosineDecay(warmup_steps=2, min_factor=0.1)])
    trainer.fit(ds, epochs=2, global_batch_size=GLOBAL_BATCH)
    tokens = np.random.default_rng(8).integers(0, 16, 400)
    lm = Sequential([Bigram(16)], input_shape=(8,), dtype=np.float64)
    lm.parameters_flat()[:] = np.random.default_rng(9).normal(size=16 * 16)
    logs, _ = evaluate(lm, MetricSet(metrics=["perplexity", "token_accuracy"]), comm,
                       TextDataset(tokens, 8, 16, preprocess=Preprocess(dtype=np.float64)),
                       global_batch_size=7)
    return {"weights": model.parameters_flat().tolist(), "grad_norm": opt.grad_norm,
            "steps": opt.iterations, "lr": opt.lr, "eval": logs}


if __name__ == "__main__":
    comm = dist.init()
    out = result(comm)
    Path(sys.argv[1], f"rank{comm.rank}.json").write_text(json.dumps(out))
