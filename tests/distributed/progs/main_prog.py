"""MPI test program: collective checks, then every training scenario of common.py.

Usage: mpiexec -n N python main_prog.py OUT_DIR   (writes OUT_DIR/rank<R>.pkl)
"""
import pickle
import sys
from pathlib import Path

import numpy as np

from distnn import distributed as dist
from distnn.optim import Adam

import common


def check_collectives(comm) -> dict:
    r, n = comm.rank, comm.size
    a = np.full(4, r + 1.0)
    assert np.all(comm.allreduce_(a.copy(), "sum") == n * (n + 1) / 2)
    assert np.all(comm.allreduce_(a.copy(), "mean") == (n + 1) / 2)
    assert np.all(comm.allreduce_(a.copy(), "max") == n)
    assert np.all(comm.allreduce_(a.copy(), "min") == 1)
    assert np.all(comm.allreduce_(np.full(3, r, np.int64), "sum") == n * (n - 1) // 2)
    h = comm.iallreduce_(a, "mean")
    assert h.wait() is a and np.all(a == (n + 1) / 2)
    b = np.arange(5.0) * r
    comm.bcast_(b, root=n - 1)
    assert np.all(b == np.arange(5.0) * (n - 1))
    g = comm.allgather(np.array([r, 2 * r], np.float32))
    assert g.shape == (n, 2) and np.all(g[:, 1] == 2 * np.arange(n))
    assert comm.bcast_obj({"r": r}, root=n - 1) == {"r": n - 1}
    assert comm.allgather_obj(r) == list(range(n))
    assert comm.allreduce_obj(r, "sum") == n * (n - 1) // 2
    assert comm.allreduce_obj(r, "max") == n - 1
    assert (comm.local_rank, comm.local_size) == (r, n)  # one host
    sub = comm.split(color=r % 2, key=r)
    members = [q for q in range(n) if q % 2 == r % 2]
    assert sub.size == len(members) and sub.rank == members.index(r)
    assert sub.allreduce_obj(r, "sum") == sum(members)
    comm.barrier()

    # float16 travels as 2-byte elements, summed natively or by the float32-accumulating op
    rng = np.random.default_rng(r)
    x16 = rng.uniform(0.5, 1.0, 1000).astype(np.float16)
    exact = comm.allgather(x16).astype(np.float64).sum(axis=0)
    fp16 = {}
    for mode in ("native", "op"):
        c = dist.MPIComm(comm.comm, fp16=mode)
        y = c.allreduce_(x16.copy(), "sum")
        z = c.iallreduce_(x16.copy(), "sum").wait()
        assert y.dtype == np.float16 and np.array_equal(y, z)
        fp16[mode] = float(np.max(np.abs(y - exact) / exact))
        assert fp16[mode] < 2e-3, fp16

    # the module-level API on the default communicator
    dist.init(comm)
    assert dist.rank() == r and dist.size() == n
    assert dist.allreduce(float(r)) == (n - 1) / 2
    assert dist.allreduce(r, op="sum") == n * (n - 1) // 2
    assert np.all(dist.allreduce_async(np.ones(3), "sum").wait() == n)
    assert np.all(dist.broadcast(np.full(2, r)) == 0)
    assert dist.allgather(np.array([r])).ravel().tolist() == list(range(n))
    m = dist.metrics_allreduce({"loss_sum": 2.0 * r, "n": 1})
    assert m == {"loss_sum": float(n * (n - 1)), "n": float(n)}
    assert f"ranks: {n}" in dist.describe()

    # optimizer state: rank-dependent after a step, equal to root's after the broadcast
    model = common.build_model("mlp", np.float64, seed=r)
    opt = Adam(model, lr=0.01 * (r + 1))
    model.gradients_flat()[:] = r + 1.0
    opt.step()
    opt.iterations += r
    dist.broadcast_optimizer_state(opt, root=0)
    st = np.concatenate([s.ravel() for s in opt.state_arrays()])
    everyone = comm.allgather(st)
    assert np.all(everyone == everyone[0]) and opt.lr == 0.01 and opt.iterations == 1
    # initial weights: built from different seeds, equal to rank 0's after the broadcast
    model = common.build_model("mlp", np.float64, seed=r)
    before = comm.allgather(model.parameters_flat())
    dist.broadcast_parameters(model)
    after = comm.allgather(model.parameters_flat())
    return {"fp16_rel_err": fp16, "weights_differed": bool(np.any(before[0] != before[-1])),
            "weights_after_bcast": after}


def main(out: Path) -> None:
    comm = dist.init()
    res = {"collectives": check_collectives(comm), "size": comm.size}
    for name, cfg in common.scenarios(comm.size).items():
        res[name] = common.run_training(comm, **cfg)
    with open(out / f"rank{comm.rank}.pkl", "wb") as f:
        pickle.dump(res, f)


if __name__ == "__main__":
    with dist.abort_on_error():
        main(Path(sys.argv[1]))
