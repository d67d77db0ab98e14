import threading

import numpy as np
import pytest

from datafiles import write_shards
from distnn.data import (ArrayDataset, Batch, Preprocess, RandomCrop, RandomFlip,
                         ShardedDataset, local_range, prefetched)

CASES = [(n, bs, size) for n in (23, 24) for bs in (1, 2, 4, 5, 8, 23, 40) for size in (1, 2, 3)]


def make_dataset(n=23, shape=(1, 3, 3), one_hot=False):
    rng = np.random.default_rng(n)
    x = rng.integers(0, 256, (n, *shape), dtype=np.uint8)
    return ArrayDataset(x, rng.integers(0, 4, n), 4, preprocess=Preprocess(one_hot=one_hot))


def epoch(ds, bs, size, **kw):
    return [list(ds.batches(bs, rank=r, size=size, **kw)) for r in range(size)]


def test_local_range_is_array_split():
    for n in range(12):
        for size in (1, 2, 3, 5):
            parts = np.array_split(np.arange(n), size)
            for r in range(size):
                lo, hi = local_range(n, r, size)
                np.testing.assert_array_equal(np.arange(lo, hi), parts[r])


@pytest.mark.parametrize("n,bs,size", CASES)
@pytest.mark.parametrize("drop_last", [False, True])
def test_sharding_matches_one_rank(n, bs, size, drop_last):
    ds = make_dataset(n)
    one = list(ds.batches(bs, seed=7, drop_last=drop_last))
    per_rank = epoch(ds, bs, size, seed=7, drop_last=drop_last)
    assert {len(b) for b in per_rank} == {len(one)} == {ds.num_batches(bs, drop_last)}
    for k, ref in enumerate(one):
        parts = [per_rank[r][k] for r in range(size)]
        assert all(p.global_size == ref.global_size == len(ref) for p in parts)
        for r, p in enumerate(parts):
            assert p.x.shape == (len(p.indices), 1, 3, 3) and p.y.shape == (len(p.indices),)
            np.testing.assert_array_equal(p.indices, np.array_split(ref.indices, size)[r])
        np.testing.assert_array_equal(np.concatenate([p.x for p in parts]), ref.x)
        np.testing.assert_array_equal(np.concatenate([p.y for p in parts]), ref.y)
    seen = np.concatenate([b.indices for b in one] + [np.zeros(0, np.int64)])
    assert len(seen) == (n - n % bs if drop_last else n) and len(set(seen.tolist())) == len(seen)


def test_empty_share_keeps_the_shape():
    ds = make_dataset(9, one_hot=True)
    batches = epoch(ds, 4, 3, shuffle=False)  # global sizes 4, 4, 1: ranks 1, 2 get 0 at the end
    last = [b[-1] for b in batches]
    assert [len(b) for b in last] == [1, 0, 0]
    for b in last[1:]:
        assert b.x.shape == (0, 1, 3, 3) and b.x.dtype == np.float32
        assert b.y.shape == (0, 4) and b.global_size == 1


@pytest.mark.parametrize("size", [1, 2, 3])
def test_evaluation_sees_each_sample_once(size):
    ds = make_dataset(23)
    x_all, y_all = ds.arrays()
    seen = []
    for batches in epoch(ds, 5, size, shuffle=False):
        for b in batches:
            seen.extend(b.indices.tolist())
            np.testing.assert_array_equal(b.x, x_all[b.indices])
    assert sorted(seen) == list(range(23))


def test_shuffle_depends_only_on_seed():
    ds = make_dataset(30)
    a = [b.indices for b in ds.batches(8, seed=3)]
    b = [b.indices for b in ds.batches(8, seed=3)]
    c = [b.indices for b in ds.batches(8, seed=4)]
    assert all(np.array_equal(u, v) for u, v in zip(a, b))
    assert not all(np.array_equal(u, v) for u, v in zip(a, c))


def test_batch_argument_errors():
    ds = make_dataset()
    for kw, msg in [(dict(batch_size=0), "batch_size must be >= 1, got 0"),
                    (dict(batch_size=4, rank=2, size=2), r"rank must be in \[0, 2\), got 2"),
                    (dict(batch_size=4, seed=1.5), "seed must be an int"),
                    (dict(batch_size=4, augment=["flip"]), "augment entries must be callables")]:
        with pytest.raises(ValueError, match=msg):
            ds.batches(**kw)


# -- NPZ shards -----------------------------------------------------------------------------

