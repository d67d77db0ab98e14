"""TFRecord files of ``tf.train.Example`` without TensorFlow, and the ImageNet converter.

A TFRecord record is ``uint64 length, uint32 masked crc32c(length), data, uint32 masked
crc32c(data)`` (little-endian). The payload is a protobuf ``Example``; only the wire format
of Example/Features/Feature/BytesList/FloatList/Int64List is implemented here.
"""
from __future__ import annotations

import io
import os
import struct
from pathlib import Path
from typing import Iterable, Iterator, Mapping, Sequence

import numpy as np

from ..fileio import atomic_open
from .base import DatasetError

_POLY = 0x82F63B78  # Castagnoli, reflected
_MASK_DELTA = 0xA282EAD8
_M32 = 0xFFFFFFFF


def _byte_table() -> np.ndarray:
    table = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        table = np.where(table & 1, (table >> 1) ^ np.uint32(_POLY), table >> 1).astype(np.uint32)
    return table


_TABLE = _byte_table()
_TABLE_LIST = _TABLE.tolist()
_SHIFT_TABLES: dict[int, list[list[int]]] = {}


def _crc_loop(crc: int, data: bytes) -> int:
    table = _TABLE_LIST
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc


def _shift_tables(nbytes: int) -> list[list[int]]:
    """Byte tables of the linear map 'feed ``nbytes`` zero bytes' on a CRC register."""
    if nbytes not in _SHIFT_TABLES:
        reg = np.uint32(1) << np.arange(32, dtype=np.uint32)  # image of every basis bit
        for _ in range(nbytes):
            reg = _TABLE[reg & 0xFF] ^ (reg >> 8)
        values = np.arange(256, dtype=np.uint32)
        tables = []
        for j in range(4):
            t = np.zeros(256, dtype=np.uint32)
            for bit in range(8):
                t ^= np.where((values >> bit) & 1, reg[8 * j + bit], 0).astype(np.uint32)
            tables.append(t.tolist())
        _SHIFT_TABLES[nbytes] = tables
    return _SHIFT_TABLES[nbytes]


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli) of ``data``, e.g. ``crc32c(b"123456789") == 0xE3069283``.

    Long inputs are cut into K rows of L bytes whose CRCs advance together in numpy and
    are then chained with a precomputed 'shift by L bytes' map (CRCs are linear over GF(2)).
    Starting from 0xFFFFFFFF equals starting from 0 with the first 4 bytes complemented, and
    from 0, leading zero bytes leave the CRC unchanged: so the front is zero-padded.
    """
    n = len(data)
    if n < 4096:
        return _crc_loop(_M32, data) ^ _M32
    row = 1 << max(6, int(round(np.log2(np.sqrt(n / 5)))))
    rows = -(-n // row)
    buf = np.zeros(rows * row, dtype=np.uint8)
    buf[rows * row - n:] = np.frombuffer(data, dtype=np.uint8)
    buf[rows * row - n:rows * row - n + 4] ^= 0xFF
    cols = buf.reshape(rows, row).T.copy()
    reg = np.zeros(rows, dtype=np.uint32)
    for col in cols:
        reg = _TABLE[(reg ^ col) & 0xFF] ^ (reg >> 8)
    t0, t1, t2, t3 = _shift_tables(row)
    crc = 0
    for part in reg.tolist():
        crc = t0[crc & 0xFF] ^ t1[(crc >> 8) & 0xFF] ^ t2[(crc >> 16) & 0xFF] ^ t3[crc >> 24] ^ part
    return crc ^ _M32


def masked_crc32c(data: bytes) -> int:
    crc = crc32c(data)
    return ((((crc >> 15) | (crc << 17)) & _M32) + _MASK_DELTA) & _M32


def read_tfrecord(path: str | os.PathLike, *, verify: bool = True) -> Iterator[bytes]:
    """Yield the records of a TFRecord file, checking both CRCs of each when ``verify``."""
    path = Path(path)
    with open(path, "rb") as f:
        index = 0
        left = os.fstat(f.fileno()).st_size
        while head := f.read(12):
            if len(head) < 12:
                raise DatasetError(f"{path}: record {index}: truncated header; the file is cut "
                                   f"short, copy or convert it again")
            length, length_crc = struct.unpack("<QI", head)
            if verify and masked_crc32c(head[:8]) != length_crc:
                raise DatasetError(f"{path}: record {index}: length CRC mismatch; the file is "
                                   f"corrupt or not a TFRecord file")
            left -= 12
            if length + 4 > left:  # before reading: a corrupt length may be huge
                raise DatasetError(f"{path}: record {index}: truncated ({left} bytes left for "
                                   f"a record of {length}); the file is cut short, copy it "
                                   "again")
            left -= length + 4
            data, footer = f.read(length), f.read(4)
            if len(data) < length or len(footer) < 4:
                raise DatasetError(f"{path}: record {index}: truncated ({len(data)} of {length} "
                                   f"bytes); the file is cut short, copy it again")
            if verify and masked_crc32c(data) != struct.unpack("<I", footer)[0]:
                raise DatasetError(f"{path}: record {index}: data CRC mismatch; the file is "
                                   f"corrupt, copy it again")
            yield data
            index += 1


def write_tfrecord(path: str | os.PathLike, records: Iterable[bytes]) -> None:
    """Write records as a TFRecord file (used by tests and to make small fixtures)."""
    with open(path, "wb") as f:
        for data in records:
            head = struct.pack("<Q", len(data))
            f.write(head + struct.pack("<I", masked_crc32c(head)) + data
                    + struct.pack("<I", masked_crc32c(data)))


class ProtobufError(ValueError):
    """Malformed protobuf wire data."""


def _varint(buf, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf):
            raise ProtobufError("truncated varint")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift >= 70:
            raise ProtobufError("varint longer than 10 bytes")


def _fields(buf) -> Iterator[tuple[int, int, object]]:
    """(field number, wire type, value): int for varints, memoryview for the rest."""
    buf, pos = memoryview(buf), 0
    sizes = {1: 8, 5: 4}
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire in (1, 2, 5):
            if wire == 2:
                size, pos = _varint(buf, pos)
            else:
                size = sizes[wire]
            if pos + size > len(buf):
                raise ProtobufError(f"field {number} runs past the end of the message")
            value, pos = buf[pos:pos + size], pos + size
        else:
            raise ProtobufError(f"unsupported wire type {wire} (field {number})")
        yield number, wire, value


def _signed64(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _parse_feature(buf) -> list:
    values: list = []
    for kind, _, payload in _fields(buf):
        for number, wire, value in _fields(payload):
            if number != 1:
                continue
            if kind == 1 and wire == 2:
                values.append(bytes(value))
            elif kind == 2 and wire == 2:
                if len(value) % 4:
                    raise ProtobufError(f"a float list of {len(value)} bytes, not a multiple "
                                        "of 4")
                values.extend(np.frombuffer(value, "<f4").tolist())
            elif kind == 2 and wire == 5:
                values.append(float(np.frombuffer(value, "<f4")[0]))
            elif kind == 3 and wire == 0:
                values.append(_signed64(value))
            elif kind == 3 and wire == 2:
                pos = 0
                while pos < len(value):
                    v, pos = _varint(value, pos)
                    values.append(_signed64(v))
    return values


def parse_example(data: bytes) -> dict[str, list]:
    """Decode a serialized ``tf.train.Example`` into ``{name: list of bytes/float/int}``."""
    features: dict[str, list] = {}
    for number, wire, message in _fields(data):
        if number != 1 or wire != 2:
            continue
        for entry_number, entry_wire, entry in _fields(message):
            if entry_number != 1 or entry_wire != 2:
                continue
            key, feature = "", b""
            for n, w, v in _fields(entry):
                if n == 1 and w == 2:
                    key = bytes(v).decode("utf-8")
                elif n == 2 and w == 2:
                    feature = v
            features[key] = _parse_feature(feature)
    return features


def _enc_varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _delimited(number: int, payload: bytes) -> bytes:
    return _enc_varint(number << 3 | 2) + _enc_varint(len(payload)) + payload


def encode_example(features: Mapping[str, object]) -> bytes:
    """Serialize ``{name: bytes | int | float | list of one kind}`` as a ``tf.train.Example``."""
    entries = []
    for name, values in features.items():
        values = list(values) if isinstance(values, (list, tuple, np.ndarray)) else [values]
        if all(isinstance(v, (bytes, str)) for v in values):
            items = b"".join(_delimited(1, v.encode() if isinstance(v, str) else v)
                             for v in values)
            feature = _delimited(1, items)
        elif all(isinstance(v, (int, np.integer)) for v in values):
            feature = _delimited(3, _delimited(1, b"".join(_enc_varint(int(v)) for v in values)))
        elif all(isinstance(v, (int, float, np.number)) for v in values):
            feature = _delimited(2, _delimited(1, np.asarray(values, "<f4").tobytes()))
        else:
            raise ValueError(f"feature {name!r}: values must be all bytes/str, all ints or all "
                             f"floats, got {values!r:.80}")
        entries.append(_delimited(1, _delimited(1, name.encode()) + _delimited(2, feature)))
    return _delimited(1, b"".join(entries))


def decode_image(data: bytes, image_size: int) -> np.ndarray:
    """Decode an encoded image, resize its short side to ``image_size``, center-crop: (3, S, S)."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as img:
            img.draft("RGB", (image_size, image_size))  # JPEG DCT downscale, not below the size
            img = img.convert("RGB")
    except Image.DecompressionBombError as exc:  # a header declaring billions of pixels
        raise OSError(str(exc)) from None
    w, h = img.size
    scale = image_size / min(w, h)
    size = (max(image_size, round(w * scale)), max(image_size, round(h * scale)))
    img = img.resize(size, Image.Resampling.BILINEAR)
    left, top = (size[0] - image_size) // 2, (size[1] - image_size) // 2
    img = img.crop((left, top, left + image_size, top + image_size))
    return np.asarray(img, dtype=np.uint8).transpose(2, 0, 1)


