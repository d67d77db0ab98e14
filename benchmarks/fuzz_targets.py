"""The readers of the fuzzing campaign (issue 44): for each, its seed files, the command
that reads them, the outputs that command may write, and its format-aware mutations.

A ``Target`` runs through the real ``distnn`` command in-process (``benchmarks/fuzz.py``):
mode "run" is ``distnn.cli.main.main(argv)``; "build" parses, validates and builds the run
without training (options and config files whose values may ask for hours of work);
"search" builds ``distnn search``'s configuration.
"""
from __future__ import annotations

import io
import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
from hypothesis import strategies as st

from . import fuzz_inputs as fi

QUIET = ["--quiet", "--parallel", "sequential", "--batch_size", "4", "--steps_per_epoch", "1",
         "--download", "false"]
TRAIN = [*QUIET, "--num_epochs", "1", "--evaluate", "false"]
SYNTH = ["--dataset", "synthetic", "--input_shape", "1,8,8", "--num_samples", "16"]


@dataclass
class Target:
    """One reader: ``seed(folder)`` writes valid files and returns those to mutate;
    ``argv`` reads them (paths relative to the folder); ``outputs``: what a successful
    command may write (prefixes); ``culprit``: words of which the error line must hold one
    besides the mutated file's name (the option that names it)."""

    name: str
    seed: Callable[[Path], list[str]]
    argv: list[str]
    mode: str = "run"
    mutations: Callable[[str], st.SearchStrategy] | None = None
    outputs: tuple[str, ...] = ()
    culprit: tuple[str, ...] = ()
    seed_argv: list[str] = field(default_factory=list)


# -- format-aware mutations -------------------------------------------------------------------
def _idx_mutations(name: str) -> st.SearchStrategy:
    def header(change) -> fi.Mutate:
        def mutate(path: Path) -> str:
            raw = bytearray(path.read_bytes() if not path.suffix == ".gz"
                            else __import__("gzip").decompress(path.read_bytes()))
            kind = change(raw)
            data = bytes(raw)
            path.write_bytes(data if path.suffix != ".gz" else __import__("gzip").compress(data))
            return kind
        return mutate

    def magic(raw):
        raw[2] = 0x0E
        return "wrong magic (dtype float64)"

    def ndim(raw):
        raw[3] = 4
        return "wrong magic (ndim)"

    def huge(raw):
        raw[4:8] = struct.pack(">I", 0xFFFFFFFF)
        if raw[3] == 3:
            raw[8:16] = struct.pack(">II", 0xFFFFFFFF, 0xFFFFFFFF)
        return "huge declared dims"

    def nan(raw):  # float32 images with a NaN: the header says so and the size matches
        n = struct.unpack(">I", raw[4:8])[0]
        values = np.full(n * (784 if raw[3] == 3 else 1), np.nan, ">f4")
        raw[2] = 0x0D
        raw[4 * (raw[3] + 1):] = values.tobytes()
        return "NaN (float idx)"

    def label(raw):
        if raw[3] == 1 and len(raw) > 8:
            raw[8] = 200
        return "label out of range"

    def short(raw):
        count = struct.unpack(">I", raw[4:8])[0]
        raw[4:8] = struct.pack(">I", count - 1)
        return "count mismatch"

    return st.sampled_from([header(f) for f in (magic, ndim, huge, nan, label, short)])


def _cifar_bin_mutations(name: str) -> st.SearchStrategy:
    def label(path: Path) -> str:
        path.write_bytes(b"\x4d" + path.read_bytes()[1:])  # label 77
        return "label out of range"
    return st.just(label)


def _pickled(value) -> fi.Mutate:
    def mutate(path: Path) -> str:
        kind, obj = value(path)
        path.write_bytes(obj if isinstance(obj, bytes) else __import__("pickle").dumps(obj, 2))
        return kind
    return mutate


def _cifar_python_mutations(name: str) -> st.SearchStrategy:
    rng = np.random.default_rng(9)

    def batch(**changes):
        b = fi.cifar_batch(rng)
        for k, v in changes.items():
            key = k.encode()
            if v is None:
                b.pop(key)
            else:
                b[key] = v
        return b

    return st.sampled_from([
        _pickled(lambda p: ("pickle that runs code", fi.trap_pickle(p.parent))),
        _pickled(lambda p: ("missing key", batch(labels=None))),
        _pickled(lambda p: ("extra key", {**batch(), b"fine_labels": [1, 2]})),
        _pickled(lambda p: ("NaN", batch(data=np.full((2, 3072), np.nan)))),
        _pickled(lambda p: ("wrong shape", batch(data=np.zeros((2, 3071), np.uint8)))),
        _pickled(lambda p: ("wrong dtype", batch(labels=["cat", "dog"]))),
        _pickled(lambda p: ("huge values", batch(labels=[2**70, 1]))),
        _pickled(lambda p: ("label out of range", batch(labels=[3, -1]))),
        _pickled(lambda p: ("not a dict", [1, 2, 3])),
        _pickled(lambda p: ("wrong dtype", batch(data=[[1] * 3072, [2] * 3072]))),
    ])


