"""Memory of sharded training state (issue 56): per rank, distnn's own count of the
training state (parameters + gradients + Adam's two moments) and the peak resident bytes
while training, at 1, 2 and 4 ranks, for dense ``data`` and ZeRO stages 1-3
(``distnn.distributed.ShardedOptimizer``), against the ideal for float32 Adam (dense 16 Psi;
stage 1 8 Psi + 8 Psi / N; stage 2 4 Psi + 12 Psi / N; stage 3 16 Psi / N) and against
PyTorch's FSDP2 (``fully_shard``) and ``ZeroRedundancyOptimizer`` on gloo for the same
network (Dense/Linear layers, float32). Also the step throughput of each, and (``--limit``)
one model that dense cannot train under ``ulimit -v`` and stage 3 trains on 4 ranks.

    python benchmarks/zero_memory.py                  # the table, ~100.7 M parameters
    python benchmarks/zero_memory.py --limit          # + the memory-limit row

Every configuration is its own ``mpiexec -n N`` job (the torch peers get torchrun's
variables from MPI's: RANK, WORLD_SIZE, MASTER_ADDR/PORT). The peak resident size is
the kernel's high-water mark (VmHWM) reset just before the first step
(``/proc/self/clear_refs``), so it is what training holds, not the model's construction;
the peak before that reset (the construction's) and the peak of the address space
(VmPeak, the whole process) are printed too.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve()
KINDS = ("dense", "stage1", "stage2", "stage3", "stage3-sliced", "pipeline", "torch-fsdp2",
         "torch-zero")
IDEAL = {"dense": lambda n: 16.0, "stage1": lambda n: 8 + 8 / n,
         "stage2": lambda n: 4 + 12 / n, "stage3": lambda n: 16 / n,
         "stage3-sliced": lambda n: 16 / n,
         "pipeline": lambda n: 16 / n}  # n stages of equal parameter counts
MB = 1 << 20


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _reset_peak() -> int:
    """Reset the high-water mark of the resident size; returns it as it was (the peak of
    everything before: the model's construction)."""
    before = _status("VmHWM")
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current resident size (Linux >= 4.0)
    except OSError:
        pass
    return before


def _memory(before: int) -> dict:
    # ru_maxrss is the same counter as VmHWM (reset too): the construction's peak is kept
    # from before the reset
    return {"hwm": _status("VmHWM"), "vmpeak": _status("VmPeak"), "build_hwm": before,
            "maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


# -- distnn --------------------------------------------------------------------------------
def distnn_worker(kind: str, width: int, layers: int, batch: int, steps: int) -> dict:
    from distnn import distributed as dist
    from distnn.nn.activations import ReLU
    from distnn.nn.containers import Sequential
    from distnn.nn.core import Dense
    from distnn.nn.losses import CategoricalCrossEntropy
    from distnn.optim import Adam
    comm = dist.init()
    body = []
    for i in range(layers):
        body += [Dense(width)] + ([ReLU()] if i + 1 < layers else [])
    if kind == "stage3-sliced":  # each rank allocates only its slice (distributed.build_sliced)
        model = dist.build_sliced(Sequential(body, dtype=np.float32), (width,), rng=0,
                                  comm=comm)
        psi = model.param_slice.total
    else:
        model = Sequential(body, input_shape=(width,), dtype=np.float32, rng=0)
        psi = model.parameters_flat().size
    if kind == "pipeline":
        return _pipeline_worker(comm, model, width, batch, steps)
    if kind == "dense":
        opt = dist.DistributedOptimizer(Adam(model, lr=1e-4), model, comm=comm, op="average")
    else:
        opt = dist.ShardedOptimizer("adam", model, stage=int(kind[5]), comm=comm,
                                    op="average", defaults={"lr": 1e-4})
        opt.shard()
    rng = np.random.default_rng([1, comm.rank])
    x = rng.normal(size=(batch, width)).astype(np.float32)
    y = rng.integers(0, width, size=batch)
    loss = CategoricalCrossEntropy()
    before = _reset_peak()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        _, dy = loss(model.forward(x, training=True), y, denom=batch)
        model.backward(dy)
        opt.step()
        times.append(time.perf_counter() - t0)
    if kind == "dense":
        held = (model.parameters_flat().nbytes + model.gradients_flat().nbytes
                + sum(a.nbytes for a in opt.state_arrays()))
    else:
        held = opt.state_bytes()["total"]
    return {"psi": int(psi), "state": int(held), "step_s": times, **_memory(before)}


def _pipeline_worker(comm, model, width: int, batch: int, steps: int) -> dict:
    """S = the ranks pipeline stages (cut by parameter counts, 2 micro-batches, 1F1B) of
    one replica through the Trainer; the state count is the stage's parameters, gradients
    and Adam moments, the only ones the rank keeps."""
    from distnn.data import ArrayDataset, Preprocess
    from distnn.optim import Adam
    from distnn.rules import Pipeline
    from distnn.training import Callback, Trainer
    psi = model.parameters_flat().size
    rng = np.random.default_rng(1)
    x = rng.normal(size=(batch * steps, width)).astype(np.float32)
    ds = ArrayDataset(x, rng.integers(0, width, size=batch * steps), width,
                      preprocess=Preprocess(dtype=np.float32, normalize=False))
    rule = Pipeline(stages=comm.size, micro_batches=2, schedule="1f1b", balance="params")
    times, marks = [], {}

    class Steps(Callback):
        def on_train_begin(self, trainer):
            marks["before"] = _reset_peak()

        def on_batch_begin(self, trainer, step):
            marks["t0"] = time.perf_counter()

        def on_batch_end(self, trainer, step, logs):
            times.append(time.perf_counter() - marks["t0"])
            if step == steps - 1:  # before the end gathers the whole model on every rank
                marks["memory"] = _memory(marks["before"])
                stage = rule.model
                marks["state"] = (stage.parameters_flat().nbytes
                                  + stage.gradients_flat().nbytes
                                  + sum(a.nbytes for a in trainer.optimizer.state_arrays()))

    trainer = Trainer(model, Adam(model, lr=1e-4), comm=comm, rule=rule, progress=False,
                      verbose=False, callbacks=[Steps()])
    trainer.fit(ds, epochs=1, global_batch_size=batch, shuffle=False)
    return {"psi": int(psi), "state": int(marks["state"]), "step_s": times,
            **marks["memory"]}


# -- PyTorch -------------------------------------------------------------------------------
def torch_worker(kind: str, width: int, layers: int, batch: int, steps: int) -> dict:
    os.environ.setdefault("RANK", os.environ.get("PMI_RANK", "0"))
    os.environ.setdefault("WORLD_SIZE", os.environ.get("PMI_SIZE", "1"))
    import torch
    import torch.distributed as tdist
    torch.set_num_threads(1)
    tdist.init_process_group("gloo")
    rank = tdist.get_rank()
    torch.manual_seed(0)
    body = []
    for i in range(layers):
        body += [torch.nn.Linear(width, width)] + ([torch.nn.ReLU()] if i + 1 < layers else [])
    model = torch.nn.Sequential(*body)
    psi = sum(p.numel() for p in model.parameters())

    def local(t):
        return t.to_local() if hasattr(t, "to_local") else t

    if kind == "torch-fsdp2":
        from torch.distributed.fsdp import fully_shard
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer)
        fully_shard(model)
        opt = torch.optim.Adam(model.parameters(), lr=1e-4)
        net = model
    else:
        from torch.distributed.optim import ZeroRedundancyOptimizer
        from torch.nn.parallel import DistributedDataParallel
        net = DistributedDataParallel(model)
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam,
                                      lr=1e-4)
    g = torch.Generator().manual_seed(1 + rank)
    x = torch.randn(batch, width, generator=g)
    y = torch.randint(0, width, (batch,), generator=g)
    lossf = torch.nn.CrossEntropyLoss()
    before = _reset_peak()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        lossf(net(x), y).backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    held = sum(local(p).numel() * 4 for p in model.parameters())
    held += sum(local(p.grad).numel() * 4 for p in model.parameters() if p.grad is not None)
    inner = opt.optim if hasattr(opt, "optim") else opt
    for state in inner.state.values():
        for key, t in state.items():
            if key != "step" and torch.is_tensor(t):
                held += local(t).numel() * t.element_size()
    out = {"psi": int(psi), "state": int(held), "step_s": times, **_memory(before)}
    gathered = [None] * tdist.get_world_size()
    tdist.all_gather_object(gathered, out)
    tdist.destroy_process_group()
    return {"ranks": gathered} if rank == 0 else {}


