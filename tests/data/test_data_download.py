"""The real download path (urlopen -> temp file -> checksum -> atomic rename) over file:// URLs."""
import hashlib
import io
import tarfile

import numpy as np
import pytest

from datafiles import write_cifar, write_mnist
from distnn.data import DatasetError, Remote, download, load_dataset
from distnn.data import fetch, readers


@pytest.fixture
def places(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("DISTNN_DATA", str(tmp_path / "env"))
    monkeypatch.setattr(fetch, "SYSTEM_ROOT", tmp_path / "system")
    return tmp_path


def sha256(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_download_verifies_and_renames(tmp_path):
    src = tmp_path / "src.bin"
    src.write_bytes(b"payload" * 1000)
    dest = tmp_path / "out" / "file.bin"
    got = download(Remote(src.as_uri(), ("sha256", sha256(src))), dest)
    assert got == dest and dest.read_bytes() == src.read_bytes()
    assert [p.name for p in dest.parent.iterdir()] == ["file.bin"]


def test_download_rejects_checksum_mismatch(tmp_path):
    src = tmp_path / "src.bin"
    src.write_bytes(b"payload")
    dest = tmp_path / "out" / "file.bin"
    with pytest.raises(DatasetError, match=r"sha256 of the download is [0-9a-f]{64}, expected 0+"):
        download(Remote(src.as_uri(), ("sha256", "0" * 64)), dest)
    assert not dest.exists()
    assert list(dest.parent.iterdir()) == []  # the temp file is gone too
    dest.write_bytes(b"old")
    with pytest.raises(DatasetError):
        download(Remote(src.as_uri(), ("md5", "0" * 32)), dest)
    assert dest.read_bytes() == b"old"  # a failed download never replaces the file


def _mirror(monkeypatch, name, folder, algorithm="sha256"):
    remotes = [Remote((folder / f).as_uri(), (algorithm, hashlib.new(algorithm,
                      (folder / f).read_bytes()).hexdigest()))
               for f in sorted(p.name for p in folder.iterdir())]
    monkeypatch.setitem(readers.REMOTES, name, remotes)
    return remotes


def test_mnist_downloads_into_data_dir(places, monkeypatch):
    ref = write_mnist(places / "mirror", gz=True)
    _mirror(monkeypatch, "mnist", places / "mirror")
    splits = load_dataset("mnist", normalize=False)
    target = places / "env" / "mnist"
    assert sorted(p.name for p in target.iterdir()) == sorted(
        p.name for p in (places / "mirror").iterdir())
    x = next(splits.train.batches(100, shuffle=False)).x
    np.testing.assert_array_equal(x[:, 0], ref["x_train"])
    (places / "mirror" / "t10k-images-idx3-ubyte.gz").unlink()  # now served from the cache
    assert len(load_dataset("mnist").test) == 20


def test_download_checksum_mismatch_fails_the_load(places, monkeypatch):
    write_mnist(places / "mirror", gz=True)
    remotes = _mirror(monkeypatch, "mnist", places / "mirror")
    remotes[1] = Remote(remotes[1].url, ("sha256", "f" * 64))
    with pytest.raises(DatasetError,
                       match=r"(?s)looked in:.*downloading into .* failed: .*expected f+"):
        load_dataset("mnist")
    assert not any(p.name.endswith(".part") for p in (places / "env" / "mnist").iterdir())


def test_unreachable_mirror_lists_places(places, monkeypatch):
    monkeypatch.setitem(readers.REMOTES, "fashion_mnist",
                        [Remote((places / "nowhere.gz").as_uri(), None)])
    with pytest.raises(DatasetError) as err:
        load_dataset("fashion_mnist")
    msg = str(err.value)
    assert str(places / "env" / "fashion-mnist") in msg
    assert str(places / "system" / "fashion_mnist") in msg
    assert "apt-get install dataset-fashion-mnist" in msg and "failed" in msg


def test_cifar10_download_extracts_the_archive(places, monkeypatch):
    ref = write_cifar(places / "build" / "cifar-10-batches-bin")
    archive = places / "mirror" / "cifar-10-binary.tar.gz"
    archive.parent.mkdir()
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(places / "build" / "cifar-10-batches-bin", arcname="cifar-10-batches-bin")
        info = tarfile.TarInfo("cifar-10-batches-bin/readme.html")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"hi"))
    _mirror(monkeypatch, "cifar10", places / "mirror", algorithm="md5")
    splits = load_dataset("cifar10", normalize=False)
    folder = places / "env" / "cifar10"
    assert sorted(p.name for p in folder.iterdir()) == ["cifar-10-batches-bin"]
    assert not (folder / "cifar-10-batches-bin" / "readme.html").exists()
    np.testing.assert_array_equal(next(splits.test.batches(7, shuffle=False)).x, ref["x_test"])


def test_published_checksums_are_well_formed():
    for remotes in readers.REMOTES.values():
        for remote in remotes:
            algorithm, digest = remote.checksum
            assert len(digest) == hashlib.new(algorithm).digest_size * 2
            assert remote.url.startswith(("http://", "https://"))
