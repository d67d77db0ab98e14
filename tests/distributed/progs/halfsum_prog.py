"""The Reducer's float16 exchange (halfsum.py) against NumPy, on every rank: each rank
draws its data from a generator seeded by its rank, so every rank can rebuild every
other rank's data and compute the expected result itself. Rank 0 pickles the checks.
Usage: halfsum_prog.py OUT_DIR"""
from __future__ import annotations

import pickle
import sys

import numpy as np

from distnn import distributed as dist
from distnn import kernels
from distnn.distributed.halfsum import HalfSumExchange
from distnn.distributed.join import JoinableComm

SIZES = [1, 2, 5, 7, 1000, 1001, 30011, 100003]


def data(rank: int, n: int, dtype=np.float32, scale: float = 1.0) -> np.ndarray:
    rng = np.random.default_rng([rank, n])
    return (rng.standard_normal(n) * scale).astype(dtype)


def expected_sum(values) -> np.ndarray:
    """float16 of the rank-ordered float32 sum of the ranks' float16 values."""
    halves = [np.asarray(v).astype(np.float16) for v in values]
    acc = halves[0].astype(np.float32)
    for h in halves[1:]:
        acc = (acc + h.astype(np.float32)).astype(np.float32)
    return acc.astype(np.float16)


def exchange_checks(comm, n_ranks):
    """The exchange alone: sizes not divisible by the ranks, blocking and started
    together (waited in reverse order), twice on the same buffers."""
    out = {}
    ex = HalfSumExchange(comm, SIZES)
    for rep in range(2):
        for b, n in enumerate(SIZES):
            ex.wire(b)[...] = data(comm.rank + rep, n)
        handles = [ex.start(b) for b in range(len(SIZES))]
        for h in reversed(handles):
            h.wait()
        for b, n in enumerate(SIZES):
            want = expected_sum([data(r + rep, n) for r in range(n_ranks)])
            out[f"together_{rep}_{n}"] = np.array_equal(ex.wire(b), want)
    for b, n in enumerate(SIZES):
        ex.wire(b)[...] = data(comm.rank, n, scale=1e3)
        ex.start(b).wait()
        want = expected_sum([data(r, n, scale=1e3) for r in range(n_ranks)])
        out[f"blocking_{n}"] = np.array_equal(ex.wire(b), want)
    out["modes"] = sorted({bk.whole for bk in ex.buckets})
    ex.free()
    return out


def segments_of(n_params: int):
    bounds = [0, 3, 700, 701, 5000, 5003, n_params]
    return [(f"s{i}", lo, hi) for i, (lo, hi) in enumerate(zip(bounds, bounds[1:]))]


def reducer_run(comm, n_ranks, dtype, op, **kwargs):
    """A Reducer with compression fp16 after a simulated backward; returns (result,
    expected, reducer)."""
    n = 40009
    segs = segments_of(n)
    flat = data(comm.rank, n, dtype)
    red = dist.Reducer(flat, segs, comm, op=op, compression="fp16", **kwargs)
    for i in reversed(range(len(segs))):
        red.ready(i)
    assert red.synchronize()
    want = expected_sum([data(r, n, dtype) for r in range(n_ranks)]).astype(dtype)
    if op == "average":
        want /= dtype(n_ranks)
    return flat, want, red


def reducer_checks(comm, n_ranks):
    out = {}
    cases = {"nonblocking": dict(bucket_size_mb=0.01),
             "one_bucket": dict(bucket_size_mb=4.0),
             "per_segment": dict(bucket_size_mb=0),
             "blocking": dict(bucket_size_mb=0.01, non_blocking=False),
             "blocking_last": dict(bucket_size_mb=0.01, blocking_last=True)}
    for dtype in (np.float32, np.float64):
        for op in ("average", "sum"):
            for name, kwargs in cases.items():
                got, want, red = reducer_run(comm, n_ranks, dtype, op, **kwargs)
                key = f"{name}_{op}_{np.dtype(dtype).name}"
                out[key] = (red.half is not None and any(not bk.whole for bk in
                                                         red.half.buckets),
                            np.array_equal(got, want),
                            red.bytes_reduced * np.dtype(dtype).itemsize == 2 * red.bytes_dense,
                            red.allreduce_calls == len(red.buckets))
    # reduce_ of another buffer (parameter deltas) through the same exchange
    got, _, red = reducer_run(comm, n_ranks, np.float32, "average", bucket_size_mb=0.01)
    other = data(comm.rank + 7, got.size)
    red.reduce_(other)
    want = expected_sum([data(r + 7, got.size) for r in range(n_ranks)]).astype(np.float32)
    out["reduce_"] = np.array_equal(other, want / np.float32(n_ranks))
    return out


def old_path_checks(comm, n_ranks):
    """The user-op all-reduce (the old path, kept for single float16 tensors) against the
    exchange: how many elements differ."""
    n = 30011
    op_comm = dist.MPIComm(comm.comm, fp16="op")
    old = data(comm.rank, n).astype(np.float16)
    op_comm.allreduce_(old, "sum")
    new = expected_sum([data(r, n) for r in range(n_ranks)])
    return {"old_vs_new_differ": int(np.sum(old != new))}


def join_checks(comm, n_ranks):
    """Rank r trains r + 1 steps with a Reducer over a JoinableComm, then joins: at step s
    the ranks below s send zeros (served by join()); the average divides by all ranks."""
    n = 40009
    segs = segments_of(n)
    jc = JoinableComm(comm)
    flat = np.zeros(n, np.float32)
    red = dist.Reducer(flat, segs, jc, op="average", compression="fp16",
                       bucket_size_mb=0.1)
    equal = []
    for step in range(comm.rank + 1):
        flat[...] = data(comm.rank + 10 * step, n)
        for i in reversed(range(len(segs))):
            red.ready(i)
        red.synchronize()
        red.reset()  # what the optimizer's step does
        values = [data(r + 10 * step, n) if r >= step else np.zeros(n, np.float32)
                  for r in range(n_ranks)]
        want = expected_sum(values).astype(np.float32) / np.float32(n_ranks)
        equal.append(bool(np.array_equal(flat, want)))
    last = jc.join()
    modes = sorted({bk.whole for bk in red.half._exchange.buckets})
    return {"join": (red.half is not None, equal, last, modes)}


def main() -> None:
    comm = dist.init()
    with dist.abort_on_error(comm):
        n_ranks = comm.size
        out = {"size": n_ranks, "backend": kernels.backend()}
        out.update(exchange_checks(comm, n_ranks))
        out.update(reducer_checks(comm, n_ranks))
        out.update(old_path_checks(comm, n_ranks))
        out.update(join_checks(comm, n_ranks))
        everyone = comm.allgather_obj(out)
        if comm.rank == 0:
            with open(f"{sys.argv[1]}/results.pkl", "wb") as f:
                pickle.dump(everyone, f)


if __name__ == "__main__":
    main()