@pytest.fixture
def shards(tmp_path):
    paths, x, y = write_shards(tmp_path, [7, 3, 10, 1, 6])
    ds = ShardedDataset.from_files(paths, num_classes=5, preprocess=Preprocess(normalize=False))
    return ds, x, y


@pytest.mark.parametrize("bs,size", [(1, 2), (4, 1), (4, 2), (4, 3), (5, 3), (6, 2), (27, 3),
                                     (40, 2)])
@pytest.mark.parametrize("shuffle", [True, False])
def test_sharded_epoch(shards, bs, size, shuffle):
    ds, x, y = shards
    ref = ArrayDataset(x, y, 5)
    for drop_last in (False, True):
        per_rank = epoch(ds, bs, size, seed=11, shuffle=shuffle, drop_last=drop_last)
        expected = list(ref.batches(bs, seed=11, drop_last=drop_last))
        assert {len(b) for b in per_rank} == {len(expected)}
        seen = []
        for k, exp in enumerate(expected):
            for r in range(size):
                b = per_rank[r][k]
                assert b.global_size == exp.global_size
                assert len(b) == len(np.array_split(exp.indices, size)[r])
                np.testing.assert_array_equal(b.x, x[b.indices])
                np.testing.assert_array_equal(b.y, y[b.indices])
                seen.extend(b.indices.tolist())
        assert len(seen) == len(set(seen)) == sum(b.global_size for b in expected)
        if not shuffle and not drop_last:
            assert sorted(seen) == list(range(27))


def test_sharded_shuffle_changes_with_seed(shards):
    ds = shards[0]
    a = np.concatenate([b.indices for b in ds.batches(27, seed=1)])
    b = np.concatenate([b.indices for b in ds.batches(27, seed=2)])
    assert sorted(a) == sorted(b) and not np.array_equal(a, b)


def test_sharded_rank_reads_only_its_shards(tmp_path, monkeypatch):
    paths, _, _ = write_shards(tmp_path, [10] * 8)
    ds = ShardedDataset.from_files(paths, num_classes=5)
    loads = []
    original = ShardedDataset._load
    monkeypatch.setattr(ShardedDataset, "_load",
                        lambda self, k: loads.append(k) or original(self, k))
    for rank in range(4):
        loads.clear()
        list(ds.batches(16, seed=0, rank=rank, size=4))
        assert len(loads) == len(set(loads)) <= 3  # 20 samples of 10-sample shards: 2 or 3 shards


def test_sharded_split_tail(shards):
    ds, x, y = shards
    head, tail = ds.split_tail(12)
    assert len(head) == 15 and len(tail) == 12
    np.testing.assert_array_equal(tail.arrays()[0], x[15:])
    np.testing.assert_array_equal(head.arrays()[1], y[:15])
    ids = np.concatenate([b.indices for b in tail.batches(5, seed=0)])
    assert sorted(ids) == list(range(12))


# -- prefetch -------------------------------------------------------------------------------

def test_prefetch_yields_the_same_batches():
    ds = make_dataset(50, shape=(3, 6, 6))
    kw = dict(seed=5, rank=1, size=2, augment=[RandomFlip(), RandomCrop(1)])
    plain = list(ds.batches(8, **kw))
    fetched = list(ds.batches(8, prefetch=True, **kw))
    assert len(plain) == len(fetched) == 7
    for a, b in zip(plain, fetched):
        np.testing.assert_array_equal(a.x, b.x)
        np.testing.assert_array_equal(a.y, b.y)


class Failing(ArrayDataset):
    def _raw_batches(self, *args):
        for k, item in enumerate(super()._raw_batches(*args)):
            if k == 2:
                raise OSError("disk on fire")
            yield item


def test_prefetch_propagates_reader_errors():
    ds = Failing(np.zeros((20, 1, 2, 2), np.uint8), np.zeros(20, np.int64), 2)
    got = []
    with pytest.raises(OSError, match="disk on fire"):
        for b in ds.batches(4, prefetch=True):
            got.append(b)
    assert len(got) == 2


def prefetch_threads():
    return [t for t in threading.enumerate() if t.name == "distnn-prefetch"]


def test_prefetch_stops_when_the_consumer_stops():
    closed = []

    def source():
        try:
            for k in range(1000):
                yield k
        finally:
            closed.append(True)

    gen = prefetched(source())
    assert next(gen) == 0 and next(gen) == 1
    gen.close()
    assert closed == [True] and prefetch_threads() == []
    ds = make_dataset(100)
    for b in ds.batches(2, prefetch=True):
        assert isinstance(b, Batch)
        break
    del b
    assert prefetch_threads() == []


# -- augmentation ---------------------------------------------------------------------------

