"""Horovod's PyTorch surface on distnn.torch under real ``mpiexec -n 2`` and ``-n 3`` jobs:
every call of Horovod's three examples (progs/horovod_prog.py re-writes their flows on a
small model), N ranks == 1 process for Average, Sum, predivide, compression none,
backward_passes_per_step and the synchronize/skip_synchronize pattern (float64, 1e-10),
Adasum == the reference combination of every rank's local delta,
the collectives, process sets and join() with ranks given 3, 4 (and 5) batches."""
from __future__ import annotations

import re
import sys

import numpy as np
import pytest

from torchjobs import EXAMPLES, mpirun, needs_mpi, prog_ranks

EXACT = ["average", "sum", "passes2", "predivide", "clip_scaler", "adasum"]


@pytest.fixture(scope="module", params=[2, 3], ids=lambda n: f"np{n}")
def hvd_run(request, tmp_path_factory):
    n = request.param
    out = tmp_path_factory.mktemp(f"horovod{n}")
    return n, prog_ranks("horovod_prog.py", n, out, timeout=180)


@needs_mpi
@pytest.mark.parametrize("flow", EXACT + ["fp16", "adasum_fp16_passes2"])
def test_mnist_example_calls_and_n_ranks_equal_one_process(hvd_run, flow):
    n, results = hvd_run
    runs = [res["mnist"][flow] for res in results]
    assert all(np.array_equal(runs[0]["flat"], r["flat"]) for r in runs), "ranks differ"
    assert all(r["metric"] == runs[0]["metric"] for r in runs)  # allreduce(name="avg_loss")
    diffs = runs[0]["diffs"]
    assert len(diffs) == 4
    if flow in EXACT:  # "adasum": against every rank's delta combined by the reference
        assert max(diffs) < 1e-10, (flow, diffs)
        assert runs[0]["calls"] == 4 * runs[0]["buckets"]
    elif flow == "fp16":  # float16 on the wire: 3 significant digits
        assert 1e-12 < max(diffs) < 1e-3, diffs
    else:  # Adasum is not the average: it moved the weights elsewhere, the same on all
        assert max(diffs) > 1e-3, diffs
    if flow == "adasum":
        avg = results[0]["mnist"]["average"]["flat"]
        assert np.abs(runs[0]["flat"] - avg).max() > 1e-3


@needs_mpi
def test_synthetic_benchmark_and_imagenet_example_calls(hvd_run):
    n, results = hvd_run
    for key in ("synthetic_adasum=False", "synthetic_adasum=True"):
        assert all(np.array_equal(results[0][key]["flat"], r[key]["flat"]) for r in results)
        assert all(r[key]["img_sec"] > 0 for r in results)
    im = [r["imagenet"] for r in results]
    assert [i["resume"] for i in im] == [2] * n  # broadcast(name="resume_from_epoch")
    assert all(np.array_equal(im[0]["flat"], i["flat"]) for i in im)
    # restored on rank 0 from the checkpoint, then broadcast: weights, momentum and lr
    for i in im:
        np.testing.assert_array_equal(i["restored"], im[0]["flat"])
        np.testing.assert_array_equal(i["momentum"], im[0]["momentum"])
        assert i["lr"] == pytest.approx(0.02 * n)
        assert i["loss"] == im[0]["loss"] and 0 <= i["acc"] <= 1  # Metric via allreduce


@needs_mpi
def test_collectives(hvd_run):
    n, results = hvd_run
    s = n * (n + 1) / 2  # sum of rank + 1
    for rank, res in enumerate(results):
        c = res["collectives"]
        assert c["avg"] == [s / n, -(n - 1.0)]
        assert c["sum_scaled"] == [s, -n * (n - 1.0)]  # pre 2.0, post 0.5
        assert c["min_max_prod"][0] == [1.0, -2.0 * (n - 1)]
        assert c["min_max_prod"][1] == [float(n), 0.0]
        assert c["min_max_prod"][2][0] == float(np.prod(range(1, n + 1)))
        assert c["async"] == [s, -n * (n - 1.0)]
        base = np.arange(6.0).reshape(2, 3)
        expect = base + rank
        expect[:, ::2] = n * base[:, ::2] + n * (n - 1) / 2
        assert c["async_inplace"] == expect.tolist()
        ranks_sum = n * (n - 1) / 2
        assert c["grouped"] == [[ranks_sum] * 2, [int(ranks_sum + n * k) for k in range(3)],
                                [[ranks_sum] * 2] * 2]
        assert c["grouped_inplace"] == [[ranks_sum / n] * 2, [[ranks_sum / n] * 2] * 2]
        assert c["allgather"] == [[float(r)] * 2 for r in range(n) for _ in range(r + 1)]
        assert c["grouped_allgather"] == [list(range(n)), [[float(r)] for r in range(n)]]
        assert c["broadcast"] == [n - 1.0] and c["broadcast_async"] == [1]
        split = [len(a) for a in np.array_split(np.arange(n + 1), n)]
        lo = sum(split[:rank])
        assert c["alltoall"] == [10.0 * r + k for r in range(n)
                                 for k in range(lo, lo + split[rank])]
        recv, rsplits = c["alltoall_splits"]
        lo = rank * (rank + 1) // 2
        assert rsplits == [rank + 1] * n
        assert recv == [100.0 * r + k for r in range(n) for k in range(lo, lo + rank + 1)]
        full = np.arange((n + 1) * 2.0).reshape(n + 1, 2)
        mine = full[sum(split[:rank]):sum(split[:rank + 1])]
        assert c["reducescatter"] == (mine * s).tolist()
        assert c["reducescatter_avg"] == (mine * s / n * 3).tolist()
        assert c["grouped_reducescatter"] == [(mine * s).tolist(), (mine * 2 * s).tolist()]
        dtype, half, compressed = c["fp16"]
        assert dtype == "torch.float32" and compressed
        np.testing.assert_allclose(half, [s / n / 3, -(n - 1.0) / 3], rtol=1e-3)
        assert half != [s / n / 3, -(n - 1.0) / 3]  # it did travel as float16
        assert c["object"] == {"from": n - 1}
        assert c["objects"] == [("rank", r) for r in range(n)]
        assert c["autograd"] == [s, s]  # d/dx sum_r (r + 1) * allreduce_sum(x)
        assert c["adasum_err"] < 1e-12
        # Horovod's gradients: allgather/broadcast average (broadcast: root only),
        # alltoall sends them back, reducescatter(Sum) gathers them times the size
        g = c["grads"]
        lo = rank * (rank + 1) // 2
        assert g["allgather"] == [[2.0 * k, 2.0 * k + 1] for k in range(lo, lo + rank + 1)]
        assert g["broadcast"] == [1.0 if rank == n - 1 else 0.0] * 2
        assert g["alltoall"] == [r + 1.0 for r in range(n)]
        assert g["reducescatter"] == [[float(n)] * 2] * n


