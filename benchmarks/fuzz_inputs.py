"""The inputs of the fuzzing campaign (issue 44): a small valid file of every format distnn
reads, and the ways to break one (``benchmarks/fuzz.py`` runs them).

Every seed is written by ``SEEDS[name](folder)`` into an empty folder; the mutations are
hypothesis strategies of callables ``mutate(path)`` that change the file in place and
return the name of their kind (the table's "kind" column). ``Trap`` is the file content
that WOULD run code if it were unpickled: it creates the file ``MARKER`` next to it.
"""
from __future__ import annotations

import gzip
import io
import json
import os
import pickle
import shutil
import struct
import zipfile
from pathlib import Path
from typing import Callable

import numpy as np
from hypothesis import strategies as st

MARKER = "PWNED"  # created by a Trap that was unpickled: code ran from a data file
HUGE = 2**40  # a declared dimension no file of these tests holds


class Trap:
    """Unpickled, runs ``open(folder/PWNED, 'w')`` (arbitrary code: exec of a string)."""

    def __init__(self, folder: str | os.PathLike):
        self.folder = os.fspath(folder)

    def __reduce__(self):
        target = os.path.join(self.folder, MARKER)
        return (exec, (f"open({target!r}, 'w').close()",))


def trap_pickle(folder) -> bytes:
    return pickle.dumps({b"data": Trap(folder), b"labels": Trap(folder)}, protocol=2)


def trap_array(folder) -> np.ndarray:
    out = np.empty(2, dtype=object)
    out[0], out[1] = Trap(folder), 1
    return out


# -- seeds ------------------------------------------------------------------------------------
def _idx(array: np.ndarray) -> bytes:
    head = struct.pack(">BBBB", 0, 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I",
                                                                         *array.shape)
    return head + array.astype(np.uint8).tobytes()


def seed_idx(folder: Path) -> list[str]:
    rng = np.random.default_rng(0)
    for prefix, n in (("train", 8), ("t10k", 4)):
        (folder / f"{prefix}-images-idx3-ubyte").write_bytes(
            _idx(rng.integers(0, 256, (n, 28, 28))))
        (folder / f"{prefix}-labels-idx1-ubyte").write_bytes(_idx(rng.integers(0, 10, n)))
    (folder / "t10k-labels-idx1-ubyte.gz").write_bytes(
        gzip.compress((folder / "t10k-labels-idx1-ubyte").read_bytes()))
    (folder / "t10k-labels-idx1-ubyte").unlink()
    return sorted(p.name for p in folder.iterdir())


CIFAR_BIN = [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]
CIFAR_PY = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]


def seed_cifar_bin(folder: Path) -> list[str]:
    rng = np.random.default_rng(1)
    for name in CIFAR_BIN:
        records = rng.integers(0, 256, (2, 1 + 3072)).astype(np.uint8)
        records[:, 0] %= 10
        (folder / name).write_bytes(records.tobytes())
    return CIFAR_BIN


def cifar_batch(rng, n: int = 2) -> dict:
    return {b"batch_label": b"x", b"data": rng.integers(0, 256, (n, 3072)).astype(np.uint8),
            b"labels": [int(v) for v in rng.integers(0, 10, n)]}


def seed_cifar_python(folder: Path) -> list[str]:
    rng = np.random.default_rng(2)
    sub = folder / "cifar-10-batches-py"
    sub.mkdir()
    for name in CIFAR_PY:
        (sub / name).write_bytes(pickle.dumps(cifar_batch(rng), protocol=2))
    return [f"cifar-10-batches-py/{n}" for n in CIFAR_PY]


def seed_imagenet(folder: Path) -> list[str]:
    rng = np.random.default_rng(3)
    names = []
    for split in ("train", "val"):
        (folder / split).mkdir()
        for k in range(2 if split == "train" else 1):
            name = f"{split}/{split}-{k:05d}.npz"
            np.savez(folder / name, x=rng.integers(0, 256, (4, 3, 8, 8)).astype(np.uint8),
                     y=rng.integers(0, 10, 4).astype(np.int64))
            names.append(name)
    return names


def seed_hdf5(folder: Path) -> list[str]:
    import h5py
    rng = np.random.default_rng(4)
    for name in ("a.h5", "b.h5"):
        with h5py.File(folder / name, "w") as h5:
            h5["features"] = rng.standard_normal((6, 1, 8, 8)).astype(np.float32)
            h5["labels"] = rng.integers(0, 10, 6)
    (folder / "train.txt").write_text("a.h5\n")
    (folder / "val.txt").write_text("b.h5\n")
    return ["a.h5", "b.h5", "train.txt", "val.txt"]


def _jpeg(rng) -> bytes:
    from PIL import Image
    out = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (10, 12, 3)).astype(np.uint8)).save(out, "JPEG")
    return out.getvalue()


def seed_tfrecord(folder: Path) -> list[str]:
    from distnn.data import encode_example, write_tfrecord
    rng = np.random.default_rng(5)
    write_tfrecord(folder / "train-00000", [
        encode_example({"image/encoded": _jpeg(rng), "image/class/label": int(k + 1)})
        for k in range(3)])
    return ["train-00000"]


def seed_text(name: str, text: str) -> Callable[[Path], list[str]]:
    def seed(folder: Path) -> list[str]:
        (folder / name).write_text(text)
        return [name]
    return seed


TOML = """\
learning_rate = 0.01
batch_size = 8
[optimizer]
momentum = 0.9
nesterov = false
metrics = ["categorical_accuracy"]
"""
SPACE = """\
[space]
learning_rate = {log_uniform = [1e-4, 1e-1]}
momentum = {uniform = [0.5, 0.99]}
batch_size = {int = [4, 16]}
optimizer = {choice = ["sgd", "adam"]}
"""
SESSION = """\
# Theano-MPI session
RULE=BSP
SIZE=2
DEVICES=(cuda0 cuda1)
BSP_SYNC_TYPE=cdd
BSP_EXCH_STRATEGY=nccl32
learning_rate=0.01
"""


