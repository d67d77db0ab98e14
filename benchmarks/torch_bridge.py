"""distnn.torch against PyTorch DDP (gloo) and torch + plain mpi4py, 2 ranks x 1 thread.

The same work for every system: a torch model (simplecnn or lenet, as in
/work/shared/peers/torch), SGD lr 0.01 momentum 0.9, batch 64 per rank, one epoch of
Fashion-MNIST in the peers' order (``torch.randperm`` seeded 0, rank r takes every
size-th sample). Only the gradient exchange differs:

* ``distnn.torch``: ``distnn.torch.DistributedOptimizer`` (every ``.grad`` a view into one
  flat buffer, per-parameter hooks start each bucket's in-place ``Iallreduce`` during
  backward), run by this script's worker;
* ``mpi4py``: the peer ``train_mpi4py.py`` (copy the gradients into a flat buffer, one
  blocking ``Allreduce``, copy back);
* ``ddp``: the peer ``train_ddp.py`` (DistributedDataParallel over gloo);
* ``distnn-train`` (with ``--trainer``): the same torch module in distnn's ``Trainer``
  through ``TorchModel`` (distnn's loss, optimizer and data pipeline), epoch rate only.

Systems alternate within each repetition (A B C, A B C, ...); the table reports medians
over repetitions of each run's median step (the slowest rank's, after 30 warm-up steps).

    python benchmarks/torch_bridge.py                      # simplecnn and lenet, 3 reps
    python benchmarks/torch_bridge.py --models lenet --reps 1 --markdown
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

PEERS = Path(os.environ.get("DISTNN_PEERS", "/work/shared/peers/torch"))
BS, WARM = 64, 30


def build(name: str):
    """The peers' models (README of /work/shared/peers)."""
    from torch import nn
    if name == "simplecnn":
        return nn.Sequential(
            nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Conv2d(4, 8, 3), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(1152, 128), nn.ReLU(), nn.Linear(128, 10))
    if name == "lenet":
        return nn.Sequential(
            nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(),
            nn.Linear(84, 10))
    raise ValueError(f"model must be simplecnn or lenet, got {name!r}")


def _data():
    from distnn.data import load_dataset
    splits = load_dataset("fashion_mnist", validation_split=0.0, download=False)
    (xtr, ytr), (xte, yte) = splits.train.arrays(), splits.test.arrays()
    return xtr, ytr, xte, yte


def worker(name: str, trainer: bool) -> None:
    """One rank of the distnn.torch run (under mpiexec); rank 0 prints a RESULT line."""
    import torch
    import torch.nn.functional as F

    import distnn.torch as hvd
    torch.set_num_threads(1)
    comm = hvd.init()
    rank, world = comm.rank, comm.size
    xtr, ytr, xte, yte = _data()
    torch.manual_seed(0)
    model = build(name)
    if trainer:
        from distnn.optim import SGD
        from distnn.training import Trainer
        from distnn.data import ArrayDataset, Preprocess
        tmodel = hvd.TorchModel(model, (1, 28, 28), name=name)
        train = ArrayDataset(xtr, ytr, 10, preprocess=Preprocess(normalize=False))
        t = Trainer(tmodel, SGD(tmodel, lr=0.01, momentum=0.9), comm=comm, progress=False,
                    verbose=False)
        history = t.fit(train, epochs=1, batch_size=BS)
        rec = history.records[-1]
        if rank == 0:
            print("RESULT " + json.dumps({"samples_per_s_total_epoch": rec["samples_per_s"],
                                          "epoch_s": rec["time"]}), flush=True)
        return
    xtr, ytr = torch.from_numpy(xtr), torch.from_numpy(ytr)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    hvd.broadcast_parameters(model.state_dict())
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    g = torch.Generator().manual_seed(0)
    perm = torch.randperm(len(xtr), generator=g)[rank::world]
    nb = len(perm) // BS
    steps, waits = [], []
    comm.barrier()
    t_ep = time.perf_counter()
    for b in range(nb):
        ts = time.perf_counter()
        idx = perm[b * BS:(b + 1) * BS]
        opt.zero_grad()
        F.cross_entropy(model(xtr[idx]), ytr[idx]).backward()
        w0 = opt.comm_wait_time
        opt.step()
        waits.append(opt.comm_wait_time - w0)
        steps.append(time.perf_counter() - ts)
    ep_s = time.perf_counter() - t_ep
    slowest = np.array(steps)
    comm.allreduce_(slowest, "max")
    if rank == 0:
        model.eval()
        with torch.no_grad():
            acc = float((model(torch.from_numpy(xte)).argmax(1).numpy() == yte).mean())
        med = float(np.median(slowest[WARM:]))
        print("RESULT " + json.dumps({
            "median_step_s": med, "samples_per_s_total_median": world * BS / med,
            "epoch_s": ep_s, "samples_per_s_total_epoch": world * nb * BS / ep_s,
            "median_wait_s": float(np.median(waits[WARM:])), "buckets": len(opt.buckets),
            "test_acc_after_1_epoch": acc}), flush=True)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    return env


