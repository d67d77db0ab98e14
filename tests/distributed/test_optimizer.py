"""DistributedOptimizer: N ranks make the update of 1 process on the global batch."""
import functools

import numpy as np
import pytest

import common
from mpijobs import mpirun
from helpers import needs_mpi
from distnn.distributed import DistributedOptimizer, LocalComm, make_buckets
from distnn.optim import SGD

NAMES = sorted(common.scenarios(2))
TOL = {np.float64: 1e-10, np.float32: 1e-5}


@functools.lru_cache(maxsize=None)
def reference(size: int, name: str) -> dict:
    """The same run in this process, on the whole global batches."""
    cfg = dict(common.scenarios(size)[name])
    cfg.pop("compression", None)
    return common.run_training(LocalComm(), **cfg)


@pytest.mark.parametrize("name", NAMES)
def test_ranks_match_one_process(main_results, name):
    n, results = main_results
    if name not in results[0]:
        pytest.skip(f"{name} needs layers not available yet")
    cfg = common.scenarios(n)[name]
    ref = reference(n, name)["weights"]
    for r, res in enumerate(results):
        w = res[name]["weights"]
        assert np.array_equal(w, results[0][name]["weights"]), f"rank {r} differs from rank 0"
        err = np.max(np.abs(w - ref)) / np.max(np.abs(ref))
        tol = 1e-3 if cfg.get("compression") else TOL[cfg["dtype"]]
        assert err < tol, (name, r, err)


def test_buckets_follow_layers_in_backward_order(main_results):
    n, results = main_results
    res = results[0]
    layers = res["sgd_sum_f64"]["layers"]
    one = res["sgd_sum_f64"]["buckets"]
    assert len(one) == 1 and one[0][2] == layers[::-1]  # 4 MB: one bucket, last layer first
    tiny = res["sgd_sum_f64_tiny"]["buckets"]
    assert [names for _, _, names in tiny] == [[name] for name in layers[::-1]]
    assert all(tiny[i][0] == tiny[i + 1][1] for i in range(len(tiny) - 1))
    assert tiny[0][1] == one[0][1] and tiny[-1][0] == 0


def test_one_iallreduce_per_bucket_started_during_backward(main_results):
    n, results = main_results
    for res in results:
        for name in ("sgd_sum_f64", "sgd_sum_f64_tiny", "adam_avg_f32"):
            run = res[name]
            nb = len(run["buckets"])
            assert run["steps"] == 5 and run["calls"] == 5 * nb
            # every bucket was in flight before step() on every rank that ran backward
            assert run["started"] and all(s == nb for s in run["started"])
        # one bucket per layer: bucket k is on the wire once the k-th layer from the end
        # has its gradients, while backward goes on through the earlier layers
        tiny = res["sgd_sum_f64_tiny"]
        assert tiny["trace"] == [1, 2, 3] * len(tiny["started"])
        blocking = res["sgd_sum_f64_blocking"]
        assert blocking["calls"] == 5 and all(s == 0 for s in blocking["started"])
    if n == 3:  # the last batch of 2 leaves rank 2 empty: it steps without backward
        assert len(results[2]["sgd_sum_f64"]["started"]) == 4


def test_blocking_and_bucketing_give_identical_results(main_results):
    _, results = main_results
    w = results[0]["sgd_sum_f64"]["weights"]
    assert np.array_equal(w, results[0]["sgd_sum_f64_blocking"]["weights"])
    assert np.array_equal(w, results[0]["sgd_sum_f64_tiny"]["weights"])


def test_fp16_compression_transports_half_the_bytes(main_results):
    _, results = main_results
    for res in results:
        assert res["sgd_sum_f32_fp16"]["bytes"] * 2 == res["sgd_sum_f32"]["bytes"]
        assert res["sgd_sum_f32_fp16"]["calls"] == res["sgd_sum_f32"]["calls"]


class _Layer:
    def __init__(self, name):
        self.name = name


def test_make_buckets():
    sizes = [10, 1000, 20, 30, 5]
    starts = np.concatenate([[0], np.cumsum(sizes)])
    ranges = [(_Layer(f"l{i}"), int(starts[i]), int(starts[i + 1])) for i in range(5)]
    mb = 1 / (1 << 20)
    # 60 bytes per bucket at 1 byte per element
    got = make_buckets(ranges, 1, 60 * mb)
    assert [b[2] for b in got] == [["l4", "l3", "l2"], ["l1"], ["l0"]]
    assert [(b[0], b[1]) for b in got] == [(1010, 1065), (10, 1010), (0, 10)]
    assert [b[2] for b in make_buckets(ranges, 1, 0)] == [["l4"], ["l3"], ["l2"], ["l1"], ["l0"]]
    assert [b[2] for b in make_buckets(ranges, 1, 1.0)] == [["l4", "l3", "l2", "l1", "l0"]]
    with pytest.raises(ValueError, match="bucket_size_mb"):
        make_buckets(ranges, 1, -1)


def test_options_are_checked_and_size_1_passes_through():
    model = common.build_model("mlp", np.float64, seed=0)
    base = SGD(model, lr=0.1)
    with pytest.raises(ValueError, match="op must be"):
        DistributedOptimizer(base, model, comm=LocalComm(), op="mean")
    with pytest.raises(ValueError, match="compression"):
        DistributedOptimizer(base, model, comm=LocalComm(), compression="int8")
    opt = DistributedOptimizer(base, model, comm=LocalComm())
    assert model.grad_hooks == []
    model.gradients_flat()[:] = 1.0
    w = model.parameters_flat().copy()
    opt.lr = 0.5
    opt.step()
    assert base.lr == 0.5 and opt.iterations == 1 == base.iterations
    assert np.allclose(model.parameters_flat(), w - 0.5)
    assert opt.state_dict()["iterations"] == 1


@needs_mpi
@pytest.mark.parametrize("n", [2, 3])
def test_different_models_raise_instead_of_hanging(n):
    proc = mpirun(n, "fail_prog.py", "mismatch", timeout=30)
    assert proc.returncode != 0
    assert "the model differs across ranks" in proc.stderr
    assert "ranks [1]" in proc.stderr, proc.stderr


@needs_mpi
@pytest.mark.parametrize("n", [2, 3])
def test_different_step_counts_raise_instead_of_hanging(n):
    proc = mpirun(n, "fail_prog.py", "steps", timeout=30)
    assert proc.returncode != 0
    assert "ranks disagree on the training plan" in proc.stderr, proc.stderr
    assert "rank 1:" in proc.stderr
