"""Gradient compression (topk, threshold, powersgd; error feedback) on real data, float64,
2 and 3 ranks, uneven last batch: arithmetic against dense training and NumPy references."""
from __future__ import annotations

import pickle

import numpy as np
import pytest

from compression_prog import sparse_pairs
from mpijobs import Program

from distnn.distributed import Compression, LocalComm, PowerSGD, Threshold, TopK
from distnn.distributed.lossy import CompressedReduction, parse_compression
from distnn.distributed.sparse import (decode, encode, payload_bytes, sparse_allreduce_,
                                       sparse_is_cheaper)


PROGRAMS = {n: Program(n, "compression_prog.py", owner=f"test_compression.np{n}",
                      timeout=300) for n in (2, 3)}


@pytest.fixture(scope="module", params=[2, 3], ids=lambda n: f"np{n}")
def results(request, prog_batch):
    out, _ = PROGRAMS[request.param].run(prog_batch)  # in the folder's launch on n ranks
    with open(out / "results.pkl", "rb") as f:
        return pickle.load(f)


def _rel(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


@pytest.mark.parametrize("name", ["topk1", "topk1_sparse", "threshold0_sparse"])
def test_sending_everything_equals_dense_training(results, name):
    dense, run = results["dense"], results[name]
    assert run["compressed"], "no tensor went through the compressed path"
    assert _rel(run["weights"], dense["weights"]) <= 1e-10
    if name != "topk1":  # forced through the all-gather of (index, value) pairs
        assert run["stats"]["messages"] > dense["stats"]["messages"]


@pytest.mark.parametrize("name", ["powersgd_full", "powersgd_full_warm"])
def test_powersgd_at_full_rank_equals_dense_training(results, name):
    run = results[name]
    assert len(run["compressed"]) == 4  # every weight matrix, convolutions included
    assert _rel(run["weights"], results["dense"]["weights"]) <= 1e-6


def test_low_ratio_sends_less_and_trains_differently(results):
    run, dense = results["topk_low"], results["dense"]
    assert run["stats"]["bytes"] < dense["stats"]["bytes"] / 5
    assert run["stats"]["bytes_dense"] == dense["stats"]["bytes"]
    assert _rel(run["weights"], dense["weights"]) > 1e-3


@pytest.mark.parametrize("name", ["topk", "threshold", "threshold_sparse"])
def test_error_feedback_invariant_is_exact_for_sparsification(results, name):
    run = results[f"inv_{name}"]
    assert run["invariant"] == [0.0] * len(run["invariant"])  # sent + residual == acc
    assert min(run["residual_norm"]) > 0
    # ranks picked different indices, and the result is the sum of what they sent
    assert all(run["differ"][:-1])
    assert max(run["vs_sum_compressed"]) == 0.0
    assert max(run["vs_sum"]) <= 1e-15


def test_error_feedback_invariant_powersgd(results):
    run = results["inv_powersgd"]
    assert max(run["invariant"]) <= 1e-14  # M - P^Q_i^T rounds once
    assert min(run["residual_norm"]) > 1e-3
    assert max(run["vs_sum"]) <= 1e-14


def test_error_feedback_off_keeps_no_residual(results):
    on, off = results["inv_topk"], results["inv_topk_no_ef"]
    assert off["residual_norm"] == [0.0] * len(off["residual_norm"])
    assert max(off["invariant"]) > 0  # what was not sent is gone
    assert on["bytes"] == off["bytes"] and on["bytes"] * 5 < on["bytes_dense"]


def test_sparse_exchange_with_different_indices_equals_numpy_sum(results):
    n, summed = results["sparse_direct"]
    ref = np.zeros(n)
    for r in range(results["size"]):
        idx, vals = sparse_pairs(r, n)
        ref[idx] += vals
    assert np.array_equal(summed, ref)


# -- in-process checks of the pieces -----------------------------------------------------
def test_encoding_round_trip_across_blocks():
    rng = np.random.default_rng(0)
    n = 5 * 65536 + 17
    idx = np.sort(rng.choice(n, 4000, replace=False))
    vals = rng.normal(size=4000).astype(np.float32)
    payload = encode(idx, vals, n)
    assert payload.nbytes == payload_bytes(4000, n, 4) == 6 * 4 + 4000 * 6
    back_idx, back_vals = decode(payload, 4000, n, np.float32)
    assert np.array_equal(back_idx, idx) and np.array_equal(back_vals, vals)


def test_crossover_picks_the_cheaper_exchange():
    n = 1_000_000  # float32: sparse while sum of payloads < 2 n 4 bytes
    assert sparse_is_cheaper([10_000] * 8, n, 4)        # 1% on 8 ranks
    assert not sparse_is_cheaper([700_000] * 2, n, 4)   # 70% on 2 ranks
    k = (2 * n * 4 - 2 * 4 * 16) // (2 * 6)             # at the crossover on 2 ranks
    assert sparse_is_cheaper([k - 1] * 2, n, 4) and not sparse_is_cheaper([k + 1] * 2, n, 4)


def test_single_process_sparse_allreduce_is_identity():
    out, _ = sparse_allreduce_(np.zeros(10), np.array([2, 7]), np.array([1.5, -2.0]),
                               LocalComm())
    assert out.tolist() == [0, 0, 1.5, 0, 0, 0, 0, -2.0, 0, 0]


@pytest.mark.parametrize("spec,error", [
    ("topk", "topk needs a value"), ("topk:0", "in (0, 1]"), ("topk:1.5", "in (0, 1]"),
    ("topk:abc", "not a number"), ("threshold:-1", "> 0"), ("powersgd:0", ">= 1"),
    ("powersgd:1.5", "not a whole number"), ("lz4", "unknown"),
])
def test_bad_specs_are_named(spec, error):
    with pytest.raises(ValueError, match="compression") as info:
        parse_compression(spec)
    assert error in str(info.value)


def test_specs_parse_to_objects():
    assert parse_compression("TopK:0.01").spec == "topk:0.01"
    assert isinstance(parse_compression("threshold:1e-3"), Threshold)
    assert parse_compression("powersgd:4").rank == 4
    assert parse_compression("fp16") == "fp16"


def test_one_dimensional_and_small_tensors_travel_dense():
    flat = np.zeros(64 * 300 + 64 + 6 * 6)
    tensors = [("w", 0, 19200, (64, 300)), ("b", 19200, 19264, (64,)),
               ("small", 19264, 19300, (6, 6))]  # PowerSGD: factors (6+6)*2 not 2x smaller
    for cfg in (TopK(0.01), Threshold(0.1), PowerSGD(2)):
        comp = CompressedReduction(cfg, flat, tensors, LocalComm())
        assert comp.compressed == ["w"], cfg


def test_adasum_with_compression_is_refused():
    from distnn.distributed import DistributedOptimizer
    from distnn.models import get_model
    from distnn.optim import SGD
    model = get_model("simplemlp", input_shape=(1, 8, 8), num_classes=10, rng=0)
    with pytest.raises(ValueError, match="Adasum combines parameter deltas"):
        DistributedOptimizer(SGD(model, lr=0.1), model, comm=LocalComm(), op="adasum",
                             compression="topk:0.1")


BYTES = Program(2, "compression_bytes_prog.py", owner="test_compression.bytes", timeout=400)


def test_vgg11bn_bytes_per_step_at_most_a_fiftieth_of_dense(prog_batch):
    tmp_path, _ = BYTES.run(prog_batch)
    with open(tmp_path / "bytes.pkl", "rb") as f:
        out = pickle.load(f)
    for spec, (sent, dense, n_params) in out.items():
        assert dense == n_params * 4  # one step of float32 gradients
        assert 0 < sent <= dense / 50, (spec, dense / sent)


# -- one spec object, parsed once, shared ---------------------------------------------------
@pytest.mark.parametrize("spec", ["none", "fp16", "topk:0.01", "threshold:0.001",
                                  "powersgd:4"])
def test_a_spec_parses_to_one_object_that_gives_its_spec_back(spec):
    obj = Compression.parse(spec)
    assert Compression.parse(obj) is obj  # an object is never parsed again
    assert Compression.parse(obj.spec) == obj and obj == spec
    assert obj.compressing == (spec not in ("none", "fp16"))
    assert obj.wire_dtype == (np.float16 if spec == "fp16" else None)
    assert Compression.parse(None) is Compression.none
    assert Compression.parse("FP16") is Compression.fp16


def test_one_compression_facade_for_numpy_and_torch():
    import distnn.distributed as dist
    from distnn.distributed import reducer
    assert dist.Compression is Compression is reducer.Compression
    x = np.arange(4, dtype=np.float32)
    sent, ctx = Compression.fp16.compress(x)
    assert sent.dtype == np.float16 and Compression.fp16.decompress(sent, ctx).dtype == x.dtype
    with pytest.raises(ValueError, match="compression must be"):
        Compression.parse(3)
    torch = pytest.importorskip("torch")
    import distnn.torch as hvd
    assert hvd.Compression is Compression
    t = torch.arange(4.0)
    half, ctx = hvd.Compression.fp16.compress(t)
    assert half.dtype == torch.float16 and Compression.fp16.decompress(half, ctx).dtype == t.dtype


def test_the_rule_the_reducer_and_a_checkpoint_share_the_spec_object(tmp_path):
    from distnn.data import load_dataset
    from distnn.nn import Dense, Flatten, ReLU, Sequential
    from distnn.optim import SGD
    from distnn.rules import DataParallel
    from distnn.training import Trainer
    from distnn.training.checkpoint import load_checkpoint, save_checkpoint

    def trainer():
        model = Sequential([Flatten(), Dense(64), ReLU(), Dense(3)], input_shape=(1, 8, 8),
                           rng=0)
        return Trainer(model, SGD(model, lr=0.05), rule=DataParallel(compression="topk:0.25"),
                       progress=False, verbose=False)

    data = load_dataset("synthetic", input_shape=(1, 8, 8), num_classes=3, num_samples=64,
                        test_samples=8, seed=1)
    first = trainer()
    spec = first.rule.compression
    assert isinstance(spec, TopK) and first.optimizer._reducer.compression is spec
    assert first.optimizer.compressor.config is spec
    first.fit(data.train, epochs=1, batch_size=16)
    first.optimizer.compressor.steps = 3  # one process exchanges nothing: give it a state
    path = tmp_path / "c.npz"
    save_checkpoint(path, first)
    stored = load_checkpoint(path).meta["rule"]["state"]["compression"]
    assert Compression.parse(stored["spec"]) == spec and stored["steps"] == 3
    second = trainer()
    load_checkpoint(path).restore(second)
    assert second.optimizer.compressor.steps == 3
    assert second.rule.resume_note(load_checkpoint(path).meta["rule"]["state"], 1) is None
