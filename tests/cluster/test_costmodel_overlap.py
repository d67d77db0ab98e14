"""The cost model's compressed exchanges bucket by bucket (distributed/compressed_buckets.py):
top-k's dense tensors and pairs and PowerSGD's P start when their bucket's gradients are
ready, PowerSGD's Q after backward; a model of one bucket is predicted as before."""
from __future__ import annotations

import pytest

from distnn.costmodel.predict import Config, Link, ModelCost, bucket_ranges, predict
from distnn.distributed.sparse import payload_bytes

LINK = Link(gbits=1, latency_s=100e-6)
M = 1_000_000  # a (1000, 1000) matrix: 4 MB of float32, a bucket of its own
LAYERS = 3
TENSORS = [t for i in range(LAYERS) for t in (
    (f"fc{i}/w", i * (M + 1000), i * (M + 1000) + M, (1000, 1000)),
    (f"fc{i}/b", i * (M + 1000) + M, (i + 1) * (M + 1000), (1000,)))]
SEGMENTS = [(f"fc{i}", i * (M + 1000), (i + 1) * (M + 1000)) for i in range(LAYERS)]
DEEP = ModelCost(compute_s=0.2, tensors=TENSORS, segments=SEGMENTS)


def test_topk_goes_bucket_by_bucket_as_backward_produces_them():
    assert len(bucket_ranges(Config("data"), DEEP)) == LAYERS
    p = predict(Config("data", "topk:0.01"), DEEP, 2, LINK)
    assert [m[0] for m in p.messages] == ["dense tensors", "sparse pairs"] * LAYERS
    assert [m[1] for m in p.messages] == [1000 * 4, payload_bytes(10_000, M + 1000, 4)] \
        * LAYERS
    ready = [m[4] for m in p.messages]
    assert ready == sorted(ready) and ready[0] == pytest.approx(1 / LAYERS)
    assert ready[-1] == pytest.approx(1.0)
    # the first buckets' exchanges hide behind backward: less than compute + all of them
    assert DEEP.compute_s < p.step_s < DEEP.compute_s + sum(m[2] for m in p.messages)


def test_powersgd_p_during_backward_q_after_it():
    p = predict(Config("data", "powersgd:2"), DEEP, 2, LINK)
    names = [m[0] for m in p.messages]
    assert names == ["P + dense"] * LAYERS + ["Q"] * LAYERS
    assert all(m[4] is not None for m in p.messages[:LAYERS])
    assert all(m[4] is None for m in p.messages[LAYERS:])
    assert [m[1] for m in p.messages] == [(1000 + 1000 * 2) * 4] * LAYERS + \
        [1000 * 2 * 4] * LAYERS
    q_s = sum(m[2] for m in p.messages[LAYERS:])
    p_last = p.messages[LAYERS - 1][2]
    assert p.step_s == pytest.approx(DEEP.compute_s + p_last + q_s)


def test_one_bucket_is_sent_when_backward_ends():
    one = ModelCost(compute_s=0.01, tensors=TENSORS[:2])
    p = predict(Config("data", "topk:0.01"), one, 2, LINK)
    assert p.step_s == pytest.approx(one.compute_s + sum(m[2] for m in p.messages))