def images(n=16, c=2, h=5, w=6):
    return np.random.default_rng(0).random((n, c, h, w)).astype(np.float32)


def test_random_flip():
    x = images()
    rng = np.random.default_rng(0)
    np.testing.assert_array_equal(RandomFlip(1.0)(x.copy(), rng), x[..., ::-1])
    np.testing.assert_array_equal(RandomFlip(0.0)(x.copy(), rng), x)
    out = RandomFlip(0.5)(x.copy(), rng)
    flipped = [np.array_equal(o, s[..., ::-1]) for o, s in zip(out, x)]
    kept = [np.array_equal(o, s) for o, s in zip(out, x)]
    assert all(f != k for f, k in zip(flipped, kept)) and any(flipped) and any(kept)


def test_random_crop():
    x = images()
    rng = np.random.default_rng(1)
    out = RandomCrop(2)(x.copy(), rng)
    assert out.shape == x.shape and out.dtype == x.dtype
    padded = np.pad(x, ((0, 0), (0, 0), (2, 2), (2, 2)))
    offsets = []
    for o, p in zip(out, padded):
        match = [(i, j) for i in range(5) for j in range(5)
                 if np.array_equal(o, p[:, i:i + 5, j:j + 6])]
        assert match
        offsets.append(match[0])
    assert len(set(offsets)) > 3
    np.testing.assert_array_equal(RandomCrop(2, prob=0.0)(x.copy(), rng), x)
    np.testing.assert_array_equal(RandomCrop(0)(x.copy(), rng), x)
    assert RandomCrop(3)(x[:0].copy(), rng).shape == (0, 2, 5, 6)


def test_augment_streams_differ_by_rank_and_repeat_by_seed():
    x = np.tile(np.arange(12, dtype=np.uint8).reshape(1, 1, 3, 4), (40, 1, 1, 1))
    ds = ArrayDataset(x, np.zeros(40, np.int64), 1)

    def flips(rank, seed):
        b = next(ds.batches(40, seed=seed, rank=rank, size=2, augment=[RandomFlip()]))
        return b.x[:, 0, 0, 0] > 0

    assert np.array_equal(flips(0, 3), flips(0, 3))
    assert not np.array_equal(flips(0, 3), flips(1, 3))
    assert not np.array_equal(flips(0, 3), flips(0, 4))


def test_augment_rejects_non_images():
    ds = ArrayDataset(np.zeros((4, 3), np.float32), np.zeros(4, np.int64), 1)
    with pytest.raises(ValueError, match=r"RandomFlip needs image batches .* got shape \(4, 3\)"):
        next(ds.batches(4, augment=[RandomFlip()]))
    for bad in (lambda: RandomFlip(1.5), lambda: RandomCrop(-1), lambda: RandomCrop(2, prob=2)):
        with pytest.raises(ValueError):
            bad()


def _singa_augmentation(x, offsets, flips):
    """SINGA's CNN examples' loop: symmetric padding by 4, a crop per sample, a flip."""
    xpad = np.pad(x, [[0, 0], [0, 0], [4, 4], [4, 4]], "symmetric")
    out = x.copy()
    for i, ((top, left), flip) in enumerate(zip(offsets, flips)):
        out[i] = xpad[i, :, top:top + x.shape[2], left:left + x.shape[3]]
        if flip:
            out[i] = out[i, :, :, ::-1]
    return out


def test_random_crop_symmetric_padding_is_singas_augmentation():
    x = np.random.default_rng(3).random((64, 1, 28, 28)).astype(np.float32) + 0.5
    crop, flip = RandomCrop(4, padding_mode="symmetric"), RandomFlip()
    rng = np.random.default_rng(7)
    out = flip(crop(x.copy(), rng), rng)
    # the same draws, replayed: crop offsets (top, left), keep mask, then flips
    replay = np.random.default_rng(7)
    top, left = replay.integers(0, 9, 64), replay.integers(0, 9, 64)
    replay.random(64)
    flips = replay.random(64) < 0.5
    np.testing.assert_array_equal(out, _singa_augmentation(x, zip(top, left), flips))
    # mirrored borders hold image pixels, never the zeros of the default padding
    assert out.min() >= 0.5 and len(set(zip(top, left))) > 20
    zero = RandomCrop(4)(x.copy(), np.random.default_rng(7))
    assert zero.min() == 0.0
    with pytest.raises(ValueError, match=r"padding_mode must be one of .*'symmetric'"):
        RandomCrop(4, padding_mode="mirror")
    assert "symmetric" in repr(crop)
