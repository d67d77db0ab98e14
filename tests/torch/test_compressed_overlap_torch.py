"""distnn.torch.DistributedOptimizer's compressed exchanges overlapped with backward equal
the blocking ones bit for bit (weights, residuals, Q) on 2 and 3 ranks."""
from __future__ import annotations


import numpy as np
import pytest

from torchjobs import needs_mpi, prog_ranks


@pytest.fixture(scope="module", params=[2, 3], ids=lambda n: f"np{n}")
def ranks(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(f"overlap_torch{request.param}")
    return prog_ranks("compressed_overlap_torch_prog.py", request.param, out, timeout=300)


@needs_mpi
@pytest.mark.parametrize("name", ["topk", "threshold", "powersgd"])
def test_overlapped_equals_blocking_bit_for_bit(ranks, name):
    for res in ranks:
        over, block = res[name]
        assert over["overlap"] and not block["overlap"]
        assert over["buckets"] >= 4 and over["early_starts"] > 0
        assert block["early_starts"] == 0
        for a, b in zip(over["steps"], block["steps"]):
            assert np.array_equal(a["weights"], b["weights"])
            assert np.array_equal(a["residual"], b["residual"])
            assert all(np.array_equal(p, q) for p, q in zip(a["q"], b["q"]))
        assert np.abs(over["steps"][-1]["residual"]).max() > 0
