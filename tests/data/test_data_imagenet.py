import struct
import zlib

import numpy as np
import pytest

from datafiles import jpeg_bytes, write_shards
from distnn.data import (DatasetError, convert_imagenet_tfrecords, crc32c, encode_example,
                         load_dataset, parse_example, read_tfrecord, write_tfrecord)
from distnn.data.imagenet import npz_header
from distnn.data.tfrecord import _crc_loop, masked_crc32c


def write_imagenet(root, base=0, compress=False):
    _, xtr, ytr = write_shards(root / "train", [6, 4, 5], num_classes=5, base=base,
                               compress=compress)
    _, xva, yva = write_shards(root / "val", [3, 2], num_classes=5, base=base, seed=1)
    return xtr, ytr, xva, yva


@pytest.mark.parametrize("base", [0, 1])
def test_npz_shards_round_trip(tmp_path, base):
    xtr, ytr, xva, yva = write_imagenet(tmp_path, base=base, compress=True)
    splits = load_dataset("imagenet", path=tmp_path, num_classes=5)
    assert splits.train.input_shape == (3, 4, 4) and len(splits.train) == 15
    assert splits.train.label_base == base and splits.val is None
    x, y = splits.train.arrays()
    np.testing.assert_allclose(x, xtr / 255.0, rtol=1e-6)
    np.testing.assert_array_equal(y, ytr - base)
    x, y = splits.test.arrays()
    np.testing.assert_array_equal(y, yva - base)
    for b in splits.train.batches(4, seed=2, rank=1, size=2):
        np.testing.assert_array_equal(b.y, ytr[b.indices] - base)


def test_npz_validation_split_and_label_base_option(tmp_path):
    write_imagenet(tmp_path, base=1)
    splits = load_dataset("imagenet", path=tmp_path, num_classes=5, validation_split=0.4,
                          label_base=1)
    assert len(splits.train) == 9 and len(splits.val) == 6
    with pytest.raises(DatasetError, match=r"train/shard-00\d.npz: labels span .*label_base=0"):
        load_dataset("imagenet", path=tmp_path, num_classes=5, label_base=0)


def test_npz_header_reads_no_data(tmp_path):
    x = np.zeros((5, 3, 8, 8), np.uint8)
    np.savez_compressed(tmp_path / "a.npz", x=x, y=np.arange(5))
    assert npz_header(tmp_path / "a.npz", "x") == ((5, 3, 8, 8), np.dtype(np.uint8))
    assert npz_header(tmp_path / "a.npz", "y")[0] == (5,)


@pytest.mark.parametrize("problem,match", [
    ("count", r"shard-001.npz: 4 images but 'y' has shape \(3,\)"),
    ("missing", r"shard-001.npz: no array 'y'"),
    ("garbage", r"shard-001.npz: not a readable npz shard"),
    ("dtype", r"shard-001.npz: 'x' is float32"),
    ("label", r"shard-001.npz: labels span \[0, 9\]"),
])
def test_npz_corruption(tmp_path, problem, match):
    write_imagenet(tmp_path)
    bad = tmp_path / "train" / "shard-001.npz"
    x = np.zeros((4, 3, 4, 4), np.uint8)
    if problem == "count":
        np.savez(bad, x=x, y=np.zeros(3, np.int64))
    elif problem == "missing":
        np.savez(bad, x=x)
    elif problem == "garbage":
        bad.write_bytes(b"PK\x03\x04 this is not a zip")
    elif problem == "dtype":
        np.savez(bad, x=x.astype(np.float32), y=np.zeros(4, np.int64))
    else:
        np.savez(bad, x=x, y=np.array([0, 1, 9, 2]))
    with pytest.raises(DatasetError, match=match):
        load_dataset("imagenet", path=tmp_path, num_classes=5)


def test_imagenet_missing_says_how_to_convert(tmp_path):
    with pytest.raises(DatasetError, match=r"(?s)looked in:.*convert-imagenet"):
        load_dataset("imagenet", path=tmp_path)


# -- TFRecord --------------------------------------------------------------------------------

def test_crc32c_known_values():
    assert crc32c(b"") == 0
    assert crc32c(b"123456789") == 0xE3069283
    assert crc32c(bytes(32)) == 0x8A9136AA  # RFC 3720 test vectors
    assert crc32c(b"\xff" * 32) == 0x62A8AB43
    data = np.random.default_rng(0).integers(0, 256, 70_001, dtype=np.uint8).tobytes()
    assert crc32c(data) == _crc_loop(0xFFFFFFFF, data) ^ 0xFFFFFFFF
    assert crc32c(data) != zlib.crc32(data)