def _imagenet_mutations(name: str) -> st.SearchStrategy:
    def trap(path: Path) -> str:
        with np.load(path) as z:
            arrays = {k: z[k] for k in z.files}
        arrays["x"] = fi.trap_array(path.parent)
        np.savez(path, **arrays)
        return "pickle that runs code"

    def labels(path: Path) -> str:
        with np.load(path) as z:
            x = z["x"]
        np.savez(path, x=x, y=np.full(len(x), 5000, np.int64))
        return "label out of range"
    return st.one_of(fi.npz_mutations(), st.sampled_from([trap, labels]))


def _hdf5_mutations(name: str) -> st.SearchStrategy:
    def rewrite(kind: str, **data) -> fi.Mutate:
        def mutate(path: Path) -> str:
            import h5py
            with h5py.File(path, "w") as h5:
                for k, v in data.items():
                    h5[k] = v
            return kind
        return mutate

    x = np.zeros((6, 1, 8, 8), np.float32)
    y = np.arange(6) % 3
    if name.endswith(".txt"):
        return st.sampled_from([
            fi._bytes_mutation("list names a missing file", lambda raw: b"nope.h5\n"),
            fi._bytes_mutation("list names a system file", lambda raw: b"/etc/passwd\n"),
            fi._bytes_mutation("list names a folder", lambda raw: b".\n"),
            fi._bytes_mutation("list names a text file", lambda raw: b"train.txt\n"),
            fi._bytes_mutation("binary list", lambda raw: bytes(range(256))),
            fi._bytes_mutation("empty list", lambda raw: b"# nothing\n\n")])
    nan = x.copy()
    nan[0, 0, 0, 0] = np.nan
    return st.sampled_from([
        rewrite("NaN", features=nan, labels=y),
        rewrite("inf", features=np.full_like(x, np.inf), labels=y),
        rewrite("missing key", features=x),
        rewrite("extra key", features=x, labels=y, other=y),
        rewrite("wrong dtype", features=x, labels=np.array([b"a"] * 6)),
        rewrite("wrong dtype", features=x, labels=y + 0.5),
        rewrite("wrong shape", features=x, labels=np.zeros((6, 2, 2))),
        rewrite("wrong shape", features=np.zeros(6, np.float32), labels=y),
        rewrite("count mismatch", features=x, labels=y[:4]),
        rewrite("huge values", features=x, labels=np.full(6, 2**40)),
        rewrite("label out of range", features=x, labels=-y - 1),
        rewrite("zero-length array", features=x[:0], labels=y[:0]),
        rewrite("wrong dtype", features=np.zeros((6, 1, 8, 8), np.complex64), labels=y),
    ])


def _record(data: bytes) -> bytes:
    from distnn.data.tfrecord import masked_crc32c
    head = struct.pack("<Q", len(data))
    return head + struct.pack("<I", masked_crc32c(head)) + data + struct.pack(
        "<I", masked_crc32c(data))


def _tfrecord_mutations(name: str) -> st.SearchStrategy:
    from distnn.data import encode_example

    def records(kind: str, *payloads: bytes) -> fi.Mutate:
        def mutate(path: Path) -> str:
            path.write_bytes(b"".join(_record(p) for p in payloads))
            return kind
        return mutate

    def huge_length(path: Path) -> str:
        from distnn.data.tfrecord import masked_crc32c
        head = struct.pack("<Q", 2**62)
        path.write_bytes(head + struct.pack("<I", masked_crc32c(head)) + b"\0" * 16)
        return "huge declared dims"

    def png_bomb() -> bytes:
        import zlib
        from PIL import Image
        out = io.BytesIO()
        Image.new("L", (1, 1)).save(out, "PNG")
        raw = bytearray(out.getvalue())
        ihdr = struct.pack(">II", 60000, 60000)  # declared 60000x60000 pixels
        raw[16:24] = ihdr
        raw[29:33] = struct.pack(">I", zlib.crc32(bytes(raw[12:29])))
        return bytes(raw)

    example = encode_example
    return st.sampled_from([
        records("garbage payload", b"\x0a\xff\xff\xff\xff\x0f"),
        records("garbage payload", b"\x12\x05hello"),
        records("missing key", example({"image/class/label": 1})),
        records("wrong dtype", example({"image/encoded": b"x", "image/class/label": b"one"})),
        records("wrong dtype", example({"image/encoded": b"notajpeg", "image/class/label": 3})),
        records("wrong dtype", example({"image/encoded": 1.5, "image/class/label": 2.5})),
        records("huge values", example({"image/encoded": png_bomb(),
                                        "image/class/label": 1})),
        records("float list of odd length", b"\x0a\x10\x0a\x0e\x0a\x01k\x12\x09\x12\x07\x0a\x05"
                b"\x01\x02\x03\x04\x05"),
        records("huge values", example({"image/encoded": b"x", "image/class/label": 2**62})),
        huge_length,
    ])


