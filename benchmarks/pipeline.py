"""Pipeline stages against dense data parallelism on the same ranks, and against PyTorch's
GPipe (``torch.distributed.pipelining.ScheduleGPipe``) on gloo, for the same network.

An MLP (784-1024-1024-1024-1024-10, float32; 3.9 M weights) on synthetic Fashion-MNIST-shaped
data, global batch 128, SGD, on 2 ranks × 1 thread each (``mpiexec -n 2``, it runs itself
under it). distnn's pipeline: S = 2 stages cut by parameter counts (reproducible: a cut by
measured time moves with the load of a shared host), M micro-batches, GPipe and 1F1B;
dense: ``--parallel data``, 64 samples per rank; torch: the same network cut at the same
layer, ``ScheduleGPipe`` with the same M. Each run trains ``--epochs`` epochs of
``--steps`` steps; the throughput is the global batch over the median step time (of the
slowest rank) in the epochs after the first (which warms caches): medians of steps resist
the bursts of other processes on a shared host. The bubble is the median share of a step's
pipeline time a stage spent waiting for its neighbour (mean over the stages), against the ideal
(S − 1)/(M + S − 1) of equal stages with free messages. Its workers also run
benchmarks/sharded_speed.py's kinds (``shard1``..``shard3``, ``torch-ddp``, ``torch-fsdp2``,
``torch-zero``, ``torch-gpipe``, ``torch-1f1b``).

    python benchmarks/pipeline.py                       # M in 1 2 4 8, with torch
    python benchmarks/pipeline.py --micro 4 --no-torch --steps 10
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WIDTHS = (1024, 1024, 1024, 1024)
INPUT, CLASSES = 784, 10


def data(n: int):
    import numpy as np
    rng = np.random.default_rng(0)
    return (rng.standard_normal((n, INPUT)).astype(np.float32),
            rng.integers(0, CLASSES, size=n))


def distnn_worker(cfg: dict) -> dict:
    import numpy as np

    from distnn import distributed as dist
    from distnn.data import ArrayDataset, Preprocess
    from distnn.nn import Dense, ReLU, Sequential
    from distnn.optim import SGD
    from distnn.rules import DataParallel, Pipeline
    from distnn.training import Callback, Trainer
    comm = dist.init()
    layers = []
    for w in WIDTHS:
        layers += [Dense(w), ReLU()]
    model = Sequential([*layers, Dense(CLASSES)], input_shape=(INPUT,), rng=0)
    gbs = cfg["batch"]
    x, y = data(gbs * cfg["steps"])
    ds = ArrayDataset(x, y, CLASSES, preprocess=Preprocess(dtype=np.float32, normalize=False))
    if cfg["mode"] == "data" or cfg["mode"].startswith("shard"):
        rule = DataParallel(shard=int(cfg["mode"][-1]) if cfg["mode"] != "data" else 0,
                            bucket_size_mb=cfg.get("bucket_mb", 4.0))
    else:
        rule = Pipeline(stages=comm.size, micro_batches=cfg["micro"], schedule=cfg["mode"],
                        balance=cfg.get("balance", "params"))
    steps, bubbles = [], []

    class PerStep(Callback):  # medians of steps resist the bursts of a shared host
        def on_batch_begin(self, trainer, step):
            self.t0, self.c0 = time.perf_counter(), dict(getattr(rule, "counters", {}))

        def on_batch_end(self, trainer, step, logs):
            if trainer.epoch == 0:  # warms caches and kernels: not measured
                return
            steps.append(time.perf_counter() - self.t0)
            c = getattr(rule, "counters", None)
            if c:
                bubbles.append((c["wait_s"] - self.c0["wait_s"])
                               / (c["step_s"] - self.c0["step_s"]))

    trainer = Trainer(model, SGD(model, lr=0.01, momentum=0.9), comm=comm, rule=rule,
                      progress=False, verbose=False, callbacks=[PerStep()])
    trainer.fit(ds, epochs=cfg["epochs"], global_batch_size=gbs, shuffle=False)
    slowest = max(comm.allgather_obj(statistics.median(steps)))
    every = comm.allgather_obj(statistics.median(bubbles) if bubbles else float("nan"))
    return {"samples_per_s": gbs / slowest, "bubble": float(np.mean(every)),
            "starts": list(getattr(rule, "starts", ()))}


def torch_worker(cfg: dict) -> dict:
    """PyTorch's peers on gloo: a pipeline (``torch-gpipe``, ``torch-1f1b``: the network cut
    at distnn's first stage's end) or data parallelism over the ranks (``torch-ddp``,
    ``torch-fsdp2``: ``fully_shard`` on each Linear and the root, ``torch-zero``: DDP and
    ``ZeroRedundancyOptimizer``), each rank its share of the global batch."""
    import torch
    import torch.distributed as tdist
    torch.set_num_threads(1)
    mode = cfg["mode"]
    if "port" in cfg:
        rank, size = int(os.environ["PMI_RANK"]), int(os.environ["PMI_SIZE"])
        tdist.init_process_group("gloo", rank=rank, world_size=size,
                                 init_method=f"tcp://127.0.0.1:{cfg['port']}")
    else:  # the rendezvous from MPI: rank 0's address on the hosts' network
        import distnn.torch as dt
        dt.init_process_group("gloo")
        rank, size = tdist.get_rank(), tdist.get_world_size()
    torch.manual_seed(0)
    mods, width = [], INPUT
    for w in WIDTHS:
        mods += [torch.nn.Linear(width, w), torch.nn.ReLU()]
        width = w
    mods.append(torch.nn.Linear(width, CLASSES))
    gbs, piped = cfg["batch"], mode in ("torch", "torch-gpipe", "torch-1f1b")
    if piped:
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
        cut = cfg["cut"]  # where distnn's balance started stage 1 (the same layer list)
        net = part = torch.nn.Sequential(*(mods[:cut] if rank == 0 else mods[cut:]))
        stage = PipelineStage(part, rank, size, torch.device("cpu"))
        loss_fn = torch.nn.CrossEntropyLoss(reduction="sum")

        def loss(out, target):  # the sum over a micro-batch over the global batch
            return loss_fn(out, target) / gbs

        kind = Schedule1F1B if mode == "torch-1f1b" else ScheduleGPipe
        schedule = kind(stage, n_microbatches=cfg["micro"], loss_fn=loss)
    else:
        net = part = torch.nn.Sequential(*mods)
        if mode == "torch-fsdp2":
            from torch.distributed.fsdp import fully_shard
            for layer in part:
                if isinstance(layer, torch.nn.Linear):
                    fully_shard(layer)
            fully_shard(part)
        else:
            from torch.nn.parallel import DistributedDataParallel
            net = DistributedDataParallel(part)
        lossf = torch.nn.CrossEntropyLoss()
    if mode == "torch-zero":
        from torch.distributed.optim import ZeroRedundancyOptimizer
        opt = ZeroRedundancyOptimizer(part.parameters(), optimizer_class=torch.optim.SGD,
                                      lr=0.01, momentum=0.9)
    else:
        opt = torch.optim.SGD(part.parameters(), lr=0.01, momentum=0.9)
    x, y = data(gbs * cfg["steps"])
    x, y = torch.from_numpy(x), torch.from_numpy(y)
    share = gbs // size
    times = []
    for epoch in range(cfg["epochs"]):
        for s in range(cfg["steps"]):
            lo, hi = (s * gbs, (s + 1) * gbs) if piped else \
                (s * gbs + rank * share, s * gbs + (rank + 1) * share)
            t0 = time.perf_counter()
            opt.zero_grad()
            if not piped:
                lossf(net(x[lo:hi]), y[lo:hi]).backward()
            elif rank == 0:
                schedule.step(x[lo:hi])
            else:
                schedule.step(target=y[lo:hi])
            opt.step()
            if epoch:
                times.append(time.perf_counter() - t0)
    slowest = max(t.item() for t in _gather(torch, tdist, statistics.median(times), size))
    tdist.destroy_process_group()
    return {"samples_per_s": gbs / slowest, "bubble": float("nan")}


def _gather(torch, tdist, value: float, size: int):
    out = [torch.zeros(1, dtype=torch.float64) for _ in range(size)]
    tdist.all_gather(out, torch.tensor([value], dtype=torch.float64))
    return out


def launch(cfg: dict, out: Path) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
           "MKL_NUM_THREADS": "1"}
    mpiexec = str(Path(sys.executable).parent / "mpiexec")
    proc = subprocess.run([mpiexec, "-n", "2", sys.executable, __file__, "--worker",
                           json.dumps(cfg), "--out", str(out)], env=env, capture_output=True,
                          text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"{cfg}: exit {proc.returncode}\n{proc.stdout}{proc.stderr}"[-4000:])
    return json.loads(out.read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--micro", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--batch", type=int, default=128, help="global batch")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--worker")
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.worker:
        cfg = json.loads(args.worker)
        result = (torch_worker if cfg["mode"].startswith("torch") else distnn_worker)(cfg)
        if int(os.environ.get("PMI_RANK", "0")) == 0:
            Path(args.out).write_text(json.dumps(result))
        return
    common = {"batch": args.batch, "steps": args.steps, "epochs": args.epochs}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        dense = launch({**common, "mode": "data", "micro": 1}, out)
        rows.append(("distnn data (2 replicas)", "-", dense, None))
        for m in args.micro:
            ideal = 1 / (m + 1)
            for mode in ("gpipe", "1f1b"):
                res = launch({**common, "mode": mode, "micro": m}, out)
                rows.append((f"distnn pipeline {mode}, S=2", m, res, ideal))
            if not args.no_torch:
                cut = res["starts"][1]
                port = 29500 + (os.getpid() + m) % 1000
                res = launch({**common, "mode": "torch", "micro": m, "cut": cut,
                              "port": port}, out)
                rows.append(("torch ScheduleGPipe, gloo, S=2", m, res, ideal))
    print(f"\n2 ranks x 1 thread, MLP {INPUT}-{'-'.join(map(str, WIDTHS))}-{CLASSES} float32, "
          f"global batch {args.batch}, median step of epochs 2..{args.epochs} "
          f"({args.steps} steps each)"
          f"; the pipeline's first stage: layers 0..{max(0, rows[1][2]['starts'][1] - 1)}\n")
    print("| run | M | samples/s | vs dense | bubble measured | bubble ideal (S-1)/(M+S-1) |")
    print("|---|---|---|---|---|---|")
    for name, m, res, ideal in rows:
        bubble = res["bubble"]
        print(f"| {name} | {m} | {res['samples_per_s']:,.0f} | "
              f"{res['samples_per_s'] / dense['samples_per_s']:.2f}x | "
              f"{'-' if bubble != bubble else f'{bubble:.2f}'} | "
              f"{'-' if ideal is None else f'{ideal:.2f}'} |")


if __name__ == "__main__":
    main()
