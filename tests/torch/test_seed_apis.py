"""SINGA's ``opt.DistOpt`` and Needle's ``apps/ddp`` calls on distnn.torch, on 2 and 3 ranks
(tests/torch/progs/seeds_prog.py writes them as those systems' scripts do), and their errors."""
from __future__ import annotations

import pickle
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import distnn.torch as hvd
from distnn.data import ArrayDataset
from distnn.torch import ddp, opt
from torchjobs import PROGS, mpirun, needs_mpi


@pytest.fixture(scope="module", params=[2, 3])
def ranks(request, tmp_path_factory):
    n = request.param
    out = tmp_path_factory.mktemp(f"seeds{n}")
    proc = mpirun(n, sys.executable, PROGS / "seeds_prog.py", out)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return n, [pickle.loads((out / f"rank{r}.pkl").read_bytes()) for r in range(n)]


@needs_mpi
def test_distopt_names_and_exact_update(ranks):
    n, res = ranks
    for r, o in enumerate(res):
        assert o["ids"] == (r, "cpu", n, r, r, r, r)
        # N ranks x batch 4 == one process on the global batch of 4N (float64)
        assert max(o["singa_diffs"]) < 1e-12, o["singa_diffs"]
        assert o["singa_buckets"] >= 1


@needs_mpi
def test_distopt_half_sends_float16_and_clips_like_singa(ranks):
    _, res = ranks
    for o in res:
        assert o["half_wire"] == "<class 'numpy.float16'>"
        # float16 on the wire: close to the exact update but not equal to it
        assert all(0 < d < 1e-4 for d in o["half_diffs"]), o["half_diffs"]


@needs_mpi
def test_distopt_all_reduce_and_wait_sum_in_place(ranks):
    n, res = ranks
    for o in res:
        assert o["all_reduce"] == ([n * (n + 1) / 2] * 3, [float(n * (n - 1))])


@needs_mpi
def test_distopt_sparse_update_topk(ranks):
    n, res = ranks
    for o in res:
        # spars=1.0: every entry sent, the dense update (float64)
        assert max(o["sparse_full_diffs"]) < 1e-12, o["sparse_full_diffs"]
        for corr in (True, False):
            s = o["sparse"][corr]
            assert len(s["compressed"]) == 1, s  # the one tensor of >= 1024 elements
            assert max(s["spread"]) < 1e-13, s       # ranks stay identical
            assert s["compressors"] == 1, s          # one compressor kept across calls
            assert s["ratio"] < 0.5, s               # fewer bytes than dense
        # corr=True keeps the unsent part (SINGA's local accumulation); False drops it
        assert o["sparse"][True]["residual"] > 0
        assert o["sparse"][False]["residual"] == 0


@needs_mpi
def test_distopt_partial_update_averages_one_chunk_per_call(ranks):
    n, res = ranks
    for o in res:
        # one chunk, no momentum: local steps averaged every call == the dense update
        assert max(o["partial_whole_diffs"]) < 1e-12, o["partial_whole_diffs"]
        # local momentum steps, chunk k averaged at calls k, k+4, ... == the replicas'
        # reference, and right after its turn exactly that chunk is equal on all ranks
        assert o["partial_chunks"] == [2, 1, 2, 1]
        assert max(o["partial_diffs"]) < 1e-12, o["partial_diffs"]
        chunks = [[0, 1], [2], [3, 4], [5]]
        assert o["partial_equal"] == [chunks[s % 4] for s in range(9)], o["partial_equal"]


@needs_mpi
def test_needle_ddp_script_trains_as_one_process_on_the_global_batch(ranks):
    n, res = ranks
    for o in res:
        bsz, batches = o["needle_bsz"]
        assert bsz == 12 // n
        used = (62 // n) * n  # Needle's equal partitions leave out len % size samples
        assert batches == -(-used // (bsz * n))
        assert sum(o["needle_local_sizes"]) == 2 * used // n  # two epochs
        assert o["needle_dtype"] == "torch.float64"
        assert max(o["needle_diffs"]) < 1e-12, o["needle_diffs"]
    assert len({tuple(o["needle_local_sizes"]) for o in res}) == 1


def _net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 3))