def _write_shard(path: Path, xs: list[np.ndarray], ys: list[int], compress: bool) -> None:
    save = np.savez_compressed if compress else np.savez
    with atomic_open(path) as f:
        save(f, x=np.stack(xs), y=np.asarray(ys, dtype=np.int64))


def convert_imagenet_tfrecords(tfrecord_files: Sequence[str | os.PathLike],
                               out_dir: str | os.PathLike, *, image_size: int = 224,
                               shard_size: int = 1024, split: str = "train",
                               compress: bool = False) -> list[Path]:
    """Convert ImageNet TFRecords (``image/encoded`` JPEG, ``image/class/label``) to NPZ shards.

    Writes ``out_dir/<split>/<split>-00000.npz`` ... with ``x`` uint8 (N, 3, S, S) and ``y``
    int64 labels as stored (TF-slim's are 1-based; ``load_dataset("imagenet")`` detects
    that). Records are verified (CRCs), images resized (short side) and center-cropped.
    Returns the shard paths.

    Example:
        convert_imagenet_tfrecords(sorted(glob.glob("tf/train-*")), "imagenet", split="train")
    """
    if image_size < 1 or shard_size < 1:
        raise ValueError(f"image_size and shard_size must be >= 1, got {image_size}, {shard_size}")
    folder = Path(out_dir) / split
    if any(folder.glob("*.npz")):
        raise DatasetError(f"{folder} already holds .npz shards; remove them or choose another "
                           f"out_dir, so that old and new shards do not mix")
    written: list[Path] = []
    made = [p for p in (folder, *folder.parents) if not p.exists()]
    try:
        _convert(tfrecord_files, folder, split, image_size, shard_size, compress, written)
    except BaseException:  # a failed conversion leaves nothing behind, not half the shards
        for path in written:
            path.unlink(missing_ok=True)
        for path in made:
            if path.is_dir() and not any(path.iterdir()):
                path.rmdir()
        raise
    return written


