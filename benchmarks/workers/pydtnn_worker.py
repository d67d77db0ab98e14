"""PyDTNN 3.11 peer, run with the PyDTNN venv's Python (3.13), 1 process or under mpiexec.

PYDTNN_PY=~/.cache/distnn-peers/pydtnn/venv/bin/python
$PYDTNN_PY benchmarks/workers/pydtnn_worker.py --model simplecnn_pydtnn

The model is built exactly as ``pydtnn-benchmark`` builds it, from the options that
``/work/shared/peers/pydtnn/run.sh`` passes (PyDTNN's own ``simplecnn``, SGD lr 0.01
momentum 0.9, negative log-likelihood, float32, CPU backend, ``--parallel-data`` when
launched with several ranks, ``--batch-size`` per rank). Instead of ``model.train()``
(whose epoch throughput includes progress-bar sleeps) the worker calls the model's own
per-batch training step, ``Model._train_batch``, in the same timed windows as the other
workers, on a pool of batches prepared beforehand by PyDTNN's data loader (Fashion-MNIST,
NHWC as PyDTNN lays it out). Communication wait = time inside ``Model._model_sync``
(PyDTNN's blocking gradient all-reduce).
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

PYDTNN_MODELS = {"simplecnn_pydtnn": "simplecnn"}  # distnn zoo name -> PyDTNN model name


def _extra(ap):
    ap.add_argument("--data-dir", default=os.path.expanduser(
        "~/.cache/distnn-peers/pydtnn/data/fashion-mnist"),
        help="un-gzipped Fashion-MNIST (made by peers/pydtnn/setup.sh)")


args = C.parse_args(_extra)
if args.model not in PYDTNN_MODELS:
    sys.exit(f"pydtnn_worker: --model {args.model!r} has no layer-for-layer PyDTNN "
             f"definition; choose one of {sorted(PYDTNN_MODELS)}")
C.pin_threads(args.threads)

import numpy as np  # noqa: E402

_, launched_size = C.mpi_rank_size()
argv = ["--model", PYDTNN_MODELS[args.model], "--dataset", "mnist",
        "--dataset-path", args.data_dir, "--dtype", "float32", "--backend", "cpu",
        "--optimizer", "sgd", "--learning-rate", "0.01", "--optimizer-momentum", "0.9",
        "--loss-func", "negative_likelihood", "--metrics", "categorical_accuracy",
        "--schedulers", "", "--validation-split", "0.2", "--no-test-as-validation",
        "--random-seed", "57005", "--no-logger", "--no-traceback",
        "--batch-size", str(args.batch), "--num-epochs", "1"]
if launched_size > 1:
    argv.append("--parallel-data")

from pydtnn.datasets.abstract import Dataset  # noqa: E402
from pydtnn.model import Model  # noqa: E402
from pydtnn.utils import rand  # noqa: E402
from pydtnn.utils.parser import ArgumentParser  # noqa: E402

sys.argv = [sys.argv[0]] + argv
config = ArgumentParser().parse_args()
rand.seed(config.random_seed)
model = Model(**vars(config))
model._ensure_runnable()
comm = model.comm
rank, size = (comm.Get_rank(), comm.Get_size()) if comm is not None else (0, 1)
if size != launched_size:
    sys.exit(f"pydtnn_worker: PyDTNN sees {size} ranks, the launcher started {launched_size}")

# What Model.train() sets up before its first batch.
model.comm_nsamples = tuple(zip(*(comm.allgather(model.dataset._local_nsamples) if comm
                                  else [model.dataset._local_nsamples])))
model.rank_weight = model._compute_rank_weight(Dataset.Part.TRAIN)
if model.initial_model_sync and comm is not None:
    from pydtnn.utils.constants import SyncMode
    model._model_reduce_sync(mode=SyncMode.GRADIENT | SyncMode.WEIGHT)

pool_size = min(128, args.warmup + args.windows * args.steps)
pool = []
while len(pool) < pool_size:
    gen, _ = model.dataset.get_train_val_generator()
    for xb, yb in gen:
        if xb.shape[0] != args.batch:
            continue
        pool.append((np.array(xb, copy=True), np.array(yb, copy=True)))
        if len(pool) == pool_size:
            break
    del gen


def _cycle(items):
    while True:
        yield from items


comm_wait = {"total": 0.0}
_sync = model._model_sync


def _timed_sync(*a, **kw):
    t0 = time.perf_counter()
    try:
        return _sync(*a, **kw)
    finally:
        comm_wait["total"] += time.perf_counter() - t0


model._model_sync = _timed_sync


def step(x, y):
    model._train_batch(x, y)


barrier = comm.Barrier if comm is not None else (lambda: None)
wall, comm_s = C.timed_windows(step, _cycle(pool), warmup=args.warmup, windows=args.windows,
                               steps=args.steps, comm_time=lambda: comm_wait["total"],
                               barrier=barrier)
rec = C.rank_record(wall, comm_s)
records = comm.allgather(rec) if comm is not None else [rec]
if rank == 0:
    import importlib.metadata as md
    C.report(args, "pydtnn", records, pydtnn=md.version("pydtnn"), numpy=np.__version__,
             input_layout="NHWC", batch_shape=list(pool[0][0].shape))