def test_sgd_alone_trains_like_torch_sgd():
    model, ref = _net(), _net()
    sgd = opt.SGD(lr=0.1, momentum=0.9, weight_decay=0.01, nesterov=True)
    tref = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01,
                           nesterov=True)
    x, y = torch.randn(8, 4), torch.arange(8) % 3
    for _ in range(3):
        sgd(F.cross_entropy(model(x), y))
        tref.zero_grad()
        F.cross_entropy(ref(x), y).backward()
        tref.step()
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q)
    sgd.lr = 0.5
    assert sgd.torch_optimizer.param_groups[0]["lr"] == 0.5


def test_distopt_bad_input_says_what_to_do():
    model = _net()
    with pytest.raises(TypeError, match="DistributedOptimizer"):
        opt.DistOpt(torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(ValueError, match="mpiexec -n N"):
        opt.DistOpt(opt.SGD(), nccl_id=object(), local_rank=0, world_size=2)
    with pytest.raises(ValueError, match="nesterov=True needs momentum > 0"):
        opt.SGD(lr=0.1, nesterov=True)
    with pytest.raises(ValueError, match="lr must be a number"):
        opt.SGD(lr="0.1")
    sgd = opt.DistOpt(opt.SGD(lr=0.1))
    with pytest.raises(TypeError, match="torch tensor computed from the model"):
        sgd.backward_and_update(0.5)
    with pytest.raises(ValueError, match="no autograd graph"):
        sgd.backward_and_update(torch.tensor(1.0))
    with pytest.raises(ValueError, match="must hold one value"):
        sgd.backward_and_update(model(torch.randn(2, 4)))
    with pytest.raises(ValueError, match="contiguous"):
        sgd.all_reduce(torch.ones(4, 4).t())


def test_needle_shapes_and_errors():
    rank, device = ddp.init()
    assert rank == 0 and device == torch.device("cpu")
    xs, ys = np.random.default_rng(0).random((10, 2)), np.arange(10)
    # distnn.torch.partition_dataset takes Needle's shape when device/dtype is given
    loader, bsz = hvd.partition_dataset((xs, ys), 4, device=device, dtype="float32")
    batches = list(loader)
    assert bsz == 4 and [len(b[1]) for b in batches] == [4, 4, 2]
    assert batches[0][0].dtype == torch.float32 and batches[0][1].dtype == torch.int64
    assert sorted(torch.cat([b[1] for b in batches]).tolist()) == list(range(10))
    assert [b[1].tolist() for b in loader] != [b[1].tolist() for b in batches]  # new epoch
    # ... and keeps distnn's (x, y, global size) triples otherwise
    x, y, n = next(iter(hvd.partition_dataset((xs, ys), 4)))
    assert n == 4 and len(y) == 4
    with pytest.raises(ValueError, match="CPU"):
        ddp.partition_dataset((xs, ys), 4, device="cuda:0")
    with pytest.raises(ValueError, match="not a floating dtype"):
        ddp.partition_dataset((xs, ys), 4, dtype="int32")
    with pytest.raises(ValueError, match="not a floating dtype"):
        ddp.partition_dataset((xs, ys), 4, dtype=torch.int32)
    with pytest.raises(ValueError, match="global batch size"):
        ddp.partition_dataset((xs, ys), 0)
    # a distnn dataset (load_dataset's splits): stored uint8 scaled per batch, as distnn does
    images = np.random.default_rng(1).integers(0, 256, (10, 1, 2, 2), dtype=np.uint8)
    ds = ArrayDataset(images, np.arange(10) % 3, 3)
    loader, _ = ddp.partition_dataset(ds, 5, device=device, dtype=torch.float64)
    for xb, yb in loader:
        assert xb.dtype == torch.float64 and yb.dtype == torch.int64
        for x1, y1 in zip(xb, yb):
            i = int(np.flatnonzero((images == np.rint(x1.numpy() * 255)).all(axis=(1, 2, 3)))[0])
            assert int(y1) == i % 3 and float(x1.max()) <= 1.0
    opt_ = ddp.DistributedOptimizer(torch.optim.SGD(_net().parameters(), lr=0.1))
    opt_.reset_grad()
    assert all(float(p.grad.abs().sum()) == 0 for g in opt_.param_groups for p in g["params"])
