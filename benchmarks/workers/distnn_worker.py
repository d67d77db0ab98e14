"""distnn training throughput: 1 process, or N ranks under ``mpiexec -n N``.

python benchmarks/workers/distnn_worker.py --model simplecnn --threads 1
mpiexec -n 2 python benchmarks/workers/distnn_worker.py --model lenet

The step is the one a user writes: forward, CategoricalCrossEntropy (denominator = global
batch), backward, DistributedOptimizer(SGD(lr 0.01, momentum 0.9), op="sum",
non_blocking=True, bucket_size_mb=--bucket-mb).step(); communication wait = the
optimizer's ``comm_wait_time``.
``--task infer``: the forward ``distnn predict`` runs (``model.forward(x, training=False)``
on each rank's share of the batches).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

def _options(ap):
    ap.add_argument("--compression", default="none",
                    help="--gradient_compression spec of the optimizer")
    ap.add_argument("--bucket-mb", type=float, default=4.0,
                    help="the optimizer's bucket_size_mb (buckets start during backward)")


args = C.parse_args(_options)
C.pin_threads(args.threads)

import distnn  # noqa: E402,F401  (first, as the command does: its thread-waiting defaults)
import numpy as np  # noqa: E402

_limits = C.limit_blas(args.threads)

from distnn import distributed as dist  # noqa: E402
from distnn.models import get_model  # noqa: E402
from distnn.nn.losses import CategoricalCrossEntropy  # noqa: E402
from distnn.optim import SGD  # noqa: E402

comm = dist.init()
x_all, y_all = C.rank_shard(args.model, comm.rank, comm.size, args.seed)
model = get_model(args.model, input_shape=C.INPUT_SHAPES[args.model], num_classes=10,
                  dtype=np.float32, rng=args.seed)
dist.broadcast_parameters(model, comm=comm)
opt = dist.DistributedOptimizer(SGD(model, lr=0.01, momentum=0.9), model, comm=comm,
                                op="sum", non_blocking=True, compression=args.compression,
                                bucket_size_mb=args.bucket_mb)
lossfn = CategoricalCrossEntropy()
denom = args.batch * comm.size


def step(x, y):
    logits = model.forward(x, training=True)
    _, dy = lossfn(logits, y, denom=denom)
    model.backward(dy)
    opt.step()


if args.task == "infer":
    def step(x, y):  # noqa: F811  (distnn predict's forward)
        model.forward(x, training=False)


wall, comm_s = C.timed_windows(step, C.batches(x_all, y_all, args.batch), warmup=args.warmup,
                               windows=args.windows, steps=args.steps,
                               comm_time=lambda: opt.comm_wait_time, barrier=comm.barrier)
records = comm.allgather_obj(C.rank_record(wall, comm_s))
if comm.rank == 0:
    import distnn
    C.report(args, "distnn", records, numpy=np.__version__,
             distnn=getattr(distnn, "__version__", "?"),
             params=int(model.parameters_flat().size),
             comm_kind=type(comm).__name__)
