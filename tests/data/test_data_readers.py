import gzip
import time
from pathlib import Path

import numpy as np
import pytest

from datafiles import make_images, write_cifar, write_idx, write_mnist
from distnn.data import ArrayDataset, DATASETS, DatasetError, load_dataset, read_idx
from distnn.data import fetch, readers

FASHION = Path("/usr/share/datasets/fashion-mnist")


@pytest.fixture
def no_default_places(tmp_path, monkeypatch):
    """Point every default search place at empty temp folders."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("DISTNN_DATA", raising=False)
    monkeypatch.setattr(fetch, "SYSTEM_ROOT", tmp_path / "system")
    return tmp_path


def collect(ds):
    b = next(ds.batches(len(ds), shuffle=False))
    return b.x, b.y


@pytest.mark.parametrize("gz", [False, True])
def test_idx_round_trip(tmp_path, gz):
    ref = write_mnist(tmp_path / "mnist", gz=gz)
    splits = load_dataset("mnist", path=tmp_path / "mnist", download=False)
    assert splits.val is None
    assert splits.train.input_shape == (1, 28, 28) and splits.train.num_classes == 10
    assert len(splits.train) == 50 and len(splits.test) == 20
    x, y = collect(splits.train)
    assert x.dtype == np.float32 and x.shape == (50, 1, 28, 28)
    np.testing.assert_allclose(x[:, 0], ref["x_train"] / 255.0, rtol=1e-6)
    np.testing.assert_array_equal(y, ref["y_train"])
    assert y.dtype == np.int64
    x, y = collect(splits.test)
    np.testing.assert_allclose(x[:, 0], ref["x_test"] / 255.0, rtol=1e-6)


def test_idx_search_order_and_aliases(tmp_path, monkeypatch, no_default_places):
    write_mnist(tmp_path / "system" / "fashion-mnist", n_train=11, gz=True)
    assert len(load_dataset("fashion_mnist", download=False).train) == 11
    write_mnist(tmp_path / "home" / ".cache" / "distnn" / "fashion_mnist", n_train=12)
    assert len(load_dataset("fashion-mnist", download=False).train) == 12
    monkeypatch.setenv("DISTNN_DATA", str(tmp_path / "env"))
    write_mnist(tmp_path / "env" / "fashion_mnist", n_train=13)
    assert len(load_dataset("fashion_mnist", download=False).train) == 13


def test_idx_bad_magic(tmp_path):
    folder = tmp_path / "mnist"
    write_mnist(folder)
    data = bytearray((folder / "train-images-idx3-ubyte").read_bytes())
    data[2] = 0x07
    (folder / "train-images-idx3-ubyte").write_bytes(bytes(data))
    with pytest.raises(DatasetError, match=r"train-images-idx3-ubyte: bad magic number 0x00000703"):
        load_dataset("mnist", path=folder, download=False)


def test_idx_labels_file_as_images_is_bad_magic(tmp_path):
    folder = tmp_path / "mnist"
    write_mnist(folder)
    labels = (folder / "t10k-labels-idx1-ubyte").read_bytes()
    (folder / "t10k-images-idx3-ubyte").write_bytes(labels)
    with pytest.raises(DatasetError, match="bad magic number 0x00000801"):
        load_dataset("mnist", path=folder, download=False)


def test_idx_truncated(tmp_path):
    folder = tmp_path / "mnist"
    write_mnist(folder)
    path = folder / "train-images-idx3-ubyte"
    path.write_bytes(path.read_bytes()[:-5])
    with pytest.raises(DatasetError, match=r"train-images-idx3-ubyte: truncated.*download it"):
        read_idx(path, 3)


def test_idx_truncated_gzip(tmp_path):
    folder = tmp_path / "mnist"
    write_mnist(folder, gz=True)
    path = folder / "train-images-idx3-ubyte.gz"
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(DatasetError, match=r"idx3-ubyte.gz: cannot decompress"):
        load_dataset("mnist", path=folder, download=False)


def test_a_large_gzip_is_decompressed_once_and_a_changed_file_read_anew(no_default_places):
    """Every rank of every run decompressed Fashion-MNIST again; a gzip of 1 MB and more is
    decompressed once into ~/.cache/distnn/decompressed. The entry is the file's, not its
    name's: a file rewritten in place is read anew, and a corrupt file still fails."""
    folder = no_default_places / "mnist"
    train = write_mnist(folder, n_train=1400, gz=True)["x_train"]
    path = folder / "train-images-idx3-ubyte.gz"
    assert path.stat().st_size >= readers.CACHE_MIN_BYTES
    cache = no_default_places / "home" / ".cache" / "distnn" / "decompressed"
    first = load_dataset("mnist", path=folder, download=False)
    assert [p.name[:23] for p in cache.iterdir()] == ["train-images-idx3-ubyte"]
    np.testing.assert_array_equal(np.rint(collect(first.train)[0][:, 0] * 255), train)
    again = load_dataset("mnist", path=folder, download=False)
    np.testing.assert_array_equal(collect(again.train)[0], collect(first.train)[0])

    changed = 255 - train
    write_idx(path, changed)
    np.testing.assert_array_equal(
        np.rint(collect(load_dataset("mnist", path=folder, download=False).train)[0][:, 0] * 255),
        changed)
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(DatasetError, match=r"idx3-ubyte.gz: cannot decompress"):
        load_dataset("mnist", path=folder, download=False)


