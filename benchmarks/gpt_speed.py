"""Training and generation tokens/s of distnn's gpt_mini against the same model in PyTorch.

Training: one step = forward, token cross-entropy, backward, AdamW (and, on 2 ranks, the
gradient all-reduce: distnn's communicator over MPI, torch's DDP over gloo). Systems:
``distnn`` (default kernels: compiled numba beside BLAS), ``torch`` (eager) and
``torch.compile``, both with ``F.scaled_dot_product_attention`` (``gpt_torch.TorchGPT``,
the same weights). Modes: 1p1t (one process, one thread), 1p2t (one process, two
threads), 2r1t (two ranks of one thread). Each measurement is its own process (a fresh
thread set-up), the systems alternate within each repetition, and a cell is the median
over repetitions of each run's median step after the warm-up steps; tokens/s = global
batch x context / step time.

Generation: greedy, one sequence, a prompt of 8 tokens and ``--gen_tokens`` more, with the
key/value cache: ``distnn.cli.generate.generate`` against TorchGPT's cached decode (eager,
inference mode), one thread, each after a 4-token warm-up run (steady state: the compiled
kernels' loading is not counted).

Each cell is wall-clock tokens/s; the last column is the ratio by process CPU time of
rank 0's step (``time.process_time``), which a loaded host distorts less than the wall
clock (with two threads or a waiting rank it counts what the process burnt, not time).

The machine may be shared: each row records the 1-minute load average
(``os.getloadavg()``) when it ran; with a load above the core count every figure is a
share of a busy CPU, and only the ratios of alternated runs mean much.

    python benchmarks/gpt_speed.py                        # batch 16 x 64 tokens, 3 reps
    python benchmarks/gpt_speed.py --batch 32 --context 128 --reps 5 --modes 1p1t,2r1t
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
SYSTEMS = ("distnn", "torch", "torch.compile")
MODES = {"1p1t": (1, 1), "1p2t": (1, 2), "2r1t": (2, 1)}


def _distnn_steps(args, rank, size):
    from distnn import kernels
    from distnn.models import get_model
    from distnn.nn.losses import get_loss
    from distnn.optim import AdamW
    kernels.set_num_threads(args.threads)
    comm = None
    if size > 1:
        from distnn import distributed as dist
        comm = dist.init()
    model = get_model("gpt_mini", (args.context,), rng=0)
    opt = AdamW(model, lr=1e-3)
    loss = get_loss("cross_entropy")
    rng = np.random.default_rng(rank)
    grads = model.gradients_flat()
    times = []
    for _ in range(args.warmup + args.steps):
        x = rng.integers(0, 256, (args.batch, args.context))
        t0, c0 = time.perf_counter(), time.process_time()
        out = model.forward(x, training=True)
        _, dy = loss(out, x)
        model.backward(dy)
        if comm is not None:
            comm.allreduce_(grads, "sum")
        opt.step()
        times.append((time.perf_counter() - t0, time.process_time() - c0))
    return times


def _torch_steps(args, rank, size, compiled):
    import torch
    import torch.nn.functional as F
    sys.path.insert(0, str(HERE))
    from gpt_torch import distnn_init
    torch.set_num_threads(args.threads)
    net = distnn_init(args.context, 0)
    model = net
    if size > 1:
        import torch.distributed as dist
        dist.init_process_group("gloo", rank=rank, world_size=size)
        model = torch.nn.parallel.DistributedDataParallel(net)
    if compiled:
        model = torch.compile(model)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(rank)
    times = []
    for _ in range(args.warmup + args.steps):
        x = torch.randint(0, 256, (args.batch, args.context), generator=gen)
        t0, c0 = time.perf_counter(), time.process_time()
        out = model(x)
        loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), x.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        times.append((time.perf_counter() - t0, time.process_time() - c0))
    return times


def _generation(args) -> dict:
    import torch
    sys.path.insert(0, str(HERE))
    from gpt_torch import from_distnn
    from distnn import kernels
    from distnn.cli.generate import generate
    from distnn.models import get_model
    kernels.set_num_threads(1)
    torch.set_num_threads(1)
    positions = 8 + args.gen_tokens
    model = get_model("gpt_mini", (positions,), rng=0)
    prompt = np.arange(65, 73)
    net = from_distnn(model, positions).eval()

    def torch_greedy(n):
        with torch.inference_mode():
            caches = [{} for _ in net.blocks]
            ids = torch.from_numpy(prompt)[None]
            logits = net(ids, caches, 0)[0, -1]
            toks, start = [], ids.shape[1]
            for _ in range(n):
                toks.append(int(logits.argmax()))
                logits = net(torch.tensor([[toks[-1]]]), caches, start)[0, -1]
                start += 1
        return toks

    # one short run of each first: the compiled kernels load and the first calls'
    # set-up is paid outside the timed run (steady-state tokens/s)
    generate(model, prompt, 4, positions=positions, temperature=0)
    torch_greedy(4)
    out = {}
    t0, c0 = time.perf_counter(), time.process_time()
    ours = generate(model, prompt, args.gen_tokens, positions=positions, temperature=0)
    out["distnn"] = args.gen_tokens / (time.perf_counter() - t0)
    out["distnn_cpu"] = args.gen_tokens / (time.process_time() - c0)
    t0, c0 = time.perf_counter(), time.process_time()
    theirs = torch_greedy(args.gen_tokens)
    out["torch"] = args.gen_tokens / (time.perf_counter() - t0)
    out["torch_cpu"] = args.gen_tokens / (time.process_time() - c0)
    out["same_tokens"] = bool(np.array_equal(ours, theirs))
    return out


def worker(args) -> None:
    rank, size = int(os.environ.get("RANK", os.environ.get("OMPI_COMM_WORLD_RANK", 0))), 1
    size = int(os.environ.get("WORLD_SIZE", os.environ.get("OMPI_COMM_WORLD_SIZE", 1)))
    if args.system == "generate":
        print(json.dumps(_generation(args)))
        return
    if args.system == "distnn":
        times = _distnn_steps(args, rank, size)
    else:
        times = _torch_steps(args, rank, size, args.system == "torch.compile")
    if rank == 0:
        wall, cpu = np.median(np.array(times[args.warmup:]), axis=0)
        print(json.dumps({"step": float(wall), "cpu": float(cpu)}))


def _run(system, mode, args) -> tuple[float, float]:
    ranks, threads = MODES[mode]
    base = [sys.executable, str(Path(__file__).resolve()), "--worker", system,
            "--batch", str(args.batch), "--context", str(args.context), "--steps",
            str(args.steps), "--warmup", str(args.warmup), "--threads", str(threads)]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "OPENBLAS_NUM_THREADS": str(threads),
           "MKL_NUM_THREADS": str(threads)}
    if ranks == 1:
        cmd = base
    elif system == "distnn":
        mpiexec = Path(sys.executable).with_name("mpiexec")
        cmd = [str(mpiexec) if mpiexec.exists() else shutil.which("mpiexec") or "mpiexec",
               "-n", str(ranks), *base]
    else:  # torch's own launcher: DDP over gloo on 127.0.0.1
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node",
               str(ranks), "--master_addr", "127.0.0.1", "--master_port", "29519",
               *base[1:]]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    if p.returncode:
        raise RuntimeError(f"{system} {mode} failed:\n{p.stderr[-2000:]}")
    line = json.loads([s for s in p.stdout.splitlines() if s.startswith("{")][-1])
    return line["step"], line["cpu"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, default=16, help="per rank")
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--modes", default="1p1t,1p2t,2r1t")
    p.add_argument("--systems", default=",".join(SYSTEMS))
    p.add_argument("--gen_tokens", type=int, default=200)
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--system", default=None, help=argparse.SUPPRESS)
    p.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        args.system = args.worker
        worker(args)
        return 0
    systems = args.systems.split(",")
    print(f"gpt_mini training tokens/s, batch {args.batch}/rank x {args.context} tokens, "
          f"median of {args.reps} alternated runs (each the median of {args.steps} steps); "
          f"{os.cpu_count()} cores, shared: load = 1-min load average")
    print(f"| mode | load | {' | '.join(systems)} | distnn / best torch | the same by "
          "CPU time (rank 0) |")
    print("|---|---|" + "---|" * len(systems) + "---|---|")
    for mode in args.modes.split(","):
        ranks = MODES[mode][0]
        steps = {s: [] for s in systems}
        loads = []
        for _ in range(args.reps):
            for s in systems:
                loads.append(os.getloadavg()[0])
                steps[s].append(_run(s, mode, args))
        tokens = ranks * args.batch * args.context
        rate = {s: tokens / float(np.median([w for w, _ in v])) for s, v in steps.items()}
        cpu = {s: tokens / float(np.median([c for _, c in v])) for s, v in steps.items()}

        def ratio(r):
            best = max((v for s, v in r.items() if s != "distnn"), default=float("nan"))
            return r.get("distnn", float("nan")) / best
        cells = " | ".join(f"{rate[s]:,.0f}" for s in systems)
        print(f"| {mode} | {np.median(loads):.1f} | {cells} | {ratio(rate):.2f}x | "
              f"{ratio(cpu):.2f}x |", flush=True)
    gens = []
    for _ in range(args.reps):
        load = os.getloadavg()[0]
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "generate",
               "--gen_tokens", str(args.gen_tokens)]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
        out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
        if out.returncode:
            raise RuntimeError(out.stderr[-2000:])
        gens.append({**json.loads(out.stdout.splitlines()[-1]), "load": load})
    d = np.median([g["distnn"] for g in gens])
    t = np.median([g["torch"] for g in gens])
    dc = np.median([g["distnn_cpu"] for g in gens])
    tc = np.median([g["torch_cpu"] for g in gens])
    print(f"\ngeneration, greedy, {args.gen_tokens} tokens after 8, KV cache, 1 thread "
          f"(load {np.median([g['load'] for g in gens]):.1f}): distnn {d:,.0f} tokens/s, "
          f"torch {t:,.0f} tokens/s, {d / t:.2f}x (by CPU time: {dc:,.0f} against "
          f"{tc:,.0f}, {dc / tc:.2f}x); same tokens: "
          f"{all(g['same_tokens'] for g in gens)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