def worker(args) -> None:
    if args.worker.startswith("torch"):
        out = torch_worker(args.worker, args.width, args.layers, args.batch, args.steps)
        if out:
            print("RESULT " + json.dumps(out), flush=True)
        return
    from distnn import distributed as dist
    out = distnn_worker(args.worker, args.width, args.layers, args.batch, args.steps)
    gathered = dist.get_comm().allgather_obj(out)
    if dist.get_comm().rank == 0:
        print("RESULT " + json.dumps({"ranks": gathered}), flush=True)


# -- driver --------------------------------------------------------------------------------
def launch(kind: str, n: int, args, limit_kb: int | None = None, port: int = 29517):
    mpiexec = str(Path(sys.executable).parent / "mpiexec")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
           "MKL_NUM_THREADS": "1", "DISTNN_KERNELS": os.environ.get("DISTNN_KERNELS", "numpy"),
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    cmd = [sys.executable, str(HERE), "--worker", kind, "--width", str(args.width),
           "--layers", str(args.layers), "--batch", str(args.batch), "--steps", str(args.steps)]
    if limit_kb is not None:
        cmd = ["bash", "-c", f'ulimit -v {limit_kb} && exec "$@"', "limited", *cmd]
    proc = subprocess.run([mpiexec, "-n", str(n), *cmd], capture_output=True, text=True,
                          env=env, timeout=args.timeout)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])["ranks"], proc
    return None, proc


