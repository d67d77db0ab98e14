"""--gradient_compression through the distnn command on real data (sklearn digits, float64;
the last global batch is uneven): dense equivalence, exact --resume (also mid-epoch), a
resume on another number of ranks, bytes in the profile and trace, clear errors."""
from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest

from rulejobs import run_cli
from helpers import distnn_in_process, needs_mpi

# digits: 1150 training samples; global batch 64 (2 ranks) or 96 (3): the last is uneven
COMMON = ["--model", "simplecnn", "--dataset", "digits", "--dtype", "float64",
          "--batch_size", "32", "--learning_rate", "0.05", "--quiet", "--evaluate", "false"]


def _train(tmp_path, n, name, *args):
    weights = tmp_path / f"{name}.npz"
    proc = run_cli(n, "train", *COMMON, *args, "--save_weights", str(weights), timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with np.load(weights) as z:
        return {k: z[k] for k in z.files}, proc.stdout + proc.stderr


def _max_rel(a, b):
    top = max(np.max(np.abs(v)) for v in b.values())
    return max(float(np.max(np.abs(a[k] - b[k]))) for k in b) / top


@needs_mpi
def test_topk_one_equals_dense_training(tmp_path):
    dense, _ = _train(tmp_path, 2, "dense", "--num_epochs", "1")
    topk, _ = _train(tmp_path, 2, "topk", "--num_epochs", "1",
                     "--gradient_compression", "topk:1.0")
    assert _max_rel(topk, dense) <= 1e-10


@pytest.fixture(scope="module")
def topk_first(tmp_path_factory):
    """One epoch on 2 ranks with topk:0.05 and a checkpoint: the first half of
    test_resume_is_exact[2-topk] and of test_resume_on_more_ranks (each resumes a copy)."""
    folder = tmp_path_factory.mktemp("topk_first")
    ckpt = folder / "ck.npz"
    weights, _ = _train(folder, 2, "first", "--num_epochs", "1", "--checkpoint", str(ckpt),
                        "--gradient_compression", "topk:0.05")
    return weights, ckpt


@needs_mpi
@pytest.mark.slow
@pytest.mark.parametrize("n,spec,extra", [
    (2, "topk:0.05", []),
    (3, "powersgd:2", ["--compression_warmup_steps", "3"]),
    pytest.param(3, "threshold:0.003", ["--checkpoint_steps", "5"], marks=pytest.mark.long),
])
def test_resume_is_exact(tmp_path, n, spec, extra, request):
    args = ["--gradient_compression", spec, *extra]
    straight, _ = _train(tmp_path, n, "straight", "--num_epochs", "2", *args)
    ckpt = str(tmp_path / "ck.npz")
    if (n, spec, extra) == (2, "topk:0.05", []):
        first, shared = request.getfixturevalue("topk_first")
        shutil.copy(shared, ckpt)
    else:
        first, _ = _train(tmp_path, n, "first", "--num_epochs", "1", "--checkpoint", ckpt,
                          *args)
    resumed, _ = _train(tmp_path, n, "resumed", "--num_epochs", "2", "--resume", ckpt, *args)
    assert _max_rel(resumed, straight) <= 1e-12
    assert _max_rel(first, straight) > 1e-4
    with np.load(ckpt) as z:  # the resumed run's checkpoint keeps every rank's residual
        keys = [k for k in z.files if "residuals" in k]
    assert len(keys) == n


@needs_mpi
def test_resume_on_more_ranks_splits_the_residuals(tmp_path, topk_first):
    from distnn.distributed import LocalComm
    from distnn.models import get_model
    from distnn.optim import SGD
    from distnn.rules import DataParallel
    from distnn.training import Trainer, load_checkpoint
    ckpt = str(topk_first[1])  # read here, resumed from a copy
    copy = str(tmp_path / "ck3.npz")  # a resumed run keeps checkpointing to its file
    shutil.copy(ckpt, copy)
    _, out = _train(tmp_path, 3, "more", "--num_epochs", "2", "--resume", copy,
                    "--gradient_compression", "topk:0.05", "--quiet", "false")
    assert "residuals of 2 ranks summed and split evenly over 3 ranks" in out
    # the arithmetic, through the public API: one process gets the sum of both residuals
    state = load_checkpoint(ckpt)
    stored = [state.arrays[k] for k in sorted(state.arrays) if "residuals" in k]
    assert len(stored) == 2 and all(np.any(r) for r in stored)
    model = get_model("simplecnn", input_shape=(1, 8, 8), num_classes=10, dtype=np.float64)
    rule = DataParallel(compression="topk:0.05")
    trainer = Trainer(model, SGD(model, lr=0.05), comm=LocalComm(), rule=rule,
                      progress=False, verbose=False)
    state.restore(trainer)
    assert np.array_equal(trainer.optimizer.compressor.residual, stored[0] + stored[1])
    assert trainer.optimizer.compressor.steps == 18


@needs_mpi
def test_profile_and_trace_show_bytes_before_and_after(tmp_path):
    trace = tmp_path / "t.json"
    _, out = _train(tmp_path, 2, "prof", "--num_epochs", "1", "--steps_per_epoch", "4",
                    "--gradient_compression", "topk:0.01", "--profile", "--trace", str(trace))
    m = re.search(r"data rank 0: \d+ messages sent, [0-9.]+ MB \(([0-9.]+) kB/step; "
                  r"([0-9.]+) kB/step before compression\)", out)
    assert m, out
    assert float(m.group(1)) * 5 < float(m.group(2))
    events = json.loads((tmp_path / "t.json.rank0").read_text())["traceEvents"]
    steps = [e["args"] for e in events if e["name"] == "allreduce.wait"]
    assert len(steps) == 4
    assert all(0 < a["bytes"] * 5 < a["bytes_dense"] for a in steps)


BAD_COMPRESSION = [
    (["--gradient_compression", "topk:2"], ["--gradient_compression", "(0, 1]"]),
    (["--gradient_compression", "powersgd"], ["powersgd needs a value"]),
    (["--gradient_compression", "zip"], ["unknown", "topk:RATIO"]),
    (["--parallel", "localsgd", "--gradient_compression", "topk:0.01"],
     ["--parallel data", "localsgd"]),
    (["--compression_warmup_steps", "-1"], ["--compression_warmup_steps", ">= 0"]),
]


@pytest.mark.parametrize("args,words", BAD_COMPRESSION)
def test_bad_compression_options_are_named(args, words):
    # through the command's entry in this process, but the first case and the one refused
    # once the run has its communicator (after MPI's start): real processes
    real = BAD_COMPRESSION.index((args, words)) in (0, 3)
    run = (lambda *a: run_cli(0, *a)) if real else distnn_in_process
    proc = run("train", "--dataset", "synthetic", "--num_samples", "64",
               "--steps_per_epoch", "1", "--quiet", *args)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    for w in words:
        assert w in proc.stderr, proc.stderr
