"""The seed systems' data files through the public API: PyDTNN's ImageNet shards and NNLO's
HDF5 lists read one rank's part at a time."""
from __future__ import annotations

import numpy as np
import pytest

from datafiles import write_cifar, write_h5_list, write_pydtnn_shards
from distnn.data import load_dataset
from distnn.data.partition import PartDataset


def test_pydtnn_imagenet_shards_load_with_1_based_labels(tmp_path):
    _, x_train, y_train = write_pydtnn_shards(tmp_path / "train", [5, 4])
    _, x_val, y_val = write_pydtnn_shards(tmp_path / "validation", [3], seed=1)
    assert y_train.shape == (9, 1) and y_train.dtype == np.int16
    splits = load_dataset("imagenet", path=tmp_path, normalize=False)
    x, y = splits.train.arrays()
    np.testing.assert_array_equal(x, x_train.astype(np.float32))
    np.testing.assert_array_equal(y, y_train[:, 0] - 1)  # 1..1000 -> 0..999
    assert splits.train.num_classes == 1000
    np.testing.assert_array_equal(splits.test.arrays()[1], y_val[:, 0] - 1)
    # a folder holding the shards themselves (PyDTNN's --dataset_train_path)
    flat = load_dataset("imagenet", path=tmp_path / "train", normalize=False)
    np.testing.assert_array_equal(flat.train.arrays()[1], y_train[:, 0] - 1)
    assert flat.test is None


def _epoch(parts, batch_size, seed=3):
    """(indices per rank, global sizes per step) of one epoch over all parts."""
    runs = [list(p._raw_batches(batch_size, True, seed, p.rank, p.size, False)) for p in parts]
    steps = {len(r) for r in runs}
    assert len(steps) == 1, "every rank must iterate the same number of steps"
    sizes = [[b[3] for b in r] for r in runs]
    assert all(s == sizes[0] for s in sizes), "ranks disagree on the global batch sizes"
    for k, g in enumerate(sizes[0]):
        assert g == sum(len(r[k][0]) for r in runs)
    return [np.concatenate([b[0] for b in r]) for r in runs], sizes[0]


@pytest.mark.parametrize("files,size", [(5, 2), (4, 3), (1, 2), (2, 3)])
def test_hdf5_each_rank_reads_its_part_and_every_sample_is_used_once(tmp_path, files, size):
    n = [23, 17, 9, 30, 11][:files]
    list_file, x_all, y_all = write_h5_list(tmp_path, "train", n, one_hot=files == 1)
    parts = [load_dataset("hdf5", path=list_file, rank=r, size=size).train
             for r in range(size)]
    assert all(isinstance(p, PartDataset) for p in parts)
    local = [p.local_len() for p in parts]
    assert sum(local) == len(y_all) and max(local) < len(y_all)
    # what each rank holds: whole files round-robin, or its rows of every file
    if files >= size:
        starts = np.cumsum([0] + n)
        for r, p in enumerate(parts):
            rows = np.concatenate([np.arange(starts[k], starts[k + 1])
                                   for k in range(r, files, size)])
            np.testing.assert_array_equal(p.local.y, y_all[rows])
    infos = [p.part_info() for p in parts]
    for p in parts:
        p.set_parts([c for c, _ in infos], max(t for _, t in infos))
    assert {len(p) for p in parts} == {len(y_all)}
    ids, sizes = _epoch(parts, batch_size=8)
    every = np.sort(np.concatenate(ids))
    np.testing.assert_array_equal(every, np.arange(len(y_all)))  # each sample once
    assert len(sizes) == parts[0].num_batches(8) and sum(sizes) == len(y_all)


@pytest.mark.parametrize("files,ranks", [(4, 3), (1, 3), (2, 4)])
def test_hdf5_parts_of_the_workers_serve_training_and_the_whole_job(tmp_path, files, ranks):
    # Parameter-server rules: rank 0 (the master) trains on nothing, so the training
    # files are split among ranks 1..N-1 (train_part); evaluation asks every rank.
    n = [23, 17, 9, 30][:files]
    list_file, _, y_all = write_h5_list(tmp_path, "train", n)
    workers = ranks - 1
    parts = [load_dataset("hdf5", path=list_file, rank=r, size=ranks,
                          train_part=(None if r == 0 else r - 1, workers)).train
             for r in range(ranks)]
    assert parts[0].rank is None and parts[0].local_len() == 0
    assert parts[0].input_shape == parts[1].input_shape == (1, 8, 8)
    owners = [p.rank for p in parts]
    sizes = [p.local_len() for p in parts[1:]]
    for r, p in enumerate(parts):
        p.set_parts(sizes, 10, owners=owners, job_rank=r)
    assert {len(p) for p in parts} == {len(y_all)}
    for view in ("workers", "job"):
        runs = [list(p._raw_batches(8, True, 5, *((p.rank, workers) if view == "workers"
                                                   else (r, ranks)), False))
                for r, p in enumerate(parts) if view == "job" or p.rank is not None]
        assert len({len(run) for run in runs}) == 1  # the same number of steps everywhere
        ids = np.sort(np.concatenate([b[0] for run in runs for b in run]))
        np.testing.assert_array_equal(ids, np.arange(len(y_all)))  # each sample once
    with pytest.raises(ValueError, match="cannot give batches for rank 0 of 2"):
        next(parts[-1]._raw_batches(8, False, 0, 0, 2, False))  # neither of its views


def test_part_dataset_refuses_a_batch_smaller_than_the_ranks(tmp_path):
    list_file, _, _ = write_h5_list(tmp_path, "train", [5, 5, 5])
    parts = [load_dataset("hdf5", path=list_file, rank=r, size=3).train for r in range(3)]
    for p in parts:
        p.set_parts([5, 5, 5], 10)
    with pytest.raises(ValueError, match="smaller than the 3 ranks"):
        parts[0].num_batches(2)


def test_hdf5_channels_last_images_are_read_as_nchw(tmp_path):
    # NNLO's GetData writes Keras' channels-last arrays: (N, 28, 28, 1) float32, one-hot
    import h5py
    x = np.random.default_rng(0).random((6, 5, 4, 1), dtype=np.float32)
    with h5py.File(tmp_path / "mnist_train_0.h5", "w") as f:
        f["features"] = x
        f["labels"] = np.eye(10, dtype=np.float32)[np.arange(6)]
    (tmp_path / "train_mnist.list").write_text(f"{tmp_path / 'mnist_train_0.h5'}\n")
    train = load_dataset("hdf5", path=tmp_path / "train_mnist.list").train
    assert train.input_shape == (1, 5, 4) and train.num_classes == 10
    np.testing.assert_array_equal(train.arrays()[0], x.transpose(0, 3, 1, 2))


def test_cifar10_from_the_archive_file(tmp_path):
    # PyDTNN: --dataset_path=datasets/cifar10/cifar-10-binary.tar.gz
    import tarfile
    data = write_cifar(tmp_path / "cifar-10-batches-bin", per_file=3)
    with tarfile.open(tmp_path / "cifar-10-binary.tar.gz", "w:gz") as tar:
        tar.add(tmp_path / "cifar-10-batches-bin", arcname="cifar-10-batches-bin")
    splits = load_dataset("cifar10", path=tmp_path / "cifar-10-binary.tar.gz", normalize=False)
    x, y = splits.train.arrays()
    np.testing.assert_array_equal(x, data["x_train"].astype(np.float32))
    np.testing.assert_array_equal(splits.test.arrays()[1], data["y_test"])
