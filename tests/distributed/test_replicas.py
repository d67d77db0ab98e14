"""Replica consistency: initial weights, SyncBatchNorm, metrics, LR scaling."""
import numpy as np
import pytest

import common
from distnn.distributed import LocalComm, scale_lr, sync_batchnorm
from test_optimizer import reference


def test_different_initial_weights_become_rank_0s(main_results):
    n, results = main_results
    want = common.build_model("mlp", np.float64, seed=0).parameters_flat()
    for res in results:
        assert res["collectives"]["weights_differed"]
        after = res["collectives"]["weights_after_bcast"]
        assert after.shape[0] == n and all(np.array_equal(w, want) for w in after)


@pytest.mark.parametrize("name", ["bn_sgd_sum_f64", "bn_adam_avg_f32"])
def test_sync_batchnorm_running_stats_match_one_process(main_results, name):
    if not common.have_batchnorm():
        pytest.skip("needs distnn.nn.normalization and conv")
    n, results = main_results
    ref = reference(n, name)["buffers"]
    assert ref, "the BN model has no running statistics"
    tol = 1e-10 if "f64" in name else 1e-5
    for res in results:
        bufs = res[name]["buffers"]
        assert set(bufs) == set(ref)
        for key, value in bufs.items():
            assert np.array_equal(value, results[0][name]["buffers"][key]), key
            assert np.max(np.abs(value - ref[key])) <= tol * max(1, np.max(np.abs(ref[key])))


def test_sync_batchnorm_is_a_no_op_for_one_process():
    model = common.build_model("mlp", np.float64, seed=0)
    assert sync_batchnorm(model, LocalComm()) is model


def test_scale_lr():
    assert scale_lr(0.1, 4) == pytest.approx(0.4)
    assert scale_lr(0.1, 4, "sqrt") == pytest.approx(0.2)
    assert scale_lr(0.1, 4, "none") == 0.1
    with pytest.raises(ValueError, match="rule"):
        scale_lr(0.1, 4, "cubic")
