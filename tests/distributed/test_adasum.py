"""Adasum on 2, 3 and 4 real MPI ranks against the NumPy reference of the algorithm
(float64 to 1e-10), through adasum_ and through the NumPy DistributedOptimizer
(op="adasum": deltas combined layer by layer), and the Reducer's Horovod knobs
(gradient_predivide_factor, Compression objects) against op="average", and join() over a
JoinableComm with ranks given 2, 3, (4, 5) batches."""
import pickle

import numpy as np
import pytest

from mpijobs import Program
from helpers import needs_mpi
from distnn.distributed import Compression, DistributedOptimizer, LocalComm
from distnn.distributed.adasum import combine, reference


PROGRAMS = {n: Program(n, "adasum_prog.py", owner=f"test_adasum.np{n}") for n in (2, 3, 4)}


@needs_mpi
@pytest.mark.parametrize("n", [2, 3, 4])
def test_adasum_matches_the_reference(prog_batch, n):
    tmp_path, _ = PROGRAMS[n].run(prog_batch)  # in the folder's launch on n ranks
    results = [pickle.load(open(tmp_path / f"rank{r}.pkl", "rb")) for r in range(n)]
    for res in results:
        v = res["vectors"]
        assert v["f64"] < 1e-10 * v["scale"], v
        assert v["f32"] < 1e-5 * v["scale"], v
        assert v["sum"] > 0.1  # it is not a plain sum
        opt = res["optimizer"]
        assert opt["diff"] < 1e-10 and opt["moved"] > 1e-3, opt
        assert opt["calls"] == 3 and opt["hooks"] == 0  # one delta reduction per step
        assert res["predivide"] < 1e-10 and res["compression"] == 0.0
        diff, nbytes = res["fp16"]
        assert 0 < diff < 1e-3 and nbytes == 3 * 573 * 2  # float16 on the wire
    for rank, res in enumerate(results):  # join: rank r had 2 + r batches
        last, diff, calls, buckets = res["join"]
        assert last == n - 1 and diff < 1e-10 and calls == (2 + rank) * buckets


def test_pairwise_combination():
    a, b = np.array([1.0, 0.0]), np.array([0.0, 2.0])
    out = a.copy()
    combine(out, b, 0.0, 1.0, 4.0)  # orthogonal: a + b
    assert out.tolist() == [1.0, 2.0]
    out = a.copy()
    combine(out, a, 1.0, 1.0, 1.0)  # equal: the average
    assert out.tolist() == [1.0, 0.0]
    # three vectors: adasum(adasum(v0, v2), v1), segment by segment
    vs = [np.array([1.0, 0.0, 3.0]), np.array([0.0, 1.0, 3.0]), np.array([1.0, 0.0, 3.0])]
    assert reference(vs, [2, 1]).tolist() == [1.0, 1.0, 3.0]


def test_numpy_optimizer_knobs_are_checked():
    import common
    from distnn.optim import SGD
    model = common.build_model("mlp", np.float64, seed=0)
    base = SGD(model, lr=0.1)
    with pytest.raises(ValueError, match="gradient_predivide_factor=2.0 needs op='average'"):
        DistributedOptimizer(base, model, comm=LocalComm(), op="sum",
                             gradient_predivide_factor=2.0)
    with pytest.raises(ValueError, match="backward_passes_per_step=2"):
        DistributedOptimizer(base, model, comm=LocalComm(), backward_passes_per_step=2)
    x = np.arange(3.0)
    sent, ctx = Compression.fp16.compress(x)
    assert sent.dtype == np.float16 and Compression.fp16.decompress(sent, ctx).dtype == x.dtype
    assert Compression.none.compress(x)[0] is x
