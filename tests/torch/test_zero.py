"""distnn.torch.ZeroRedundancyOptimizer against PyTorch's own on gloo: the same training
(progs/zero_prog.py: seeds, data, float64) under ``mpiexec -n 2`` and ``-n 3`` and in a
group of gloo processes on 127.0.0.1 gives the same parameters, the same partition, the
same consolidated state dict and the same state bytes per rank (1/N of the unsharded
optimizer's); the consolidated state reloads and steps on exactly. Refusals and the
one-rank case run here, in this process."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import distnn.torch as hvd
from distnn.distributed import LocalComm

from helpers import child_env
from torchjobs import MPIEXEC, PROGS, needs_mpi

PROG = PROGS / "zero_prog.py"


@pytest.fixture(scope="module", params=[2, 3], ids=lambda n: f"np{n}")
def job(request, tmp_path_factory):
    n = request.param
    out = tmp_path_factory.mktemp(f"zero{n}")
    # both groups at once: they share no port, no file and no process
    ours = subprocess.Popen([MPIEXEC, "-n", str(n), sys.executable, str(PROG), "distnn",
                             str(out)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=child_env())
    theirs = subprocess.run([sys.executable, str(PROG), "torch", str(n), str(out)],
                            capture_output=True, text=True, env=child_env(), timeout=300)
    text = ours.communicate(timeout=300)[0]
    assert ours.returncode == 0, text[-3000:]
    assert theirs.returncode == 0, (theirs.stdout + theirs.stderr)[-3000:]
    load = lambda side, r: torch.load(out / f"{side}.rank{r}.pt", weights_only=False)  # noqa: E731
    return n, [load("distnn", r) for r in range(n)], [load("torch", r) for r in range(n)]


def close(a, b):
    # 3 ranks: MPI and gloo may add the three gradients in another order (a few ulps)
    torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.slow
@needs_mpi
@pytest.mark.parametrize("case", ["sgd", "adam"])
def test_the_same_parameters_as_pytorchs_zero_on_gloo(job, case):
    n, ours, theirs = job
    for r in range(n):
        for a, b in zip(ours[r][case]["params"], theirs[r][case]["params"]):
            close(a, b)
        for a, b in zip(ours[r][case]["params"], ours[0][case]["params"]):
            assert torch.equal(a, b)  # every replica the same, bit for bit


@pytest.mark.slow
@needs_mpi
@pytest.mark.parametrize("case", ["sgd", "adam", "memory"])
def test_the_partition_is_pytorchs(job, case):
    n, ours, theirs = job
    owned = [ours[r][case]["owned"] for r in range(n)]
    assert owned == [theirs[r][case]["owned"] for r in range(n)]
    count = {"sgd": 6, "adam": 6, "memory": 12}[case]  # the programme's models
    assert sorted(i for o in owned for i in o) == list(range(count))  # each once


@pytest.mark.slow
@needs_mpi
@pytest.mark.parametrize("case", ["sgd", "adam"])
def test_the_consolidated_state_dict_is_pytorchs(job, case):
    n, ours, theirs = job
    mine, torchs = ours[n - 1][case]["state"], theirs[n - 1][case]["state"]  # to=n-1
    assert mine["param_groups"] == torchs["param_groups"]
    assert sorted(mine["state"]) == sorted(torchs["state"]) == list(range(6))
    for i, st in torchs["state"].items():
        assert sorted(mine["state"][i]) == sorted(st)
        for k, v in st.items():
            close(mine["state"][i][k], v)


@pytest.mark.slow
@needs_mpi
def test_the_consolidated_state_reloads_and_steps_as_the_original(job):
    n, ours, _ = job
    for r in range(n):
        adam = ours[r]["adam"]
        assert adam["resumed"] == [True] * 6  # 3 more steps, bit for bit
        assert adam["broadcast_lrs"] == [0.5, 0.5]  # built 0.5 + rank: rank 0's, everywhere
        assert adam["lrs"] == [0.01, 0.003]  # then the state's


@pytest.mark.slow
@needs_mpi
def test_state_bytes_per_rank_are_one_nth_of_the_unsharded_optimizers(job):
    n, ours, theirs = job
    mem = [ours[r]["memory"] for r in range(n)]
    full = mem[0]["unsharded"]
    assert full > 0 and sum(m["mine"] for m in mem) == full
    for r, m in enumerate(mem):
        assert m["unsharded"] == full
        assert abs(m["mine"] - full / n) <= 0.05 * full / n, (r, m, full)
        assert m["mine"] == theirs[r]["memory"]["mine"]


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(),
                               torch.nn.Linear(7, 3)).double()


@pytest.mark.parametrize("bucket", [False, True])
def test_one_rank_steps_as_the_plain_optimizer_and_round_trips(bucket):
    a, b = _model(), _model()
    zero = hvd.ZeroRedundancyOptimizer(a.parameters(), torch.optim.Adam, lr=0.01,
                                       parameters_as_bucket_view=bucket, comm=LocalComm())
    plain = torch.optim.Adam(b.parameters(), lr=0.01)
    x = torch.randn(4, 5, dtype=torch.float64)
    for _ in range(3):
        for m, o in ((a, zero), (b, plain)):
            o.zero_grad()
            m(x).pow(2).sum().backward()
            o.step()
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    with pytest.raises(RuntimeError, match=r"consolidate_state_dict\(to=0\)"):
        zero.state_dict()
    zero.consolidate_state_dict()
    sd, ref = zero.state_dict(), plain.state_dict()
    assert sd["param_groups"] == ref["param_groups"]
    assert all(torch.equal(sd["state"][i][k], ref["state"][i][k])
               for i in ref["state"] for k in ref["state"][i])
    again = hvd.ZeroRedundancyOptimizer(b.parameters(), torch.optim.Adam, lr=1.0,
                                        comm=LocalComm())
    again.load_state_dict(ref)  # an unsharded optimizer's state loads too
    assert again.param_groups[0]["lr"] == 0.01
    assert torch.equal(again.optim.state[next(b.parameters())]["exp_avg"],
                       plain.state[next(b.parameters())]["exp_avg"])


@pytest.mark.parametrize("kwargs, match", [
    ({"overlap_with_ddp": True}, "overlap_with_ddp=True"),
    ({"process_group": object()}, "process_group="),
])
def test_what_needs_torch_distributed_is_refused_by_name(kwargs, match):
    with pytest.raises(ValueError, match=match):
        hvd.ZeroRedundancyOptimizer(_model().parameters(), torch.optim.SGD, lr=0.1,
                                    comm=LocalComm(), **kwargs)


def test_mixed_dtypes_an_empty_list_and_a_non_class_are_refused():
    m = _model()
    m[2].float()
    with pytest.raises(ValueError, match="one dense dtype"):
        hvd.ZeroRedundancyOptimizer(m.parameters(), torch.optim.SGD, lr=0.1, comm=LocalComm())
    with pytest.raises(ValueError, match="empty parameter list"):
        hvd.ZeroRedundancyOptimizer([], torch.optim.SGD, lr=0.1, comm=LocalComm())
    with pytest.raises(TypeError, match="optimizer_class"):
        hvd.ZeroRedundancyOptimizer(_model().parameters(), torch.optim.SGD(
            _model().parameters(), lr=0.1), comm=LocalComm())