@needs_mpi
def test_basics_and_process_sets(hvd_run):
    n, results = hvd_run
    for rank, res in enumerate(results):
        b = res["basics"]
        assert b["initialized"] and b["mpi_built"] and b["mpi_enabled"]
        assert b["not_built"] == [False] * 7  # gloo, nccl, ddl, ccl, cuda, rocm: CPU build
        assert isinstance(b["threads"], bool) and b["homogeneous"]
        assert b["local"] == (rank, n) and b["cross"] == (0, 1)  # one host
        p = res["process_sets"]
        member = rank in (0, n - 1)
        assert p["ends"] == (member, 2, [0, n - 1].index(rank) if member else -1, [0, n - 1])
        if member:
            assert p["ends_sum"] == n - 1 and p["ends_bcast"] == n - 1
            assert p["ends_gather"] == [0, n - 1]
        if rank == 1:
            assert p["odd_sum"] == 6 and p["outsider_error"] is None
        else:
            assert "is not in process set [1]" in p["outsider_error"]
        assert p["removed"] and res["after_shutdown"] is False
    # the optimizer on a process set averages over its members only
    flats = [res["process_sets"]["ps_opt_flat"] for res in results]
    assert np.array_equal(flats[0], flats[-1])
    if n == 3:
        assert not np.array_equal(flats[0], flats[1])


@needs_mpi
def test_join_with_uneven_batches(hvd_run):
    n, results = hvd_run
    for rank, res in enumerate(results):
        j = res["join"]
        # rank r had 3 + r batches; the last to join was the one with the most
        assert j["last"] == n - 1 and j["calls"] == 3 + rank
        # the joined ranks added zeros: every step matched sum(live grads) / size
        assert j["diff"] < 1e-10
        # Horovod's join test: rank 0 joined first; its zeros count in the average
        if rank:
            assert j["avg"] == [6.0 * (n - 1) / n, 3.0 * (n - 1) / n]
            assert "a rank has called join()" in j["allgather_error"]
        assert j["ret0"] != 0 and j["rets"] == [j["ret0"]] * n


@needs_mpi
@pytest.mark.long  # Adasum's arithmetic: tests/distributed/test_adasum.py, test_mnist_example_calls
def test_horovod_mnist_example_adasum_trains_like_average(tmp_path):
    """examples/horovod_mnist.py on 2 ranks, 120 steps on Fashion-MNIST: Average (lr
    scaled by size) and Adasum (not scaled) reach about the same test accuracy."""
    pytest.importorskip("distnn.data")
    acc = {}
    for flag in ("", "--use-adasum"):
        argv = [sys.executable, EXAMPLES / "horovod_mnist.py", "--epochs", "1", "--steps",
                "120", "--lr", "0.02", "--momentum", "0.9", "--log-interval", "1000"]
        proc = mpirun(2, *(argv + ([flag] if flag else [])), cwd=tmp_path, timeout=300)
        if "not found" in proc.stderr and "fashion" in proc.stderr.lower():
            pytest.skip("Fashion-MNIST not found")
        assert proc.returncode == 0, proc.stderr[-3000:]
        match = re.search(r"^Test set: Average loss: \S+, Accuracy: (\S+)%$", proc.stdout, re.M)
        assert match, proc.stdout
        acc[flag or "average"] = float(match.group(1)) / 100
    print(acc)
    assert acc["average"] > 0.6 and acc["--use-adasum"] > 0.6, acc
    assert abs(acc["average"] - acc["--use-adasum"]) < 0.05, acc
