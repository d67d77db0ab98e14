"""Secure aggregation by pairwise masks (distributed/secagg.py): X25519 against RFC 7748,
masks that cancel, and under real mpiexec (2 and 3 ranks) a recording communicator that
shows no client's update leaves its process unmasked while the secure sum equals the
plain float64 sum bit for bit."""
from __future__ import annotations

import os
import pickle

import numpy as np
import pytest

from mpijobs import Program
from helpers import needs_mpi

from distnn.distributed import LocalComm
from distnn.distributed.secagg import (FRACTION_BITS, SecureAggregationError,
                                       SecureAggregator, decode, encode, public_key, x25519)


def test_x25519_matches_rfc7748():
    k = bytes.fromhex("a546e36bf0527c9d3b16154b82465edd62144c0ac1fc5a18506a2244ba449ac4")
    u = int.from_bytes(bytes.fromhex(
        "e6db6867583030db3594c1a424b15f7c726624ec26b3353b10a903a6d0ab1c4c"), "little")
    assert x25519(k, u).to_bytes(32, "little").hex() == \
        "c3da55379de9c6908e94ea4df28d084f32eccf03491c71f754b4075577a28552"
    a, b = os.urandom(32), os.urandom(32)
    assert x25519(a, public_key(b)) == x25519(b, public_key(a))


def test_masks_cancel_and_the_fixed_point_is_exact_on_its_grid():
    agg = SecureAggregator(LocalComm(), owners=[0] * 5)
    masks = [agg.mask(c, range(5), 3, 50) for c in range(5)]
    total = np.zeros(50, np.uint64)
    for m in masks:
        total += m
        assert np.count_nonzero(m) == 50  # every element masked
    assert not total.any()  # the masks cancel mod 2**64
    rng = np.random.default_rng(0)
    ups = {c: rng.normal(size=50) * 100 for c in range(5)}
    got = agg.sum(ups, range(5), 0)
    want = sum(ups.values())
    assert np.abs(got - want).max() <= 5 * 2.0 ** -(FRACTION_BITS + 1) * 1.01
    on_grid = {c: decode(encode(u)) for c, u in ups.items()}
    np.testing.assert_array_equal(agg.sum(on_grid, range(5), 1), sum(on_grid.values()))


def test_values_beyond_the_fixed_point_are_refused():
    with pytest.raises(SecureAggregationError, match="does not fit"):
        encode(np.array([2.0 ** 40]))


K = 5
PROGRAMS = {n: Program(n, "secagg_prog.py", str(K), owner=f"test_secagg.np{n}")
            for n in (2, 3)}


@needs_mpi
@pytest.mark.parametrize("n", [2, 3])
def test_nothing_unmasked_crosses_mpi_and_the_sum_is_exact(prog_batch, n):
    k = K
    tmp_path, _ = PROGRAMS[n].run(prog_batch)  # in the folder's launch on n ranks
    ranks = [pickle.load(open(tmp_path / f"rank{r}.pkl", "rb")) for r in range(n)]
    for res in ranks:
        np.testing.assert_array_equal(res["secure"], res["plain"])
        np.testing.assert_array_equal(res["secure_without_1"], res["plain_without_1"])
    every_update = {c: u for res in ranks for c, u in res["updates"].items()}
    assert sorted(every_update) == list(range(k))
    for r, res in enumerate(ranks):
        kinds = [kind for kind, _ in res["sent"]]
        # one all-gather of public keys, then one all-reduce per sum: nothing else
        assert kinds == ["allgather_obj", "allreduce_", "allreduce_"], kinds
        keys = res["sent"][0][1]
        assert all(isinstance(v, int) for v in keys.values())
        mine = sum((encode(u) for u in res["updates"].values()), np.zeros(1000, np.uint64))
        for _, buf in res["sent"][1:]:
            assert buf.dtype == np.uint64
            # no element of what left matches any client's update, nor this rank's sum
            for c, u in every_update.items():
                assert np.count_nonzero(buf == encode(u)) == 0, (r, c)
                assert np.count_nonzero(buf.view(np.int64).astype(float) == u) == 0
            assert np.count_nonzero(buf == mine) == 0
