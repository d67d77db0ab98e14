"""distnn.torch.DistributedOptimizer(compression=topk/powersgd) on real MPI jobs (2 and 3
ranks, digits, float64, uneven shards): what sends everything equals dense training, what
sends less keeps residuals and sends fewer bytes."""
from __future__ import annotations

import pickle
import sys

import numpy as np
import pytest

from torchjobs import PROGS, mpirun, needs_mpi


@pytest.fixture(scope="module", params=[2, 3], ids=lambda n: f"np{n}")
def runs(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(f"compression{request.param}")
    proc = mpirun(request.param, sys.executable, PROGS / "compression_torch_prog.py", out,
                  timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return pickle.load(open(out / "out.pkl", "rb"))


@needs_mpi
@pytest.mark.parametrize("name,tol", [("topk1", 1e-10), ("powersgd_full", 1e-6)])
def test_sending_everything_equals_dense(runs, name, tol):
    dense, run = runs["dense"]["weights"], runs[name]
    assert run["compressed"]
    assert np.max(np.abs(run["weights"] - dense)) / np.max(np.abs(dense)) <= tol


@needs_mpi
@pytest.mark.parametrize("name", ["topk_low", "powersgd2"])
def test_compressing_sends_less_and_keeps_residuals(runs, name):
    run = runs[name]
    assert run["residual"] > 0
    assert run["bytes"] * 4 < run["bytes_dense"] == runs["dense"]["bytes"]
    dense = runs["dense"]["weights"]
    assert np.max(np.abs(run["weights"] - dense)) > 1e-4


def test_per_tensor_collectives_refuse_the_stateful_compressions():
    import torch

    import distnn.torch as hvd
    hvd.init()
    with pytest.raises(ValueError, match="works inside DistributedOptimizer"):
        hvd.allreduce(torch.ones(3), compression=hvd.Compression.topk(0.1))