def test_example_protobuf_round_trip():
    features = {"image/encoded": [b"\xff\xd8jpeg"], "image/class/label": [417],
                "neg": [-3, 2 ** 40], "f": [0.5, -2.0], "s": ["text"]}
    parsed = parse_example(encode_example(features))
    assert parsed == {"image/encoded": [b"\xff\xd8jpeg"], "image/class/label": [417],
                      "neg": [-3, 2 ** 40], "f": [0.5, -2.0], "s": [b"text"]}
    # unpacked int64 (wire type 0), as some writers emit
    unpacked = b"\x0a\x0b" + b"\x0a\x09\x0a\x01k\x12\x04\x1a\x02\x08\x07"
    assert parse_example(unpacked) == {"k": [7]}


def make_tfrecords(tmp_path):
    colors = [(255, 0, 0), (0, 255, 0), (0, 0, 255)]
    sizes = [(40, 30), (20, 50), (33, 33)]
    records = [encode_example({"image/encoded": jpeg_bytes(w, h, c),
                               "image/class/label": k + 1,
                               "image/format": b"JPEG"})
               for k, ((w, h), c) in enumerate(zip(sizes, colors))]
    files = [tmp_path / "train-00000-of-00002", tmp_path / "train-00001-of-00002"]
    write_tfrecord(files[0], records[:2])
    write_tfrecord(files[1], records[2:])
    return files, colors


def test_convert_imagenet_tfrecords(tmp_path):
    files, colors = make_tfrecords(tmp_path)
    assert len(list(read_tfrecord(files[0]))) == 2
    out = convert_imagenet_tfrecords(files, tmp_path / "npz", image_size=16, shard_size=2)
    assert [p.name for p in out] == ["train-00000.npz", "train-00001.npz"]
    with np.load(out[0]) as npz:
        x, y = npz["x"], npz["y"]
    assert x.shape == (2, 3, 16, 16) and x.dtype == np.uint8 and y.dtype == np.int64
    np.testing.assert_array_equal(y, [1, 2])
    for img, color in zip(x, colors):
        np.testing.assert_allclose(img.reshape(3, -1).mean(1), color, atol=3)
    convert_imagenet_tfrecords(files[1:], tmp_path / "npz", image_size=16, split="val")
    splits = load_dataset("imagenet", path=tmp_path / "npz", num_classes=3)
    assert splits.train.label_base == 1 and len(splits.train) == 3 and len(splits.test) == 1
    np.testing.assert_array_equal(splits.test.arrays()[1], [2])
    with pytest.raises(DatasetError, match="already holds .npz shards"):
        convert_imagenet_tfrecords(files, tmp_path / "npz", image_size=16)


def test_tfrecord_bad_crc(tmp_path):
    files, _ = make_tfrecords(tmp_path)
    data = bytearray(files[0].read_bytes())
    data[100] ^= 0x01
    files[0].write_bytes(bytes(data))
    with pytest.raises(DatasetError, match=r"train-00000-of-00002: record 0: data CRC mismatch"):
        convert_imagenet_tfrecords(files, tmp_path / "npz", image_size=8)
    data[100] ^= 0x01
    data[3] ^= 0x10  # length field
    files[0].write_bytes(bytes(data))
    with pytest.raises(DatasetError, match=r"record 0: length CRC mismatch"):
        list(read_tfrecord(files[0]))


def test_tfrecord_truncated_and_bad_payload(tmp_path):
    files, _ = make_tfrecords(tmp_path)
    files[1].write_bytes(files[1].read_bytes()[:-10])
    with pytest.raises(DatasetError, match=r"train-00001-of-00002: record 0: truncated"):
        list(read_tfrecord(files[1]))
    write_tfrecord(files[1], [encode_example({"image/class/label": 3})])
    with pytest.raises(DatasetError, match=r"record 0: needs features 'image/encoded'"):
        convert_imagenet_tfrecords(files[1:], tmp_path / "a", image_size=8)
    write_tfrecord(files[1], [encode_example({"image/encoded": b"not a jpeg",
                                              "image/class/label": 3})])
    with pytest.raises(DatasetError, match=r"record 0: cannot decode the image"):
        convert_imagenet_tfrecords(files[1:], tmp_path / "b", image_size=8)
    head = struct.pack("<Q", 3)
    files[1].write_bytes(head + struct.pack("<I", masked_crc32c(head)) + b"\x0a\xff\xff"
                         + struct.pack("<I", masked_crc32c(b"\x0a\xff\xff")))
    with pytest.raises(DatasetError, match=r"record 0: not a tf.train.Example"):
        convert_imagenet_tfrecords(files[1:], tmp_path / "c", image_size=8)
