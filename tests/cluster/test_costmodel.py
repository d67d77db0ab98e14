"""The cost model of a step (distnn/costmodel/predict.py): hand-computed times on 2 and 4
hosts, MPICH's algorithm by size, monotonicity in bandwidth, the compressions' bytes as
the code counts them, and the float16 exchange's messages (halfsum.py) by hand."""
from __future__ import annotations

import numpy as np
import pytest

from distnn.costmodel.predict import (DEFAULT_CONFIGS, Config, Link, ModelCost,
                                      allgather_time, allreduce_time, alltoall_time,
                                      half_bucket, half_buckets, pick, predict, table, tier)
from distnn.distributed.halfsum import GATHER_BYTES

# 1 Gbit/s = 125e6 bytes/s; 1 MB = 1e6 bytes takes 8 ms; latency 100 us
LINK = Link(gbits=1, latency_s=100e-6)
N = 250_000  # one (500, 500) matrix: 1 MB of float32
ONE = ModelCost(compute_s=0.010, tensors=[("fc/w", 0, N, (500, 500))], batch=32)


def test_allreduce_hand_computed():
    # 2 hosts, 1 MB, reduce-scatter + all-gather: 2*1*alpha + 2*(1/2)*1MB/beta
    t, alg = allreduce_time(1e6, 2, LINK)
    assert alg == "reduce-scatter + all-gather"
    assert t == pytest.approx(2 * 100e-6 + 8e-3)
    # 4 hosts: 2*2*alpha + 2*(3/4)*8 ms
    assert allreduce_time(1e6, 4, LINK)[0] == pytest.approx(4 * 100e-6 + 12e-3)
    # 3 hosts: 2 hosts' algorithm plus the fold of the extra rank (2 whole messages)
    assert allreduce_time(1e6, 3, LINK)[0] == pytest.approx(
        2 * 100e-6 + 8e-3 + 2 * (100e-6 + 8e-3))
    # short message (<= MPIR_CVAR_ALLREDUCE_SHORT_MSG_SIZE): recursive doubling
    t, alg = allreduce_time(2048, 4, LINK)
    assert alg == "recursive doubling"
    assert t == pytest.approx(2 * (100e-6 + 2048 / 125e6))
    # a user-defined op (fp16) is recursive doubling at every size
    t, alg = allreduce_time(1e6, 4, LINK, itemsize=2, builtin_op=False)
    assert (alg, t) == ("recursive doubling", pytest.approx(2 * (100e-6 + 8e-3)))
    assert allreduce_time(1e6, 1, LINK) == (0.0, "none")


def test_allgather_by_size():
    assert allgather_time(4000, 4, LINK) == (pytest.approx(2 * 100e-6 + 0.75 * 4000 / 125e6),
                                             "recursive doubling")
    assert allgather_time(4000, 3, LINK)[1] == "bruck"
    t, alg = allgather_time(1e6, 4, LINK)
    assert alg == "ring" and t == pytest.approx(3 * 100e-6 + 0.75 * 8e-3)


def test_alltoall_by_size():
    # MPICH's Ialltoall: pairwise above 32 KiB per destination, P-1 steps of one chunk each
    t, alg = alltoall_time(1e5, 4, LINK)
    assert alg == "pairwise" and t == pytest.approx(3 * (100e-6 + 1e5 / 125e6))
    # at most 32 KiB: every send posted, 32 at a time (one latency per batch)
    t, alg = alltoall_time(2000, 3, LINK)
    assert alg == "scattered" and t == pytest.approx(100e-6 + 2 * 2000 / 125e6)
    # at most 256 B on 8 ranks or more: Bruck, 3 steps of the 4 blocks whose index has bit k
    t, alg = alltoall_time(200, 8, LINK)
    assert alg == "bruck" and t == pytest.approx(3 * 100e-6 + 12 * 200 / 125e6)
    assert alltoall_time(200, 4, LINK)[1] == "scattered"
    assert alltoall_time(1e5, 1, LINK) == (0.0, "none")