def _weights_mutations(name: str) -> st.SearchStrategy:
    def trap(path: Path) -> str:
        with np.load(path) as z:
            arrays = {k: z[k] for k in z.files}
        arrays[sorted(arrays)[0]] = fi.trap_array(path.parent)
        np.savez(path, **arrays)
        return "pickle that runs code"

    def renamed(path: Path) -> str:
        with np.load(path) as z:
            arrays = {k: z[k] for k in z.files}
        key = sorted(arrays)[0]
        arrays[key.replace("Conv2D", "FC").replace("/", "_x/")] = arrays.pop(key)
        np.savez(path, **arrays)
        return "wrong key"
    return st.one_of(fi.npz_mutations(), st.sampled_from([trap, renamed]))


_META_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
                         st.floats(allow_nan=True), st.text(max_size=8),
                         st.lists(st.integers(), max_size=3),
                         st.dictionaries(st.text(max_size=4), st.integers(), max_size=2))


@st.composite
def _checkpoint_mutations(draw, name: str) -> fi.Mutate:
    if draw(st.booleans()):
        return draw(st.one_of(_weights_mutations(name), fi.npz_mutations(
            keys=lambda a: [k for k in a if k.startswith("model/")])))
    path_to_key = draw(st.lists(st.text(max_size=12), min_size=1, max_size=3))
    value = draw(_META_VALUES)
    drop = draw(st.booleans())
    pick = draw(st.lists(st.floats(0, 1, exclude_max=True), min_size=3, max_size=3))

    def meta(arrays: dict) -> dict:
        tree = json.loads(str(arrays["__meta__"]))
        node, keys = tree, path_to_key
        for i, p in enumerate(pick):  # walk to a random entry and break it
            if not isinstance(node, dict) or not node:
                break
            k = sorted(node)[int(p * len(node))]
            if i == len(pick) - 1 or not isinstance(node[k], dict) or not node[k]:
                if drop:
                    node.pop(k)
                else:
                    node[k] = value
                break
            node = node[k]
        else:
            tree[keys[0]] = value
        arrays["__meta__"] = np.array(json.dumps(tree))
        return arrays
    return fi.npz_rewrite(meta, "missing key" if drop else "wrong meta value")


_TOML_VALUES = st.one_of(
    st.sampled_from(['""', "-1", "0", "1e309", "nan", "inf", "-inf", "99999999999999999999",
                     "true", '"none"', '"ünïcödé ☃"', '"1,2,3"', "[1, 2]", "{a = 1}",
                     '"../x.npz"', '"/dev/null"', '"."', "1979-05-27", "[[1], [2]]"]),
    st.integers(-2**63, 2**63 - 1).map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.text(alphabet=st.characters(codec="utf-8", exclude_characters='"\\\n\r'),
            max_size=10).map(lambda s: json.dumps(s, ensure_ascii=False)))


def option_names() -> list[str]:
    from distnn.cli.options import options
    return sorted({o.name for o in options("train")} - {"download", "traceback"})


@st.composite
def _toml_mutations(draw, name: str) -> fi.Mutate:
    if draw(st.integers(0, 3)) == 0:
        return draw(fi.byte_mutations())
    key = draw(st.one_of(st.sampled_from(option_names()), st.text(
        alphabet="abcdefghijklmnopqrstuvwxyz_-", min_size=1, max_size=12)))
    value = draw(_TOML_VALUES)
    if name == "s.toml":  # a search space: an entry of the [space] table
        kind = draw(st.sampled_from(["uniform", "log_uniform", "int", "log_int", "choice",
                                     "grid", ""]))
        value = f"{{{kind} = {value}}}" if kind else value
        line = f"{key} = {value}\n"
        return _naming(key, fi._bytes_mutation("option value", lambda raw: raw + line.encode()))
    table = draw(st.sampled_from(["", "[extra]\n", "[a.b]\n"]))
    line = f"{table}{key} = {value}\n"
    return _naming(key, fi._bytes_mutation("option value", lambda raw: raw + line.encode()))


def _naming(key: str, mutate: fi.Mutate) -> fi.Mutate:  # the line may name the option set
    mutate.culprit = key  # type: ignore[attr-defined]
    return mutate