def test_idx_count_mismatch(tmp_path):
    folder = tmp_path / "mnist"
    write_mnist(folder)
    write_idx(folder / "train-labels-idx1-ubyte", np.zeros(49, np.uint8))
    with pytest.raises(DatasetError, match=r"train-labels-idx1-ubyte: 49 labels for 50 images"):
        load_dataset("mnist", path=folder, download=False)


def test_idx_label_out_of_range(tmp_path):
    folder = tmp_path / "mnist"
    write_mnist(folder)
    labels = np.zeros(20, np.uint8)
    labels[3] = 10
    write_idx(folder / "t10k-labels-idx1-ubyte.gz", labels)  # .gz is used when plain is absent
    (folder / "t10k-labels-idx1-ubyte").unlink()
    with pytest.raises(DatasetError, match=r"t10k-labels-idx1-ubyte.gz: label 10 out of range"):
        load_dataset("mnist", path=folder, download=False)


def test_missing_dataset_lists_places(tmp_path, monkeypatch, no_default_places):
    monkeypatch.setenv("DISTNN_DATA", str(tmp_path / "env"))
    with pytest.raises(DatasetError) as err:
        load_dataset("fashion_mnist", download=False)
    msg = str(err.value)
    for place in [tmp_path / "env" / "fashion_mnist", tmp_path / "env" / "fashion-mnist",
                  tmp_path / "home" / ".cache" / "distnn" / "fashion_mnist",
                  tmp_path / "system" / "fashion-mnist"]:
        assert str(place) in msg
    assert "apt-get install dataset-fashion-mnist" in msg and "DISTNN_DATA" in msg
    assert "path=" in msg


def test_explicit_path_is_the_only_place(tmp_path, no_default_places):
    write_mnist(tmp_path / "home" / ".cache" / "distnn" / "mnist")
    with pytest.raises(DatasetError, match="typo"):
        try:
            load_dataset("mnist", path=tmp_path / "typo", download=False)
        except DatasetError as exc:
            assert ".cache" not in str(exc)
            raise


def test_cifar10_round_trip_and_subfolder(tmp_path):
    ref = write_cifar(tmp_path / "c10" / "cifar-10-batches-bin")
    splits = load_dataset("cifar10", path=tmp_path / "c10", download=False, normalize=False)
    assert splits.train.input_shape == (3, 32, 32) and len(splits.train) == 35
    x, y = collect(splits.train)
    np.testing.assert_array_equal(x, ref["x_train"])
    np.testing.assert_array_equal(y, ref["y_train"])
    x, y = collect(splits.test)
    np.testing.assert_array_equal(x, ref["x_test"])
    assert load_dataset("cifar10", path=tmp_path / "c10" / "cifar-10-batches-bin",
                        download=False).test.num_classes == 10


def test_cifar10_truncated_and_bad_label(tmp_path):
    write_cifar(tmp_path)
    path = tmp_path / "data_batch_3.bin"
    good = path.read_bytes()
    path.write_bytes(good[:-1])
    with pytest.raises(DatasetError, match=r"data_batch_3.bin: .*truncated"):
        load_dataset("cifar10", path=tmp_path, download=False)
    path.write_bytes(bytes([12]) + good[1:])
    with pytest.raises(DatasetError, match=r"data_batch_3.bin: label 12 out of range"):
        load_dataset("cifar10", path=tmp_path, download=False)


