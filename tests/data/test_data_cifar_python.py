"""CIFAR-10's Python version (cifar-10-batches-py, Needle's and torchvision's format): files
written as the published ones are, read through load_dataset and the distnn command's
dataset names; the archive, the checksummed download, and refusals of bad files."""
import hashlib
import pickle
import tarfile

import numpy as np
import pytest

from datafiles import write_cifar_python
from distnn.data import DatasetError, Remote, load_dataset, read_cifar_pickle
from distnn.data import cifar_python, fetch


def _check(splits, ref):
    x = next(splits.train.batches(35, shuffle=False)).x
    np.testing.assert_array_equal(x, ref["x_train"])
    np.testing.assert_array_equal(next(splits.train.batches(35, shuffle=False)).y,
                                  ref["y_train"])
    np.testing.assert_array_equal(next(splits.test.batches(7, shuffle=False)).x, ref["x_test"])
    assert splits.train.input_shape == (3, 32, 32) and splits.train.num_classes == 10


@pytest.mark.parametrize("py2", [True, False], ids=["python2-pickles", "python3-pickles"])
def test_python_version_round_trip_under_both_names(tmp_path, py2):
    ref = write_cifar_python(tmp_path / "data" / "cifar-10-batches-py", py2=py2)
    for name, path in [("cifar10_python", tmp_path / "data"),
                       ("cifar10_python", tmp_path / "data" / "cifar-10-batches-py"),
                       # Needle's path, given to the usual dataset name
                       ("cifar10", tmp_path / "data" / "cifar-10-batches-py"),
                       ("cifar10", tmp_path / "data")]:
        _check(load_dataset(name, path=path, normalize=False, download=False), ref)
    # the channels: the first 1024 values of a row are red, as published
    x, _ = read_cifar_pickle(tmp_path / "data" / "cifar-10-batches-py" / "test_batch")
    raw = pickle.loads((tmp_path / "data" / "cifar-10-batches-py" / "test_batch")
                       .read_bytes(), encoding="bytes")[b"data"]
    np.testing.assert_array_equal(x[:, 0].reshape(len(x), -1), raw[:, :1024])
    np.testing.assert_array_equal(x[:, 2, 31, 31], raw[:, 3071])


def test_python_version_from_the_archive(tmp_path):
    ref = write_cifar_python(tmp_path / "cifar-10-batches-py", per_file=7)
    archive = tmp_path / "cifar-10-python.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(tmp_path / "cifar-10-batches-py", arcname="cifar-10-batches-py")
    _check(load_dataset("cifar10", path=archive, normalize=False), ref)
    _check(load_dataset("cifar10_python", path=archive, normalize=False), ref)


def test_python_version_download_is_checksummed(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("DISTNN_DATA", str(tmp_path / "env"))
    monkeypatch.setattr(fetch, "SYSTEM_ROOT", tmp_path / "system")
    ref = write_cifar_python(tmp_path / "build" / "cifar-10-batches-py")
    archive = tmp_path / "mirror" / "cifar-10-python.tar.gz"
    archive.parent.mkdir()
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(tmp_path / "build" / "cifar-10-batches-py", arcname="cifar-10-batches-py")
    md5 = hashlib.md5(archive.read_bytes()).hexdigest()
    monkeypatch.setattr(cifar_python, "REMOTES", [Remote(archive.as_uri(), ("md5", "0" * 32))])
    with pytest.raises(DatasetError, match="md5 of the download is"):
        load_dataset("cifar10_python")
    monkeypatch.setattr(cifar_python, "REMOTES", [Remote(archive.as_uri(), ("md5", md5))])
    _check(load_dataset("cifar10_python", normalize=False), ref)
    folder = tmp_path / "env" / "cifar10_python"
    assert sorted(p.name for p in folder.iterdir()) == ["cifar-10-batches-py"]


def test_published_python_version_checksum():
    remote, = cifar_python.REMOTES
    assert remote.url == "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
    assert remote.checksum == ("md5", "c58f30108f718f92721af3b95e74349a")


class _Evil:
    def __reduce__(self):
        return (print, ("this must never run",))


def test_python_version_refuses_bad_files(tmp_path, capsys):
    folder = tmp_path / "cifar-10-batches-py"
    write_cifar_python(folder)
    batch = folder / "data_batch_3"
    good = batch.read_bytes()
    batch.write_bytes(good[:len(good) // 2])
    with pytest.raises(DatasetError, match=r"data_batch_3: not a pickled CIFAR-10 batch"):
        load_dataset("cifar10", path=folder, download=False)
    batch.write_bytes(pickle.dumps({b"data": _Evil(), b"labels": []}, protocol=2))
    with pytest.raises(DatasetError, match=r"refers to \w+\.print, which a CIFAR-10 batch never"):
        load_dataset("cifar10", path=folder, download=False)
    assert "must never run" not in capsys.readouterr().out
    batch.write_bytes(pickle.dumps({b"data": np.zeros((2, 3072), np.uint8),
                                    b"fine_labels": [1, 2]}, protocol=2))
    with pytest.raises(DatasetError, match=r"no \['labels'\] entry.*CIFAR-100"):
        load_dataset("cifar10", path=folder, download=False)
    batch.write_bytes(pickle.dumps({b"data": np.zeros((2, 3000), np.uint8),
                                    b"labels": [1, 2]}, protocol=2))
    with pytest.raises(DatasetError, match=r"expected uint8 \(N, 3072\)"):
        load_dataset("cifar10", path=folder, download=False)
    batch.write_bytes(pickle.dumps({b"data": np.zeros((2, 3072), np.uint8),
                                    b"labels": [1, 10]}, protocol=2))
    with pytest.raises(DatasetError, match=r"label 10 out of range \[0, 10\)"):
        load_dataset("cifar10", path=folder, download=False)