@st.composite
def _session_mutations(draw, name: str) -> fi.Mutate:
    if draw(st.integers(0, 3)) == 0:
        return draw(fi.byte_mutations())
    key = draw(st.one_of(st.sampled_from(["RULE", "MODELFILE", "MODELCLASS", "SIZE", "DEVICES",
                                          "BSP_SYNC_TYPE", "BSP_EXCH_STRATEGY", "BIND"]),
                         st.sampled_from(option_names())))
    value = draw(st.one_of(st.sampled_from(["", "EASGD", "bsp", "(a b", "'x", "$(touch X)",
                                            "`touch X`", "-1", "1e999", "ünï", "fp16",
                                            "nccl16"]), st.text(max_size=10).filter(
        lambda s: "\n" not in s and "\r" not in s)))
    line = f"{key}={value}\n"
    return _naming(key, fi._bytes_mutation("option value", lambda raw: raw + line.encode()))


def _plus_bytes(format_aware):
    return lambda name: st.one_of(fi.byte_mutations(), format_aware(name))


TARGETS = [
    Target("idx (MNIST)", fi.seed_idx, ["train", "--dataset", "mnist", "--dataset_path", ".",
                                         "--model", "simplemlp", *TRAIN],
           mutations=_plus_bytes(_idx_mutations), culprit=("--dataset_path",)),
    Target("CIFAR binary", fi.seed_cifar_bin, ["train", "--dataset", "cifar10",
                                                "--dataset_path", ".", "--model",
                                                "simplemlp", *TRAIN],
           mutations=_plus_bytes(_cifar_bin_mutations), culprit=("--dataset_path",)),
    Target("CIFAR Python", fi.seed_cifar_python, ["train", "--dataset", "cifar10_python",
                                                   "--dataset_path", ".", "--model",
                                                   "simplemlp", *TRAIN],
           mutations=_plus_bytes(_cifar_python_mutations), culprit=("--dataset_path",)),
    Target("ImageNet NPZ", fi.seed_imagenet, ["train", "--dataset", "imagenet",
                                               "--dataset_path", ".", "--num_classes", "10",
                                               "--model", "simplemlp", *TRAIN],
           mutations=_plus_bytes(_imagenet_mutations), culprit=("--dataset_path",)),
    Target("HDF5 list", fi.seed_hdf5, ["train", "--dataset", "hdf5", "--train_list",
                                        "train.txt", "--val_list", "val.txt", "--model",
                                        "simplemlp", *TRAIN],
           mutations=_plus_bytes(_hdf5_mutations), culprit=("--train_list", "--val_list")),
    Target("TFRecord", fi.seed_tfrecord, ["convert-imagenet", "train-00000", "--out_dir",
                                           "out", "--image_size", "8", "--shard_size", "2"],
           mutations=_plus_bytes(_tfrecord_mutations), outputs=("out",)),
    Target("checkpoint .npz", lambda f: ["ck.npz"],
           ["train", *SYNTH, "--model", "simplemlp", *QUIET, "--num_epochs", "2",
            "--evaluate", "false", "--resume", "ck.npz"],
           mutations=_plus_bytes(_checkpoint_mutations), outputs=("ck.npz",),
           culprit=("--resume",), seed_argv=["train", *SYNTH, "--model", "simplemlp", *TRAIN,
                                             "--checkpoint", "ck.npz"]),
    Target("weights (distnn)", lambda f: ["w.npz"],
           ["evaluate", *SYNTH, "--model", "simplemlp", *QUIET, "--weights", "w.npz"],
           mutations=_plus_bytes(_weights_mutations), culprit=("--weights_and_bias_filename",),
           seed_argv=["train", *SYNTH, "--model", "simplemlp", *TRAIN, "--save_weights",
                      "w.npz"]),
    Target("weights (PyDTNN)", lambda f: ["w.npz"],
           ["evaluate", *SYNTH, "--model", "simplecnn", *QUIET, "--weights", "w.npz"],
           mutations=_plus_bytes(_weights_mutations), culprit=("--weights_and_bias_filename",),
           seed_argv=["train", *SYNTH, "--model", "simplecnn", *TRAIN, "--save_weights",
                      "w.npz", "--weights_layout", "pydtnn"]),
    Target("TOML config", fi.seed_text("c.toml", fi.TOML),
           ["train", "--config", "c.toml", *SYNTH, "--parallel", "sequential"],
           mode="build", mutations=_toml_mutations, culprit=("--config",)),
    Target("search space", fi.seed_text("s.toml", fi.SPACE),
           ["search", "--space", "s.toml", *SYNTH], mode="search", mutations=_toml_mutations,
           culprit=("--space",)),
    Target("Theano-MPI session", fi.seed_text("session.cfg", fi.SESSION),
           ["train", "--config", "session.cfg", *SYNTH, "--parallel", "sequential"],
           mode="build", mutations=_session_mutations, culprit=("--config",)),
]
