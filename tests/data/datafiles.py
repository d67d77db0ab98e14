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
