"""Bytes per step of vgg11bn under each compression, on real Fashion-MNIST images padded to
32x32 (vgg's five poolings need it), one step each; rank 0 pickles {spec: (bytes, bytes_dense)}.
Usage: compression_bytes_prog.py OUT_DIR"""
from __future__ import annotations

import pickle
import sys

import numpy as np

from distnn import distributed as dist
from distnn.data import ArrayDataset, load_dataset
from distnn.models import get_model
from distnn.optim import SGD
from distnn.rules import DataParallel
from distnn.training import Trainer


def main() -> None:
    comm = dist.init()
    with dist.abort_on_error(comm):
        x, y = load_dataset("fashion_mnist", download=False).train.arrays()
        x = np.pad(x[:4], ((0, 0), (0, 0), (2, 2), (2, 2)))
        data = ArrayDataset(x, y[:4], 10)
        out = {}
        for spec in ("topk:0.01", "powersgd:2"):
            model = get_model("vgg11bn", input_shape=(1, 32, 32), num_classes=10, rng=0)
            rule = DataParallel(compression=spec)
            trainer = Trainer(model, SGD(model, lr=0.01), comm=comm, rule=rule,
                              progress=False, verbose=False)
            trainer.fit(data, epochs=1, global_batch_size=4, shuffle=False)
            stats = rule.stats()
            out[spec] = (stats["bytes"], stats["bytes_dense"], model.parameters_flat().size)
        if comm.rank == 0:
            with open(f"{sys.argv[1]}/bytes.pkl", "wb") as f:
                pickle.dump(out, f)


if __name__ == "__main__":
    main()
