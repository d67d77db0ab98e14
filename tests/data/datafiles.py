"""Writers of small dataset files in the real on-disk formats, for the data tests."""
from __future__ import annotations

import gzip
import io
import struct
from pathlib import Path

import numpy as np

def write_idx(path: Path, array: np.ndarray) -> Path:
    array = np.ascontiguousarray(array, dtype=np.uint8)
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    data = header + array.tobytes()
    if path.suffix == ".gz":
        data = gzip.compress(data)
    path.write_bytes(data)
    return path


def make_images(n: int, shape=(28, 28), seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (rng.integers(0, 256, (n, *shape), dtype=np.uint8),
            rng.integers(0, 10, n).astype(np.uint8))


def write_mnist(folder: Path, n_train: int = 50, n_test: int = 20, gz: bool = False,
                seed: int = 0) -> dict[str, np.ndarray]:
    folder.mkdir(parents=True, exist_ok=True)
    ext = ".gz" if gz else ""
    xtr, ytr = make_images(n_train, seed=seed)
    xte, yte = make_images(n_test, seed=seed + 1)
    for name, arr in [("train-images-idx3-ubyte", xtr), ("train-labels-idx1-ubyte", ytr),
                      ("t10k-images-idx3-ubyte", xte), ("t10k-labels-idx1-ubyte", yte)]:
        write_idx(folder / (name + ext), arr)
    return {"x_train": xtr, "y_train": ytr, "x_test": xte, "y_test": yte}


def write_cifar(folder: Path, per_file: int = 7, seed: int = 0) -> dict[str, np.ndarray]:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    xs, ys = [], []
    for name in [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]:
        x = rng.integers(0, 256, (per_file, 3, 32, 32), dtype=np.uint8)
        y = rng.integers(0, 10, per_file).astype(np.uint8)
        records = np.concatenate([y[:, None], x.reshape(per_file, -1)], axis=1)
        (folder / name).write_bytes(records.tobytes())
        xs.append(x)
        ys.append(y)
    return {"x_train": np.concatenate(xs[:5]), "y_train": np.concatenate(ys[:5]),
            "x_test": xs[5], "y_test": ys[5]}


def write_shards(folder: Path, sizes, shape=(3, 4, 4), num_classes: int = 5,
                 base: int = 0, seed: int = 0, compress: bool = False):
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    xs, ys, paths = [], [], []
    for k, n in enumerate(sizes):
        x = rng.integers(0, 256, (n, *shape), dtype=np.uint8)
        y = rng.integers(base, num_classes + base, n).astype(np.int64)
        path = folder / f"shard-{k:03d}.npz"
        (np.savez_compressed if compress else np.savez)(path, x=x, y=y)
        xs.append(x)
        ys.append(y)
        paths.append(path)
    return paths, np.concatenate(xs), np.concatenate(ys)


def jpeg_bytes(width: int, height: int, color) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (width, height), color).save(buf, format="JPEG", quality=95)
    return buf.getvalue()


