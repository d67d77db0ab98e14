"""N ranks ≡ 1 rank through the real command on resnet20 at 32x32, whose 16->16 3x3 convs
run on Winograd F(4x4, 3x3) (and the 32- and 64-channel ones on F(2x2) / F(4x4))."""
from __future__ import annotations

import pytest
from helpers import MPIEXEC
from test_cli import _history, distnn

needs_mpi = pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec")
pytestmark = pytest.mark.compiled  # the ranks must run the planner's Winograd kernels


def test_resnet20_at_32x32_takes_winograd4():
    pytest.importorskip("numba")
    from distnn.kernels import conv as K
    from distnn.kernels import planner as plan
    g = K.conv_geometry((16, 16, 32, 32), (3, 3), padding=(1, 1, 1, 1))
    assert plan.winograd_tile(g, 16) == 4
    g = K.conv_geometry((16, 64, 8, 8), (3, 3), padding=(1, 1, 1, 1))
    assert plan.winograd_tile(g, 64) == 4


@pytest.mark.mpi
@needs_mpi
@pytest.mark.parametrize("ranks", [2, pytest.param(3, marks=pytest.mark.long)])
def test_resnet20_winograd4_n_ranks_match_one_rank(tmp_path, ranks):
    pytest.importorskip("numba")
    args = ["--dataset", "synthetic", "--input_shape", "3,32,32", "--num_samples", "96",
            "--global_batch_size", "48", "--model", "resnet20", "--num_epochs", "2",
            "--validation_split", "0", "--evaluate", "false", "--quiet",
            "--history_file", "h{}.json"]
    fmt = lambda n: [a.format(n) if "{}" in a else a for a in args]  # noqa: E731
    proc = distnn("train", *fmt(1), cwd=tmp_path, timeout=180)
    assert proc.returncode == 0, proc.stderr
    proc = distnn("train", *fmt(ranks), "--parallel", "data", "--sync_batchnorm",
                  cwd=tmp_path, launcher=(MPIEXEC, "-n", str(ranks)), timeout=180)
    assert proc.returncode == 0, proc.stderr
    h1, hn = _history(tmp_path / "h1.json"), _history(tmp_path / f"h{ranks}.json")
    assert len(h1["loss"]) == 2
    assert hn["loss"] == pytest.approx(h1["loss"], rel=1e-4)