def _h5(path, x, y, features="features", labels="labels"):
    import h5py

    with h5py.File(path, "w") as f:
        f[features] = x
        f[labels] = y


def test_hdf5_lists(tmp_path):
    rng = np.random.default_rng(0)
    (tmp_path / "parts").mkdir()
    xa, xb, xv = (rng.standard_normal((n, 6)).astype(np.float32) for n in (5, 7, 4))
    ya, yb = rng.integers(0, 3, 5), rng.integers(0, 3, 7)
    yv = np.eye(3)[rng.integers(0, 3, 4)]  # one-hot labels
    _h5(tmp_path / "parts" / "a.h5", xa, ya)
    _h5(tmp_path / "parts" / "b.h5", xb, yb)
    _h5(tmp_path / "v.h5", xv, yv)
    (tmp_path / "train.txt").write_text(f"parts/a.h5\n\n{tmp_path / 'parts' / 'b.h5'}\n")
    (tmp_path / "val.txt").write_text("v.h5\n")
    splits = load_dataset("hdf5", path=tmp_path, train_list="train.txt", val_list="val.txt")
    assert splits.train.input_shape == (6,) and splits.train.num_classes == 3
    x, y = collect(splits.train)
    np.testing.assert_array_equal(x, np.concatenate([xa, xb]))
    np.testing.assert_array_equal(y, np.concatenate([ya, yb]))
    x, y = collect(splits.val)
    np.testing.assert_array_equal(y, yv.argmax(1))
    assert splits.test is None
    only = load_dataset("hdf5", path=tmp_path / "train.txt")
    assert len(only.train) == 12


def test_hdf5_errors(tmp_path):
    _h5(tmp_path / "a.h5", np.zeros((3, 2)), np.array([0, 1, 2]), features="X")
    (tmp_path / "train.txt").write_text("a.h5\n")
    with pytest.raises(DatasetError,
                       match=r"a.h5: no dataset 'features'; it has \['X', 'labels'\]"):
        load_dataset("hdf5", path=tmp_path / "train.txt")
    _h5(tmp_path / "a.h5", np.zeros((3, 2)), np.array([0, 1]))
    with pytest.raises(DatasetError, match=r"a.h5: 3 samples .* but 2 labels"):
        load_dataset("hdf5", path=tmp_path / "train.txt")
    _h5(tmp_path / "a.h5", np.zeros((3, 2)), np.array([0, 1, 5]))
    with pytest.raises(DatasetError, match=r"a.h5: label 5 out of range \[0, 3\)"):
        load_dataset("hdf5", path=tmp_path / "train.txt", num_classes=3)


def test_digits_offline_deterministic():
    a = load_dataset("digits")
    b = load_dataset("digits")
    assert a.train.input_shape == (1, 8, 8) and len(a.train) + len(a.test) == 1797
    assert len(a.test) == 359
    xa, ya = collect(a.test)
    xb, yb = collect(b.test)
    np.testing.assert_array_equal(xa, xb)
    assert xa.min() == 0.0 and xa.max() == 1.0


def test_synthetic_is_learnable():
    splits = load_dataset("synthetic", input_shape=(2, 5, 5), num_classes=4, num_samples=400,
                          seed=3)
    x, y = collect(splits.train)
    assert x.shape == (400, 2, 5, 5) and splits.test is not None
    centroids = np.stack([x[y == c].mean(0) for c in range(4)]).reshape(4, -1)
    xt, yt = collect(splits.test)
    dist = ((xt.reshape(len(xt), 1, -1) - centroids[None]) ** 2).sum(-1)
    assert (dist.argmin(1) == yt).mean() > 0.9
    again = load_dataset("synthetic", input_shape=(2, 5, 5), num_classes=4, num_samples=400,
                         seed=3)
    np.testing.assert_array_equal(collect(again.train)[0], x)