def write_pydtnn_shards(folder: Path, sizes, shape=(3, 8, 8), num_classes: int = 1000,
                        seed: int = 0) -> tuple[list[Path], np.ndarray, np.ndarray]:
    """ImageNet shards as PyDTNN's converter writes them: ``x`` uint8 (N, C, H, W) and
    ``y`` of shape (N, 1), int16, 1-based labels (1..num_classes; both ends present)."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    xs, ys, paths = [], [], []
    for k, n in enumerate(sizes):
        x = rng.integers(0, 256, (n, *shape), dtype=np.uint8)
        y = rng.integers(1, num_classes + 1, (n, 1)).astype(np.int16)
        if k == 0:
            y[0, 0], y[-1, 0] = 1, num_classes
        path = folder / f"{k:05d}.npz"
        np.savez_compressed(path, x=x, y=y)
        xs.append(x)
        ys.append(y)
        paths.append(path)
    return paths, np.concatenate(xs), np.concatenate(ys)


def write_h5_list(folder: Path, name: str, sizes, shape=(1, 8, 8), num_classes: int = 10,
                  features_name: str = "features", labels_name: str = "labels",
                  one_hot: bool = False, seed: int = 0) -> tuple[Path, np.ndarray, np.ndarray]:
    """HDF5 files of learnable Gaussian classes and the text file listing them (NNLO's
    --train_data/--val_data); returns the list file and all features and labels."""
    import h5py

    folder.mkdir(parents=True, exist_ok=True)
    means = np.random.default_rng(12345).standard_normal((num_classes, *shape))
    rng = np.random.default_rng(seed)
    names, xs, ys = [], [], []
    for k, n in enumerate(sizes):
        y = rng.integers(0, num_classes, n)
        x = (means[y] + 0.5 * rng.standard_normal((n, *shape))).astype(np.float32)
        path = folder / f"{name}_{k}.h5"
        with h5py.File(path, "w") as f:
            f[features_name] = x
            f[labels_name] = np.eye(num_classes, dtype=np.float32)[y] if one_hot else y
        names.append(path.name)
        xs.append(x)
        ys.append(y)
    list_file = folder / f"{name}.list"
    list_file.write_text("\n".join(names) + "\n")
    return list_file, np.concatenate(xs), np.concatenate(ys)


def _py2_pickle(obj) -> bytes:
    """``obj`` pickled as Python 2's cPickle (protocol 2) wrote the published CIFAR-10
    batches: strings as BINSTRING, NumPy arrays as numpy.core.multiarray._reconstruct with
    the version-1 state tuple. Handles bytes, ints, None, False, lists, dicts, uint8 arrays."""
    if isinstance(obj, bytes):
        return (b"U" + bytes([len(obj)]) + obj if len(obj) < 256
                else b"T" + struct.pack("<i", len(obj)) + obj)
    if obj is None:
        return b"N"
    if obj is False:
        return b"\x89"
    if isinstance(obj, int):
        return b"K" + bytes([obj]) if 0 <= obj < 256 else b"J" + struct.pack("<i", obj)
    if isinstance(obj, list):
        return b"](" + b"".join(map(_py2_pickle, obj)) + b"e"
    if isinstance(obj, dict):
        return b"}(" + b"".join(_py2_pickle(k) + _py2_pickle(v) for k, v in obj.items()) + b"u"
    if isinstance(obj, tuple):
        return b"(" + b"".join(map(_py2_pickle, obj)) + b"t"
    assert isinstance(obj, np.ndarray) and obj.dtype == np.uint8
    dtype = (b"cnumpy\ndtype\n" + _py2_pickle((b"u1", 0, 1)) + b"R"
             + _py2_pickle((3, b"|", None, None, None, -1, -1, 0)) + b"b")
    state = (b"(" + _py2_pickle(1) + _py2_pickle(tuple(obj.shape)) + dtype + b"\x89"
             + _py2_pickle(np.ascontiguousarray(obj).tobytes()) + b"t")
    return (b"cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\n"
            + _py2_pickle((0,)) + _py2_pickle(b"b") + b"\x87R" + state + b"b")


def write_cifar_python(folder: Path, per_file: int = 7, seed: int = 0,
                       py2: bool = True) -> dict[str, np.ndarray]:
    """CIFAR-10's Python version as the published files are: Python 2 pickles (protocol 2)
    of dicts with keys 'batch_label', 'labels' (a list of ints), 'data' (uint8 (N, 3072))
    and 'filenames'; ``py2=False`` writes them with Python 3's pickle, bytes keys."""
    import pickle
    dump = (lambda o: b"\x80\x02" + _py2_pickle(o) + b".") if py2 else (
        lambda o: pickle.dumps(o, protocol=2))
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    xs, ys = [], []
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    for k, name in enumerate(names):
        x = rng.integers(0, 256, (per_file, 3, 32, 32), dtype=np.uint8)
        y = rng.integers(0, 10, per_file)
        label = f"training batch {k + 1} of 5" if k < 5 else "testing batch 1 of 1"
        batch = {b"batch_label": label.encode(), b"labels": [int(v) for v in y],
                 b"data": x.reshape(per_file, -1),
                 b"filenames": [f"img_{k}_{i}.png".encode() for i in range(per_file)]}
        (folder / name).write_bytes(dump(batch))
        xs.append(x)
        ys.append(y)
    meta = {b"num_cases_per_batch": per_file, b"num_vis": 3072,
            b"label_names": [n.encode() for n in ("airplane", "automobile", "bird", "cat",
                                                  "deer", "dog", "frog", "horse", "ship",
                                                  "truck")]}
    (folder / "batches.meta").write_bytes(dump(meta))
    return {"x_train": np.concatenate(xs[:5]), "y_train": np.concatenate(ys[:5]),
            "x_test": xs[5], "y_test": ys[5]}