def _convert(tfrecord_files, folder: Path, split: str, image_size: int, shard_size: int,
             compress: bool, written: list[Path]) -> None:
    xs: list[np.ndarray] = []
    ys: list[int] = []

    def flush():
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{split}-{len(written):05d}.npz"
        _write_shard(path, xs, ys, compress)
        written.append(path)
        xs.clear()
        ys.clear()

    for file in tfrecord_files:
        for index, record in enumerate(read_tfrecord(file)):
            where = f"{file}: record {index}"
            try:
                example = parse_example(record)
            except (ProtobufError, UnicodeDecodeError, ValueError) as exc:
                raise DatasetError(f"{where}: not a tf.train.Example ({exc})") from exc
            encoded, label = example.get("image/encoded"), example.get("image/class/label")
            if not encoded or not label:
                raise DatasetError(f"{where}: needs features 'image/encoded' and "
                                   f"'image/class/label', has {sorted(example)}")
            if not isinstance(encoded[0], bytes) or not isinstance(label[0], int) \
                    or not 0 <= label[0] < 2**31:
                raise DatasetError(f"{where}: 'image/encoded' must be the image's bytes and "
                                   "'image/class/label' a class number, got "
                                   f"{type(encoded[0]).__name__} and {label[0]!r:.40}")
            try:
                xs.append(decode_image(encoded[0], image_size))
            except (OSError, ValueError) as exc:
                raise DatasetError(f"{where}: cannot decode the image ({exc})") from exc
            ys.append(int(label[0]))
            if len(xs) == shard_size:
                flush()
    if xs:
        flush()