def test_preprocess_options():
    x, y = make_images(10, shape=(3, 4, 4))
    ds = ArrayDataset(x, y)
    x01, _ = collect(ds)
    splits = load_dataset("synthetic", num_samples=8, input_shape=(3, 2, 2), one_hot=True,
                          dtype=np.float64, mean=(0.0, 1.0, 2.0), std=2.0)
    xs, ys = collect(splits.train)
    assert xs.dtype == np.float64 and ys.shape == (8, 10) and ys.dtype == np.float64
    assert np.all(ys.sum(1) == 1)
    raw = load_dataset("synthetic", num_samples=8, input_shape=(3, 2, 2), dtype=np.float64)
    xr, yr = collect(raw.train)
    np.testing.assert_allclose(xs, (xr - np.array([0, 1, 2.0])[None, :, None, None]) / 2)
    np.testing.assert_array_equal(ys.argmax(1), yr)
    np.testing.assert_allclose(x01, x / 255.0, rtol=1e-6)
    with pytest.raises(ValueError, match="mean has 2 values but .* 3 channels"):
        load_dataset("synthetic", input_shape=(3, 2, 2), mean=(0.1, 0.2))


def test_validation_split_takes_the_tail(tmp_path):
    write_mnist(tmp_path, n_train=50)
    full = load_dataset("mnist", path=tmp_path, download=False)
    splits = load_dataset("mnist", path=tmp_path, download=False, validation_split=0.2)
    assert len(splits.train) == 40 and len(splits.val) == 10
    xf, yf = collect(full.train)
    np.testing.assert_array_equal(collect(splits.val)[0], xf[40:])
    np.testing.assert_array_equal(collect(splits.train)[1], yf[:40])
    tv = load_dataset("mnist", path=tmp_path, download=False, test_as_validation=True)
    assert tv.val is tv.test


def test_load_dataset_argument_errors():
    with pytest.raises(ValueError, match=r"unknown dataset 'nope'.*'cifar10'.*'synthetic'"):
        load_dataset("nope")
    with pytest.raises(ValueError, match=r"no option\(s\) \['colour'\]"):
        load_dataset("synthetic", colour=True)
    with pytest.raises(ValueError, match="validation_split must be in"):
        load_dataset("synthetic", validation_split=1.5)
    with pytest.raises(ValueError, match="pass only one"):
        load_dataset("synthetic", validation_split=0.1, test_as_validation=True)
    with pytest.raises(ValueError, match="floating-point"):
        load_dataset("synthetic", dtype=np.int32)
    assert set(DATASETS) >= {"mnist", "fashion_mnist", "cifar10", "imagenet", "hdf5",
                             "digits", "synthetic"}


@pytest.mark.skipif(not FASHION.is_dir(), reason="Debian dataset-fashion-mnist not installed")
def test_real_fashion_mnist(monkeypatch, tmp_path):
    monkeypatch.delenv("DISTNN_DATA", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    t0 = time.perf_counter()
    splits = load_dataset("fashion_mnist", download=False)
    print(f"Fashion-MNIST loaded in {time.perf_counter() - t0:.2f} s")
    assert splits.train.x.shape == (60000, 1, 28, 28)
    assert splits.test.x.shape == (10000, 1, 28, 28)
    for ds in (splits.train, splits.test):
        assert ds.y.min() == 0 and ds.y.max() == 9
        assert np.bincount(ds.y).min() == len(ds) // 10  # classes are balanced
    with gzip.open(FASHION / "t10k-labels-idx1-ubyte.gz") as f:
        assert f.read(4) == b"\x00\x00\x08\x01"
    batch = next(splits.train.batches(64, seed=0))
    assert batch.x.shape == (64, 1, 28, 28) and 0.0 <= batch.x.min() <= batch.x.max() <= 1.0


def test_digits_read_from_sklearns_file_equal_its_loader():
    """The digits are read from the csv sklearn ships, without importing sklearn.datasets
    (1.5 s of CPU in every rank): the same images and targets as ``load_digits()``, and a
    fresh process that loads them does not import sklearn."""
    import subprocess
    import sys

    from sklearn.datasets import load_digits

    from distnn.data.readers import digits_arrays

    images, target = digits_arrays()
    ref = load_digits()
    assert images.shape == (1797, 8, 8) and images.dtype == ref.images.dtype
    np.testing.assert_array_equal(images, ref.images)
    np.testing.assert_array_equal(target, ref.target)
    code = ("import sys; from distnn.data import load_dataset; d = load_dataset('digits'); "
            "print(len(d.train) + len(d.test), 'sklearn' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["1797", "False"]