# -- mutations --------------------------------------------------------------------------------
Mutate = Callable[[Path], str]


def _bytes_mutation(kind: str, change: Callable[[bytes], bytes]) -> Mutate:
    def mutate(path: Path) -> str:
        path.write_bytes(change(path.read_bytes()))
        return kind
    return mutate


@st.composite
def byte_mutations(draw) -> Mutate:
    """A format-blind change of a file's bytes, or of the file itself."""
    kind = draw(st.sampled_from(["flip", "truncate", "zero", "append", "splice", "random",
                                 "directory", "missing"]))
    if kind == "flip":
        spots = draw(st.lists(st.tuples(st.floats(0, 1, exclude_max=True),
                                        st.integers(1, 255)), min_size=1, max_size=8))

        def flip(raw: bytes) -> bytes:
            out = bytearray(raw)
            for where, value in spots:
                if out:
                    out[int(where * len(out))] ^= value
            return bytes(out)
        return _bytes_mutation("byte flips", flip)
    if kind == "truncate":
        keep = draw(st.floats(0, 1, exclude_max=True))
        return _bytes_mutation("truncated", lambda raw: raw[:int(keep * len(raw))])
    if kind == "zero":
        return _bytes_mutation("zero-length", lambda raw: b"")
    if kind == "append":
        extra = draw(st.binary(min_size=1, max_size=64))
        return _bytes_mutation("trailing bytes", lambda raw: raw + extra)
    if kind == "splice":
        a, b = draw(st.floats(0, 1)), draw(st.floats(0, 1))
        return _bytes_mutation("spliced", lambda raw: raw[:int(a * len(raw))]
                               + raw[int(b * len(raw)):])
    if kind == "random":
        noise = draw(st.binary(min_size=0, max_size=256))
        return _bytes_mutation("random bytes", lambda raw: noise)

    def replace(path: Path) -> str:
        path.unlink()
        if kind == "directory":
            path.mkdir()
            return "directory instead of file"
        return "missing file"
    return replace


def npz_rewrite(change: Callable[[dict], dict], kind: str) -> Mutate:
    """Rewrite an .npz file's arrays through ``change`` (a dict of arrays)."""
    def mutate(path: Path) -> str:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        arrays = change(arrays)
        with open(path, "wb") as f:
            np.savez(f, **arrays)
        return kind
    return mutate


def huge_npy_header(path: Path, key: str | None = None) -> str:
    """Rewrite one .npy entry of an .npz so that its header declares a huge shape."""
    with zipfile.ZipFile(path) as z:
        entries = {n: z.read(n) for n in z.namelist()}
    name = key + ".npy" if key and key + ".npy" in entries else sorted(entries)[0]
    raw = io.BytesIO(entries[name])
    version = np.lib.format.read_magic(raw)
    read = (np.lib.format.read_array_header_1_0 if version == (1, 0)
            else np.lib.format.read_array_header_2_0)
    shape, fortran, dtype = read(raw)
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": np.lib.format.dtype_to_descr(dtype),
                                                  "fortran_order": fortran,
                                                  "shape": (HUGE,) + tuple(shape)[1:]})
    entries[name] = header.getvalue() + raw.read()
    with zipfile.ZipFile(path, "w") as z:
        for n, data in entries.items():
            z.writestr(n, data)
    return "huge declared dims"


@st.composite
def npz_mutations(draw, keys: Callable[[dict], list[str]] | None = None) -> Mutate:
    """Format-aware changes of an .npz file of arrays (a shard, weights, a checkpoint)."""
    kind = draw(st.sampled_from(["nan", "inf", "dtype", "missing", "extra", "shape",
                                 "huge", "object", "empty", "scalar"]))
    pick = draw(st.floats(0, 1, exclude_max=True))

    def choose(arrays: dict) -> str:
        names = sorted(keys(arrays) if keys else arrays)
        names = names or sorted(arrays)
        return names[int(pick * len(names))]

    if kind == "huge":
        return lambda path: huge_npy_header(path)

    def change(arrays: dict) -> dict:
        key = choose(arrays)
        value = arrays[key]
        if kind in ("nan", "inf"):
            value = value.astype(np.float32) if value.dtype.kind in "biuf" else np.ones(3)
            if value.size:
                value.flat[0] = np.nan if kind == "nan" else -np.inf
        elif kind == "dtype":
            value = (value.astype(np.complex64) if value.dtype.kind in "biuf"
                     else np.arange(3, dtype=np.int8))
        elif kind == "missing":
            arrays.pop(key)
            return arrays
        elif kind == "extra":
            arrays[key + "_extra"] = np.zeros(3)
            return arrays
        elif kind == "shape":
            value = np.zeros((value.size + 1,), dtype=value.dtype)
        elif kind == "object":
            value = np.array(["a", None, 3], dtype=object)
        elif kind == "empty":
            value = value[:0]
        elif kind == "scalar":
            value = np.array("text")
        arrays[key] = value
        return arrays

    names = {"nan": "NaN", "inf": "inf", "dtype": "wrong dtype", "missing": "missing key",
             "extra": "extra key", "shape": "wrong shape", "object": "object array",
             "empty": "zero-length array", "scalar": "string instead of array"}
    return npz_rewrite(lambda arrays: change(arrays) if arrays else arrays, names[kind])


def copy_seed(seed: Path, folder: Path) -> None:
    shutil.copytree(seed, folder, dirs_exist_ok=True)


def json_dump(value) -> str:
    return json.dumps(value)