def _mpiexec() -> str:
    here = Path(sys.executable).parent / "mpiexec"
    return str(here) if here.exists() else (shutil.which("mpiexec") or "mpiexec")


def run_system(system: str, name: str, ranks: int, folder: Path) -> dict:
    if system in ("distnn.torch", "distnn-train"):
        cmd = [_mpiexec(), "-n", str(ranks), sys.executable, __file__, "--worker", name]
        if system == "distnn-train":
            cmd.append("--trainer")
        proc = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=900)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        if proc.returncode or not lines:
            raise RuntimeError(f"{system} {name} failed:\n{proc.stdout[-2000:]}\n"
                               f"{proc.stderr[-3000:]}")
        return json.loads(lines[-1][len("RESULT "):])
    if system == "ddp":
        cmd, out = [sys.executable, str(PEERS / "train_ddp.py"), name, str(ranks)], "ddp"
    elif system == "mpi4py":
        cmd = [_mpiexec(), "-n", str(ranks), sys.executable, str(PEERS / "train_mpi4py.py"),
               name]
        out = "mpi4py_torch"
    else:
        raise ValueError(system)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_env(), cwd=folder,
                          timeout=900)
    if proc.returncode:
        raise RuntimeError(f"{system} {name} failed:\n{proc.stderr[-3000:]}")
    return json.loads((folder / "results" / f"{out}_{name}.json").read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["simplecnn", "lenet"])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--trainer", action="store_true",
                    help="also run the module in distnn's Trainer (distnn-train)")
    ap.add_argument("--json", help="write every run's result here")
    ap.add_argument("--markdown", action="store_true", help="print a markdown table")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker, args.trainer)
        return
    systems = ["distnn.torch", "mpi4py", "ddp"] + (["distnn-train"] if args.trainer else [])
    runs: dict[tuple[str, str], list[dict]] = {}
    load0 = os.getloadavg()
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.reps):
            for name in args.models:
                order = systems[rep % len(systems):] + systems[:rep % len(systems)]
                for system in order:
                    r = run_system(system, name, args.ranks, Path(tmp))
                    r["load"] = os.getloadavg()[0]
                    runs.setdefault((name, system), []).append(r)
                    print(f"rep {rep + 1} {name:9s} {system:12s} "
                          f"{r.get('samples_per_s_total_median', float('nan')):8.0f} samples/s "
                          f"(median step), {r['samples_per_s_total_epoch']:8.0f} (epoch), "
                          f"load {r['load']:.1f}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({f"{k[0]}/{k[1]}": v for k, v in runs.items()},
                                              indent=1))
    rows = ["| model | system | samples/s (median step) | samples/s (epoch) | "
            "distnn.torch ÷ system | median step ms | test acc (1 epoch) |",
            "|---|---|---:|---:|---:|---:|---:|"]
    for name in args.models:
        ours = np.median([r["samples_per_s_total_median"]
                          for r in runs[(name, "distnn.torch")]])
        for system in systems:
            rs = runs[(name, system)]
            med = [r["samples_per_s_total_median"] for r in rs
                   if "samples_per_s_total_median" in r]
            rate = float(np.median(med)) if med else float("nan")
            epoch = float(np.median([r["samples_per_s_total_epoch"] for r in rs]))
            step = float(np.median([r["median_step_s"] for r in rs])) * 1e3 if med else None
            acc = [r["test_acc_after_1_epoch"] for r in rs if "test_acc_after_1_epoch" in r]
            ratio = "—" if system == "distnn.torch" or not med else f"{ours / rate:.2f}x"
            rows.append(f"| {name} | {system} | {rate:.0f} | {epoch:.0f} | {ratio} | "
                        f"{'' if step is None else f'{step:.2f}'} | "
                        f"{f'{np.median(acc):.4f}' if acc else ''} |")
    print("\n".join(rows) if args.markdown else "\n".join(rows))
    print(f"\n{args.reps} repetitions, {args.ranks} ranks x 1 thread, batch {BS} per rank; "
          f"load average before {load0[0]:.2f}, after {os.getloadavg()[0]:.2f}; "
          f"wall {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
