"""Runs training jobs of a sized-down gpt_mini (width 16, one decoder block, 2 heads,
context 8, float64) on byte windows of the real corpus (fortunes), one rule or compression
each; writes what tests/rules/test_rules_transformer.py checks: initial and final weights,
the epoch history. Usage: transformer_prog.py OUT_DIR JOBS_JSON (under mpiexec, or plain:
one rank)."""
from __future__ import annotations

import json

import numpy as np

from distnn.data import Preprocess
from distnn.data.text import TextDataset, corpus_files, read_corpus
from distnn.models import gpt_mini
from distnn.nn.containers import Sequential
from distnn.optim import Adam
from distnn.rules import get_rule
from distnn.training import Trainer, TrainingCheckpoint
from rule_prog import serve  # this folder's shared job loop

CONTEXT, WINDOWS = 8, 48


def corpus() -> TextDataset:
    text = read_corpus(corpus_files(None)[:1])
    tokens = np.frombuffer(text.encode(), np.uint8)[:CONTEXT * WINDOWS + 1]
    return TextDataset(tokens.astype(np.int64), CONTEXT, 256,
                       preprocess=Preprocess(dtype=np.float64))


def run(job: dict, comm, out: str) -> None:
    model = Sequential(gpt_mini(256, width=16, depth=1, heads=2), input_shape=(CONTEXT,),
                       dtype=np.float64, rng=job.get("seed", 0))
    opt = Adam(model, lr=job.get("lr", 0.01))
    rule = get_rule(job["rule"], **job.get("options", {}))
    trainer = Trainer(model, opt, comm=comm, rule=rule, progress=False, verbose=False,
                      seed=job.get("seed", 0), metrics=("perplexity",))
    if job.get("checkpoint"):
        trainer.callbacks.append(TrainingCheckpoint(job["checkpoint"], 1))
    initial = model.parameters_flat().copy()
    trainer.fit(corpus(), epochs=job.get("epochs", 1), shuffle=job.get("shuffle", True),
                global_batch_size=job.get("global_batch", 12), resume=job.get("resume"))
    name = f"{out}/{job['name']}.rank{comm.rank}"
    np.savez(name + ".npz", initial=initial, final=model.parameters_flat())
    with open(name + ".json", "w") as f:
        json.dump({"history": trainer.history.records, "size": comm.size}, f)


if __name__ == "__main__":
    serve(run)