def test_fp16_exchange_hand_computed():
    # every tensor a bucket of its own: the bias (500 elements, first in backward order) is
    # all-gathered whole (the other ranks' float16 copies <= 64 KiB); the matrix goes as an
    # all-to-all of float16 chunks and an all-gather of the summed chunks (halfsum.py)
    b = ModelCost(compute_s=0.01, tensors=[("fc/w", 0, N, (500, 500)),
                                          ("fc/b", N, N + 500, (500,))])
    cfg = Config("data", "fp16", bucket_size_mb=0)
    beta = 125e6
    # 2 hosts: bias: 1 message of 1000 B; matrix: chunks of 125000 elements (250000 B):
    # 1 message in each phase (every phase's messages posted at once: direct.py)
    bias, mat = half_buckets(cfg, b, 2, LINK)
    assert (bias.whole, bias.sends, bias.sent, bias.counted) == (True, 1, 1000, 1000)
    assert bias.seconds == pytest.approx(100e-6 + 1000 / beta)
    assert (mat.whole, mat.sends, mat.sent, mat.counted) == (False, 2, 500_000, 2 * N)
    assert mat.seconds == pytest.approx(2 * (100e-6 + 250_000 / beta))
    assert mat.algorithm == "all-to-all (direct) + all-gather (direct)"
    p2 = predict(cfg, b, 2, LINK)
    assert p2.bytes_per_step == (N + 500) * 2  # Reducer.bytes_reduced: float16 bytes, once
    assert sum(h.sends for h in half_buckets(cfg, b, 2, LINK)) == 3
    # the bias is done early in backward, the matrix when backward ends
    assert p2.step_s == pytest.approx(0.010 + mat.seconds)
    # 3 hosts: bias: 2 messages of 1000 B at once; matrix: chunks of ceil(N/3) = 83334
    # elements (166668 B), 2 messages at once in each phase: one latency a phase
    bias, mat = half_buckets(cfg, b, 3, LINK)
    assert (bias.whole, bias.sends, bias.sent) == (True, 2, 2000)
    assert bias.seconds == pytest.approx(100e-6 + 2000 / beta)
    assert (mat.whole, mat.sends, mat.sent) == (False, 4, 4 * 166_668)
    assert mat.seconds == pytest.approx(2 * (100e-6 + 2 * 166_668 / beta))
    p3 = predict(cfg, b, 3, LINK)
    assert p3.bytes_per_step == (N + 500) * 2
    assert p3.step_s == pytest.approx(0.010 + mat.seconds)
    # the whole form's threshold is the exchange's own: 2 * n * (P - 1) <= GATHER_BYTES
    assert half_bucket(GATHER_BYTES // 2, 2, LINK).whole
    assert not half_bucket(GATHER_BYTES // 2 + 1, 2, LINK).whole
    assert not half_bucket(GATHER_BYTES // 4 + 1, 3, LINK).whole


def test_fp16_no_slower_than_dense_for_big_buckets():
    # buckets of 1 MiB and more (float32) on 1 Gbit/s: the float16 exchange moves half the
    # bytes in both phases, so each bucket and the step take no longer than dense
    layers = 1 << 18  # elements of 1 MiB of float32
    big = ModelCost(compute_s=0.02, tensors=[(f"l{i}/w", i * layers, (i + 1) * layers,
                                             (512, 512)) for i in range(4)])
    slow = Link(gbits=1)
    for mb in (1, 2, 4):
        for hosts in (2, 3, 4, 8, 16, 64):
            dense = predict(Config("data", bucket_size_mb=mb), big, hosts, slow)
            fp16 = predict(Config("data", "fp16", bucket_size_mb=mb), big, hosts, slow)
            assert fp16.bytes_per_step == dense.bytes_per_step / 2
            assert fp16.step_s <= dense.step_s, (mb, hosts)
            assert all(h[2] <= d[2] for h, d in zip(fp16.messages, dense.messages))


def test_data_on_two_and_four_hosts_hand_computed():
    # one bucket of 1 MB, ready when backward ends: nothing to overlap with
    p2 = predict(Config("data"), ONE, 2, LINK)
    assert p2.step_s == pytest.approx(0.010 + 2 * 100e-6 + 8e-3)
    assert p2.bytes_per_step == 1e6
    assert p2.efficiency == pytest.approx(0.010 / p2.step_s)
    assert p2.samples_per_s == pytest.approx(2 * 32 / p2.step_s)
    p4 = predict(Config("data"), ONE, 4, LINK)
    assert p4.step_s == pytest.approx(0.010 + 4 * 100e-6 + 12e-3)


def test_buckets_overlap_backward():
    # two 1 MB layers, buckets of 1 MiB: the last layer's bucket is ready half-way through
    # backward (backward = 2/3 of 30 ms = 20 ms) and its 8.2 ms hide behind the other 10 ms
    two = ModelCost(compute_s=0.030, batch=32,
                    tensors=[("a/w", 0, N, (500, 500)), ("b/w", N, 2 * N, (500, 500))])
    p = predict(Config("data", bucket_size_mb=1), two, 2, LINK)
    t = 2 * 100e-6 + 8e-3
    assert p.step_s == pytest.approx(max(0.030, 0.020 + t) + t)
    one_bucket = predict(Config("data", bucket_size_mb=4), two, 2, LINK)
    assert one_bucket.step_s == pytest.approx(0.030 + 2 * 100e-6 + 16e-3)
    assert p.step_s < one_bucket.step_s


def test_rules_hand_computed():
    t_w = 2 * 100e-6 + 2 * (1 / 2) * (N + 1) * 4 / 125e6  # weights + 1 count, 2 hosts
    assert predict(Config("localsgd"), ONE, 2, LINK).step_s == pytest.approx(0.010 + t_w / 8)
    chunk = (N // 4 + 1) * 4
    assert predict(Config("partial"), ONE, 2, LINK).step_s == pytest.approx(
        0.010 + 2 * 100e-6 + chunk / 125e6)
    # downpour, 4 hosts: 3 workers, each 10 ms + 2 messages of 1 MB + the master's late
    # pickup (its messages 10/3 ms apart, 8.1 ms after its reply: 11.43 ms since its last
    # message, its 2 ms sleeps wake at ..., 11.1, 13.1, 15.1 ms: the second wake after
    # the arrival, 3.67 ms later) > the master's link's 3 MB a round (24 ms)
    d = predict(Config("downpour"), ONE, 4, LINK)
    assert d.ranks_computing == 3
    t = 2 * (100e-6 + 8e-3)
    assert d.step_s == pytest.approx(max(0.010 + t + (0.0151 - (0.010 / 3 + t / 2)),
                                         3 * 8e-3))


def test_master_pickup_is_the_second_wake_after_the_arrival():
    from distnn.costmodel.collectives import master_pickup_s
    # sleeps of 0.1, 0.2, 0.4, 0.8, 1.6, then 2 ms: wakes at 0.1, 0.3, 0.7, 1.5, 3.1, 5.1,
    # 7.1 ms; a message 4 ms after the last one is seen at 7.1 ms
    assert master_pickup_s(0.004, 2e-3) == pytest.approx(0.0031)
    assert master_pickup_s(0.0, 2e-3) == pytest.approx(0.0003)  # back to back
    # each sleep 80 us longer than asked (measured on the emulated cluster's host): wakes
    # at ..., 3.50, 5.58, 7.66 ms
    assert master_pickup_s(0.004, 2e-3, overshoot_s=80e-6) == pytest.approx(0.00366)
    # polls that sleep 10 us: the message waits about two of them
    assert master_pickup_s(0.004, 1e-5, min_sleep=1e-5) < 3e-5


def test_faster_links_never_slow_a_step():
    for cfg in DEFAULT_CONFIGS:
        for hosts in (2, 3, 8, 64, 1024):
            steps = [predict(cfg, ONE, hosts, Link(g)).step_s for g in (0.1, 1, 10, 100)]
            assert steps == sorted(steps, reverse=True), (cfg.label, hosts, steps)


def test_compression_sends_what_the_code_says():
    from distnn.distributed.sparse import payload_bytes
    b = ModelCost(compute_s=0.01, tensors=[("fc/w", 0, N, (500, 500)),
                                          ("fc/b", N, N + 500, (500,))])
    dense = predict(Config("data"), b, 2, LINK)
    assert dense.bytes_per_step == (N + 500) * 4
    fp16 = predict(Config("data", "fp16"), b, 2, LINK)
    assert fp16.bytes_per_step == (N + 500) * 2
    topk = predict(Config("data", "topk:0.01"), b, 2, LINK)
    # the bias (1-D) goes dense; 2500 pairs of the matrix travel block-encoded
    assert [m[1] for m in topk.messages] == [500 * 4, payload_bytes(2500, N + 500, 4)]
    assert payload_bytes(2500, N + 500, 4) == 4 * 4 + 2500 * 6
    psgd = predict(Config("data", "powersgd:2"), b, 2, LINK)
    assert [m[1] for m in psgd.messages] == [(500 + 500 * 2) * 4, 500 * 2 * 4]
    for p in (fp16, topk, psgd):
        assert p.bytes_per_step < dense.bytes_per_step
        assert p.step_s < dense.step_s
    # past the crossover (ratio ~1.33/N) top-k's selection goes through a dense all-reduce
    wide = predict(Config("data", "topk:0.01"), b, 256, LINK)
    assert [m[0] for m in wide.messages] == ["selected, dense"]


def test_the_bytes_match_the_reducer_on_one_process():
    # the dense path's bytes are the Reducer's count of what it handed to MPI
    from distnn.distributed import LocalComm
    from distnn.distributed.reducer import Reducer
    flat = np.ones(N + 500, np.float32)
    red = Reducer(flat, [("fc", 0, N + 500)], LocalComm(), compression="fp16",
                  non_blocking=False)
    assert red.wire == np.float16
    b = ModelCost(compute_s=0.01, tensors=[("fc/w", 0, N, (500, 500)),
                                          ("fc/b", N, N + 500, (500,))])
    assert predict(Config("data", "fp16"), b, 2, LINK).bytes_per_step == \
        flat.size * np.dtype(red.wire).itemsize


def test_table_and_pick():
    rows = table(DEFAULT_CONFIGS, ONE, [2, 4], LINK)
    assert [(r.hosts, r.config) for r in rows] == [(h, c) for h in (2, 4)
                                                   for c in DEFAULT_CONFIGS]
    two = rows[:len(DEFAULT_CONFIGS)]
    exact = max((r for r in two if tier(r.config) == 0), key=lambda r: r.samples_per_s)
    # 1 Gbit/s, 1 MB of gradients, 10 ms of compute: dense data scales ~55%, fp16 ~70%
    assert exact.efficiency < 0.9
    assert pick(two).config.label in ("data+topk:0.01", "data+powersgd:2")
    assert pick(two).samples_per_s == max(r.samples_per_s for r in two
                                          if tier(r.config) == 1)
    assert pick(two, efficiency=0.5) == exact  # exact updates when they scale well enough
    assert pick(two, efficiency=1.0) == max(two, key=lambda r: r.samples_per_s)
    assert predict(Config("data"), ONE, 1, LINK).efficiency == 1.0


def test_bad_inputs_name_the_argument():
    with pytest.raises(ValueError, match="gbits"):
        Link(gbits=0)
    with pytest.raises(ValueError, match="compute_s"):
        ModelCost(compute_s=0, tensors=[])
    with pytest.raises(ValueError, match="threshold"):
        predict(Config("data", "threshold:0.001"), ONE, 2, LINK)
    with pytest.raises(ValueError, match="unknown training rule 'nosuch'"):
        predict(Config("nosuch"), ONE, 2, LINK)


def test_the_model_reads_what_each_rule_declares(monkeypatch):
    # gem's workers send what downpour's send (the master-worker declaration, rules/_p2p.py)
    assert predict(Config("gem"), ONE, 4, LINK).step_s == \
        predict(Config("downpour"), ONE, 4, LINK).step_s
    from distnn import rules
    from distnn.rules.base import Message, Rule

    class Silent(Rule):  # a rule that declares nothing is refused by name, not guessed at
        name = "silent"

    monkeypatch.setitem(rules.RULES, "silent", Silent)
    with pytest.raises(ValueError, match="cannot predict rule 'silent'.*declares no traffic"):
        predict(Config("silent"), ONE, 2, LINK)

    class Chatty(Rule):  # one file: the model prices whatever a new rule declares
        name = "chatty"

        @classmethod
        def step_messages(cls, *, size, itemsize, period, probability):
            return [Message("weights", size * itemsize, 0.5, "allreduce")]

    monkeypatch.setitem(rules.RULES, "chatty", Chatty)
    t, _ = allreduce_time(N * 4, 2, LINK)
    assert predict(Config("chatty"), ONE, 2, LINK).step_s == pytest.approx(0.010 + t / 2)
    # PyDTNN's parallel pipeline (delayed SGD): the all-reduce hides behind the next step,
    # so only the part of it longer than a step shows
    slow = Link(gbits=0.1, latency_s=100e-6)
    t_slow, _ = allreduce_time(N * 4, 2, slow)
    assert t_slow > 0.010
    assert predict(Config("pipeline"), ONE, 2, slow).step_s == pytest.approx(t_slow)
    assert predict(Config("pipeline"), ONE, 2, Link(gbits=100)).step_s == pytest.approx(0.010)


def test_shard_is_priced_by_the_traffic_data_declares():
    from distnn.costmodel.collectives import reduce_scatter_time
    from distnn.costmodel.predict import slice_messages
    # two layers of 1 MB each: stage 2 and 3 reduce-scatter each as backward makes it
    two = ModelCost(compute_s=0.030, tensors=[("a/w", 0, N, (500, 500)),
                                              ("b/w", N, 2 * N, (500, 500))], batch=32,
                    segments=[("a", 0, N), ("b", N, 2 * N)])
    rs, alg = reduce_scatter_time(N * 4, 2, LINK)
    assert (alg, rs) == ("pairwise exchange", pytest.approx(100e-6 + 4e-3))  # half of 1 MB
    assert [(m[1], m[4]) for m in slice_messages(two, 2, LINK)] == [(N * 4, 0.5),
                                                                     (N * 4, 1.0)]
    gather, _ = allgather_time(2 * N * 4, 2, LINK)
    assert gather == pytest.approx(100e-6 + 8e-3)
    dense = predict(Config("data"), two, 2, LINK)
    s1, s2, s3 = (predict(Config("data", shard=k), two, 2, LINK) for k in (1, 2, 3))
    # stage 1: the dense all-reduce, then the parameters all-gathered after the step
    assert s1.step_s == pytest.approx(dense.step_s + gather)
    # stage 2: backward is 20 ms; the last layer's slices start at 20 ms (forward 10 ms +
    # half of backward) and are done by 24.1, the first layer's at 30 ms: 30 + 4.1, then
    # the all-gather; stage 3 gathers before forward and before backward
    assert s2.step_s == pytest.approx(0.030 + rs + gather)
    assert s3.step_s == pytest.approx(0.030 + rs + 2 * gather)
    # bytes a rank hands MPI: the gradients whole (reduce-scatter), its slice of each gather
    assert s2.bytes_per_step == pytest.approx(2 * N * 4 + N * 4)
    assert s3.bytes_per_step == pytest.approx(2 * N * 4 + 2 * N * 4)
    assert [p.config.label for p in table(DEFAULT_CONFIGS, two, [2], LINK)][-3:] == \
        ["data --shard 1", "data --shard 2", "data --shard 3"]
    assert tier(Config("data", shard=3)) == 0  # exact updates
    with pytest.raises(ValueError, match="shard=2: rule 'localsgd' keeps no sharded state"):
        predict(Config("localsgd", shard=2), two, 2, LINK)


def test_token_bucket_of_a_shaped_link():
    # tc's tbf lets its burst pass at once after a pause: the emulated links' bucket
    # (Link.burst_bytes) takes the first bytes a rank sends a step off the link's time
    from distnn.cluster.emulated import tbf_burst_bytes
    assert tbf_burst_bytes("1gbit") == 256 * 1024  # 2 ms of 1 Gbit/s is less than 256 KiB
    assert tbf_burst_bytes("10gbit") == 2440 * 1024
    plain = predict(Config("data"), ONE, 2, LINK)
    # 2 hosts, 1 MB: each rank sends 1 MB (reduce-scatter + all-gather halves); 400 kB of
    # them in the bucket (refilled over the 10 ms of compute: 1.25 MB at most)
    bucket = Link(gbits=1, latency_s=100e-6, burst_bytes=4e5)
    assert bucket.burst_credit(1e-3) == pytest.approx(125e3)  # 1 ms refills 125 kB
    assert bucket.burst_credit(1.0) == 4e5
    got = predict(Config("data"), ONE, 2, bucket)
    assert got.step_s == pytest.approx(plain.step_s - 4e5 / 125e6)
    # a bucket deeper than what is sent leaves only the latencies
    deep = predict(Config("data"), ONE, 2, Link(1, 100e-6, burst_bytes=1e9))
    assert deep.step_s == pytest.approx(0.010 + 2 * 100e-6)
    # no bucket: the model as before (a real link)
    assert predict(Config("data"), ONE, 2, Link(1, 100e-6, burst_bytes=0)).step_s == \
        plain.step_s
    with pytest.raises(ValueError, match="burst_bytes"):
        Link(1, burst_bytes=-1)
    # localsgd (every 8): its all-reduce of the weights every 8 steps of compute
    loc = predict(Config("localsgd"), ONE, 2, Link(1, 100e-6, burst_bytes=1e9)).step_s
    assert loc == pytest.approx(0.010 + allreduce_time(1e6 + 4, 2, Link(1e9, 100e-6))[0]
                                / 8, rel=1e-3)
