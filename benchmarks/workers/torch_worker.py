"""PyTorch peer: eager on CPU (1 process), or DDP (gloo) with N ranks under ``torchrun``
(or ``mpiexec -n N`` with ``--port``).

python benchmarks/workers/torch_worker.py --model simplecnn --threads 2
torchrun --standalone --nproc-per-node=2 benchmarks/workers/torch_worker.py --model lenet --ddp
mpiexec -n 2 python benchmarks/workers/torch_worker.py --model lenet --ddp --port 29512
(across hosts: ``--master-addr`` rank 0's address; benchmarks/cluster.py --compression ddp)

The models match distnn's zoo (``distnn.models``) layer for layer; the step is the usual
zero_grad / CrossEntropyLoss (mean over the local batch) / backward / SGD(lr 0.01,
momentum 0.9). DDP keeps its defaults (25 MiB buckets, buffers broadcast each forward).
Under DDP the communication wait is the time from the last gradient being accumulated to
``backward()`` returning: DDP's reducer waits there for the outstanding bucket
all-reduces (gloo runs them on its own threads, overlapped with the rest of backward).

``--mode``: eager; channels_last (model and inputs in NHWC memory format, the layout
PyTorch's CPU convolutions (oneDNN) run fastest in); compile (``torch.compile``, inductor,
default mode: its compile time is the first warm-up step's, reported apart and not in
samples/s). ``--task infer``: ``net.eval()`` and forward under ``torch.inference_mode()``.
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402


def _extra(ap):
    ap.add_argument("--ddp", action="store_true", help="DDP over gloo; rank/size from mpiexec")
    ap.add_argument("--port", type=int, default=29500, help="rendezvous port (DDP)")
    ap.add_argument("--master-addr", default="127.0.0.1", help="rank 0's address, for DDP "
                    "under mpiexec across (emulated) hosts")
    ap.add_argument("--mode", choices=("eager", "channels_last", "compile"), default="eager")


args = C.parse_args(_extra)
C.pin_threads(args.threads)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

torch.set_num_threads(args.threads)
_limits = C.limit_blas(args.threads)


def _vgg11bn(num_classes=10):
    cfg = [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"]
    layers, cin = [], 3
    for v in cfg:
        if v == "M":
            layers.append(nn.MaxPool2d(2))
        else:
            layers += [nn.Conv2d(cin, v, 3, padding=1, bias=False), nn.BatchNorm2d(v),
                       nn.ReLU()]
            cin = v
    return nn.Sequential(*layers, nn.Flatten(), nn.Linear(512, 512), nn.ReLU(), nn.Dropout(0.5),
                         nn.Linear(512, 512), nn.ReLU(), nn.Dropout(0.5),
                         nn.Linear(512, num_classes))


def _conv_bn(cin, cout, k, stride=1, relu=True):
    layers = [nn.Conv2d(cin, cout, k, stride=stride, padding=k // 2, bias=False),
              nn.BatchNorm2d(cout)]
    return layers + [nn.ReLU()] if relu else layers


class _BasicBlock(nn.Module):
    """Add(conv-bn-relu, conv-bn ; identity or 1x1 conv-bn) then ReLU, as distnn's zoo."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.branch = nn.Sequential(*_conv_bn(cin, cout, 3, stride),
                                    *_conv_bn(cout, cout, 3, relu=False))
        down = stride != 1
        self.shortcut = (nn.Sequential(*_conv_bn(cin, cout, 1, stride, relu=False)) if down
                         else nn.Identity())
        self.relu = nn.ReLU()

    def forward(self, x):
        return self.relu(self.branch(x) + self.shortcut(x))


def _resnet20(num_classes=10):
    layers, cin = _conv_bn(3, 16, 3), 16
    for stage, cout in enumerate((16, 32, 64)):
        for i in range(3):
            stride = 2 if stage > 0 and i == 0 else 1
            layers.append(_BasicBlock(cin, cout, stride))
            cin = cout
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(64, num_classes))


def build(name, num_classes=10):
    if name == "simplecnn":
        return nn.Sequential(
            nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Conv2d(4, 8, 3), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(1152, 128), nn.ReLU(), nn.Linear(128, num_classes))
    if name == "simplecnn_pydtnn":
        return nn.Sequential(
            nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 8, 3, padding=1), nn.ReLU(),
            nn.MaxPool2d(2), nn.Flatten(), nn.Linear(1568, 128), nn.ReLU(), nn.Dropout(0.5),
            nn.Linear(128, num_classes))
    if name == "lenet":
        return nn.Sequential(
            nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(),
            nn.Linear(84, num_classes))
    if name == "vgg11bn":
        return _vgg11bn(num_classes)
    if name == "resnet20":
        return _resnet20(num_classes)
    raise ValueError(f"model={name!r} has no PyTorch definition here")


if args.ddp:
    import torch.distributed as tdist
    if "TORCHELASTIC_RUN_ID" in os.environ:  # torchrun: rank, size and store from env://
        tdist.init_process_group("gloo")
        rank, size = tdist.get_rank(), tdist.get_world_size()
    else:
        rank, size = C.mpi_rank_size()
        tdist.init_process_group("gloo", init_method=f"tcp://{args.master_addr}:{args.port}",
                                 rank=rank, world_size=size)
else:
    rank, size = 0, 1

x_np, y_np = C.rank_shard(args.model, rank, size, args.seed)
x_all, y_all = torch.from_numpy(x_np), torch.from_numpy(y_np)
torch.manual_seed(args.seed)
net = build(args.model)
params = list(net.parameters())
channels_last = args.mode == "channels_last"
if channels_last:
    net = net.to(memory_format=torch.channels_last)
if args.ddp:
    net = nn.parallel.DistributedDataParallel(net)
opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
lossf = nn.CrossEntropyLoss()
net.train() if args.task == "train" else net.eval()
if args.mode == "compile":
    net = torch.compile(net)
if channels_last:
    x_all = x_all.contiguous(memory_format=torch.channels_last)

wait = {"total": 0.0, "last_grad": 0.0}
if args.ddp:
    def _mark(_p):
        wait["last_grad"] = time.perf_counter()
    for p in params:
        p.register_post_accumulate_grad_hook(_mark)


def step(x, y):
    opt.zero_grad(set_to_none=True)
    loss = lossf(net(x), y)
    loss.backward()
    if args.ddp:
        wait["total"] += max(0.0, time.perf_counter() - wait["last_grad"])
    opt.step()


if args.task == "infer":
    def step(x, y):  # noqa: F811
        with torch.inference_mode():
            net(x)


barrier = tdist.barrier if args.ddp else (lambda: None)
wall, comm_s = C.timed_windows(step, C.batches(x_all, y_all, args.batch), warmup=args.warmup,
                               windows=args.windows, steps=args.steps,
                               comm_time=lambda: wait["total"], barrier=barrier)
rec = C.rank_record(wall, comm_s)
if args.ddp:
    records = [None] * size
    tdist.all_gather_object(records, rec)
    tdist.destroy_process_group()
else:
    records = [rec]
if rank == 0:
    name = ("torch-ddp" if args.ddp else "torch") + {"eager": "", "channels_last": "-cl",
                                                     "compile": "-compile"}[args.mode]
    C.report(args, name, records, torch=torch.__version__, mode=args.mode,
             numpy=np.__version__, params=int(sum(p.numel() for p in params)))
