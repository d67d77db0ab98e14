"""distnn training throughput: 1 process, or N ranks under ``mpiexec -n N``.

python benchmarks/workers/distnn_worker.py --model simplecnn --threads 1
mpiexec -n 2 python benchmarks/workers/distnn_worker.py --model lenet

The step is the one a user writes: forward, CategoricalCrossEntropy (denominator = global
batch), backward, DistributedOptimizer(SGD(lr 0.01, momentum 0.9), op="sum",
non_blocking=True, bucket_size_mb=--bucket-mb).step(); communication wait = the
optimizer's ``comm_wait_time``.
``--rule NAME`` (``--rule-options JSON``): the step ``distnn train --parallel NAME`` runs
instead: a ``Trainer`` with that rule (its hooks, its exchanges) over Fashion-MNIST, SGD
(lr 0.01, momentum 0.9), batch 64 per training rank; a window's time is read off the
training ranks' batch ends (a master serves and is not timed), and one process runs the
data rule (the rule's compute alone). Communication wait is not split out there (0).
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
    ap.add_argument("--rule", default=None, help="a training rule (distnn train's "
                    "--parallel) run through the Trainer; default: the optimizer loop")
    ap.add_argument("--rule-options", default="{}", help="the rule's arguments, JSON")


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


def rule_windows():
    """(wall, comm) windows of ``--rule`` through the Trainer, or None on a master."""
    import json
    import time

    from distnn.data import load_dataset
    from distnn.optim import get_optimizer
    from distnn.rules import RULES, get_rule, rule_name
    from distnn.training import Trainer
    from distnn.training.callback_base import Callback

    splits = load_dataset("fashion_mnist")
    net = get_model(args.model, input_shape=splits.train.input_shape, num_classes=10,
                    dtype=np.float32, rng=args.seed)
    name = args.rule if comm.size >= RULES[rule_name(args.rule)]().min_ranks else "data"
    rule = get_rule(name, **(json.loads(args.rule_options) if name == args.rule else {}))
    stamps = []

    class Stamp(Callback):
        def on_batch_end(self, trainer, step, logs):
            stamps.append(time.perf_counter())

    trainer = Trainer(net, get_optimizer("sgd", net, lr=0.01, momentum=0.9), comm=comm,
                      rule=rule, progress=False, verbose=False, seed=args.seed,
                      callbacks=[Stamp()])
    steps = args.warmup + args.windows * args.steps
    trainer.fit(splits.train, epochs=1, batch_size=args.batch, steps_per_epoch=steps)
    if len(stamps) < steps:  # a master: serves, trains no batch
        return None
    marks = stamps[max(0, args.warmup - 1)::args.steps]
    wall = [b - a for a, b in zip(marks, marks[1:])][:args.windows]
    return wall, [0.0] * len(wall)


if args.rule is not None:
    got = rule_windows()
    records = comm.allgather_obj(got and C.rank_record(*got))
    if comm.rank == 0:
        C.report(args, "distnn", [r for r in records if r], rule=args.rule,
                 rule_options=args.rule_options, ranks_total=comm.size,
                 comm_kind=type(comm).__name__)
    sys.exit(0)

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