def table(results: dict, ranks: list[int], batch: int) -> str:
    psi = next(r[0]["psi"] for r in results.values() if r)
    rows = [f"Psi = {psi:,} parameters (float32, Adam); per rank: max over the ranks; "
            f"MiB = 2^20 bytes; batch {batch} per rank",
            "",
            "| kind | ranks | state count (MiB) | ideal (MiB) | count / Psi | peak RSS in "
            "steps (MiB) | peak RSS before (MiB) | VmPeak (MiB) | step (s, median) | "
            "samples/s |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for kind in KINDS:
        for n in ranks:
            res = results.get((kind, n))
            if not res:
                continue
            state = max(r["state"] for r in res)
            ideal = IDEAL[kind](n) * psi if kind in IDEAL else None
            step = float(np.median([np.median(r["step_s"][1:] or r["step_s"]) for r in res]))
            samples = batch if kind == "pipeline" else batch * n  # one replica: batch global
            rows.append(
                f"| {kind} | {n} | {state / MB:,.0f} | "
                f"{'' if ideal is None else f'{ideal / MB:,.0f}'} | {state / psi:.2f} | "
                f"{max(r['hwm'] for r in res) / MB:,.0f} | "
                f"{max(r.get('build_hwm', 0) for r in res) / MB:,.0f} | "
                f"{max(r['vmpeak'] for r in res) / MB:,.0f} | {step:.2f} | "
                f"{samples / step:,.1f} |")
    return "\n".join(rows)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--width", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=6, help="Dense layers (6 x 4096^2: 100.7 M)")
    ap.add_argument("--batch", type=int, default=8, help="samples per rank and step")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--ranks", default="1,2,4")
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--limit", action="store_true",
                    help="also: dense and stage 3 on 4 ranks under ulimit -v (the limit "
                         "between stage 3's measured address-space peak and dense's)")
    ap.add_argument("--timeout", type=float, default=900)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args)
        return
    ranks = [int(r) for r in args.ranks.split(",")]
    results = {}
    for i, kind in enumerate(args.kinds.split(",")):
        for n in ranks:
            res, proc = launch(kind, n, args, port=29517 + 10 * i + n)
            if res is None:
                print(f"{kind} on {n} ranks failed (exit {proc.returncode}):\n"
                      f"{proc.stderr[-1500:]}", file=sys.stderr)
            results[(kind, n)] = res
            print(f"done: {kind} x{n}", file=sys.stderr, flush=True)
    print(table(results, ranks, args.batch))
    if args.limit:
        limit_rows(results, args)


def limit_rows(results: dict, args) -> None:
    """The 4-rank runs under ``ulimit -v``: a quarter of the way from the lowest measured
    stage-3 address-space peak (the sliced build's when it ran) to dense's."""
    dense = results.get(("dense", 4))
    low_kind = next((k for k in ("stage3-sliced", "stage3") if results.get((k, 4))), None)
    if not dense or low_kind is None:
        print("--limit needs the dense and stage3 (or stage3-sliced) runs on 4 ranks")
        return
    low = max(r["vmpeak"] for r in results[(low_kind, 4)])
    high = min(r["vmpeak"] for r in dense)
    limit_kb = int((low + (high - low) * 0.25) / 1024)
    print(f"\nulimit -v {limit_kb} KiB ({limit_kb / 1024:,.0f} MiB) per rank, 4 ranks "
          f"({low_kind}'s measured address-space peak {low / MB:,.0f} MiB, dense's "
          f"{high / MB:,.0f} MiB):\n")
    print("| kind | ranks | result | exit status | last error line |")
    print("|---|---:|---|---:|---|")
    for kind in ("dense", "stage3", "stage3-sliced"):
        if not results.get((kind, 4)):
            continue
        res, proc = launch(kind, 4, args, limit_kb=limit_kb, port=29600)
        err = [ln for ln in proc.stderr.splitlines() if "Error" in ln][-1:] or [""]
        print(f"| {kind} | 4 | {'trained ' + str(args.steps) + ' steps' if res else 'failed'} "
              f"| {proc.returncode} | {err[0].strip()[:90]} |")


if __name__ == "__main__":
    main()
