"""distnn.torch's Horovod API on real MPI jobs: N ranks make exactly the updates of one
process on the same global batches (2 and 3 ranks, uneven and empty shards, SGD with
momentum and Adam, float64), and broadcast_optimizer_state never steps."""
from __future__ import annotations


import numpy as np
import pytest
import torch

import distnn.torch as hvd
from distnn.distributed import LocalComm

from torchjobs import needs_mpi, prog_ranks


@pytest.fixture(scope="module", params=[2, 3], ids=lambda n: f"np{n}")
def parity(request, tmp_path_factory):
    n = request.param
    out = tmp_path_factory.mktemp(f"parity{n}")
    return n, prog_ranks("parity_prog.py", n, out)


@needs_mpi
@pytest.mark.parametrize("kind", ["sgd", "adam"])
@pytest.mark.parametrize("mode", ["sum", "average", "syncbn"])
def test_n_ranks_equal_one_process_for_5_steps(parity, kind, mode):
    n, results = parity
    for rank, res in enumerate(results):
        diffs = res[(kind, mode)]["diffs"]
        assert len(diffs) == 5
        assert max(d for _, _, d in diffs) < 1e-10, (rank, kind, mode, diffs)
        assert res[(kind, mode)]["calls"] == 5 * res[(kind, mode)]["buckets"] > 5
    # every rank holds the same weights
    flats = [res[(kind, mode)]["flat"] for res in results]
    assert all(np.array_equal(flats[0], f) for f in flats[1:])
    if mode != "average":
        # the last global batch (2 samples) is uneven; on 3 ranks one share is empty
        last = [res[(kind, mode)]["diffs"][-1] for res in results]
        assert [s for s, _, _ in last] == ([1, 1] if n == 2 else [1, 1, 0])


@needs_mpi
def test_broadcast_optimizer_state_copies_roots_state_without_stepping(parity):
    n, results = parity
    for res in results:
        assert res["resume"]["state_steps"] == [2.0] * 6  # root's count, not 3
        assert len(res["resume"]["diffs"]) == 3
        assert max(d for _, _, d in res["resume"]["diffs"]) < 1e-10


@needs_mpi
def test_collectives_on_tensors(parity):
    n, results = parity
    expected_gather = [[float(r)] * 2 for r in range(n) for _ in range(r + 1)]
    for rank, res in enumerate(results):
        c = res["collectives"]
        assert c["average"] == [sum(range(1, n + 1)) / n, 2.0]
        assert c["sum"] == [sum(range(1, n + 1))]
        assert c["max"] == [n - 1.0]
        assert c["allgather"] == expected_gather
        assert c["broadcast"] == [n - 1.0, 7.0]
        # a non-contiguous view is reduced through a copy and written back in place
        assert c["inplace"] == [sum(range(n)), 1.0 + rank, 2.0 * n + sum(range(n)), 3.0 + rank]
        assert c["metric"] == pytest.approx((n - 1) / 2)


def test_fresh_optimizer_broadcast_sends_only_hyper_parameters():
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    before = [p.detach().clone() for p in model.parameters()]
    hvd.broadcast_optimizer_state(opt, comm=LocalComm())
    assert opt.state_dict()["state"] == {}
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_distributed_optimizer_keeps_torch_optimizer_behaviour():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    twin = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    twin.load_state_dict(model.state_dict())
    base = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    opt = hvd.DistributedOptimizer(base, model.named_parameters(), comm=LocalComm())
    assert isinstance(opt, torch.optim.SGD)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    ref = torch.optim.SGD(twin.parameters(), lr=0.1, momentum=0.9)
    ref_sched = torch.optim.lr_scheduler.StepLR(ref, step_size=1, gamma=0.5)
    x, y = torch.randn(16, 4), torch.randint(0, 2, (16,))
    for _ in range(3):
        for m, o, s in ((model, opt, sched), (twin, ref, ref_sched)):
            o.zero_grad()
            torch.nn.functional.cross_entropy(m(x), y).backward()
            o.step()
            s.step()
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), twin.parameters()))
    # gradients live in one flat buffer
    flat = opt.gradients_flat()
    assert model[0].weight.grad.data_ptr() == flat.ctypes.data
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1 * 0.5 ** 3)


def test_distributed_optimizer_rejects_a_distnn_optimizer():
    from distnn.models import get_model
    from distnn.optim import SGD
    model = get_model("simplemlp")
    with pytest.raises(TypeError, match="torch.optim.Optimizer"):
        hvd.DistributedOptimizer(SGD(model, lr=0.1))


def test_partition_dataset_matches_distnn_sharding():
    from distnn.data import ArrayDataset
    x = np.arange(23, dtype=np.float32).reshape(23, 1)
    y = np.arange(23) % 3
    for size in (2, 3):
        for rank in range(size):
            ours = [s.indices for s in hvd.partition_dataset(
                (torch.from_numpy(x), torch.from_numpy(y)), 7, shuffle=False,
                comm=_FakeRank(rank, size))]
            theirs = [b.indices for b in ArrayDataset(x, y, 3).batches(
                7, shuffle=False, rank=rank, size=size)]
            assert [list(a) for a in ours] == [list(b) for b in theirs]
    sampler = hvd.DistributedSampler(23, 7, rank=2, size=3, drop_last=False)
    assert sampler.global_sizes == [7, 7, 7, 2] and list(sampler)[-1] == []


class _FakeRank(LocalComm):
    """Rank r of size s for the pure sharding arithmetic (no collective is called)."""

    def __init__(self, rank, size):
        self.rank, self.size = rank, size


def test_the_numpy_distributed_optimizer_points_torch_users_to_distnn_torch():
    from distnn.distributed import DistributedOptimizer as NumpyDistributedOptimizer
    module = torch.nn.Linear(3, 2)
    with pytest.raises(TypeError, match="distnn.torch.DistributedOptimizer"):
        NumpyDistributedOptimizer(torch.optim.SGD(module.parameters(), lr=0.1), module,
                                  comm=LocalComm())
