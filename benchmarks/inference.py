"""Inference throughput: ``distnn predict`` on 1 and 2 ranks against PyTorch's fastest
inference mode and onnxruntime, on the same model with the same weights.

    python benchmarks/inference.py                                # resnet20, vgg11bn; 3 reps
    python benchmarks/inference.py --models resnet20 --reps 5 --markdown
    python benchmarks/inference.py --quick                        # smoke run, not a measurement

The model is a zoo model with fixed random weights (seed 0, batch norms with non-trivial
running statistics); the peers get it from distnn's own exporters: ``Model.to_torch()``
(the same layers, weights copied) and ``Model.to_onnx()`` (the file onnxruntime serves).
Each measurement is a fresh process (``mpiexec -n 2`` for 2 ranks) with its threads fixed
before numpy/torch load; systems alternate within each repetition.

* ``distnn``: ``distnn.training.predict`` over a dataset, what ``distnn predict`` runs: the
  ranks split every global batch and gather the outputs in dataset order on every rank
  (``2r1t``: 2 ranks x 1 thread; ``1p1t``/``1p2t``: 1 process with 1/2 threads).
* ``torch``: ``torch.inference_mode()``, in each of eager, channels_last and torch.compile
  (compile time, its first call, is not counted); the row that counts is the fastest.
* ``onnxruntime``: an ``InferenceSession`` of the exported file (all graph optimizations,
  ``intra_op_num_threads`` = the threads, CPU provider).

Every system predicts ``--samples`` samples in batches of ``--batch`` (per global batch),
after one untimed pass of ``--warmup`` batches; samples/s is the median over ``--windows``
passes and over repetitions. The ratio is distnn ÷ the fastest peer on the same cores (the
2-rank row is set against the peers with 2 threads).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARKER = "INFER_JSON "
SHAPES = {"resnet20": (3, 32, 32), "vgg11bn": (3, 32, 32), "lenet": (1, 28, 28),
          "simplecnn": (1, 28, 28), "alexnet_cifar": (3, 32, 32)}
CONFIGS = {"1p1t": (1, 1), "1p2t": (1, 2), "2r1t": (2, 1)}  # name -> (ranks, threads)
TORCH_MODES = ("eager", "channels_last", "compile")


def _model(name: str):
    import numpy as np

    from distnn.models import get_model
    from distnn.nn import BatchNormalization
    model = get_model(name, input_shape=SHAPES[name], rng=0)
    rng = np.random.default_rng(0)
    for layer in model.walk():
        if isinstance(layer, BatchNormalization):
            c = layer.buffers["running_mean"].shape
            layer.buffers["running_mean"][...] = rng.normal(0, 0.1, c)
            layer.buffers["running_var"][...] = rng.uniform(0.5, 1.5, c)
    return model


def _data(name: str, n: int):
    import numpy as np
    x = np.random.default_rng(1).standard_normal((n, *SHAPES[name]), dtype=np.float32)
    return x, np.zeros(n, np.int64)


def _passes(run, windows: int, samples: int) -> list[float]:
    rates = []
    for _ in range(windows):
        t0 = time.perf_counter()
        run()
        rates.append(samples / (time.perf_counter() - t0))
    return rates


def worker(a) -> None:
    """One measurement (this process, or each rank of one under mpiexec)."""
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(a.threads)
    x, y = _data(a.model, a.samples)
    model = _model(a.model)
    warm = x[:a.batch * a.warmup]
    result = {"system": a.system, "model": a.model, "threads": a.threads}
    if a.system == "distnn":
        from distnn import distributed as dist
        from distnn.data import ArrayDataset
        from distnn.run.threads import apply_threads
        from distnn.training import predict
        comm = dist.init()
        apply_threads(a.threads)
        data, few = ArrayDataset(x, y, 10), ArrayDataset(warm, y[:len(warm)], 10)
        gbs = a.batch  # per global batch, as the peers
        predict(model, comm, few, batch_size=max(1, gbs // comm.size))

        def run():
            comm.barrier()
            predict(model, comm, data, batch_size=max(1, gbs // comm.size))
        rates = _passes(run, a.windows, a.samples)
        result["ranks"] = comm.size
        if comm.rank != 0:
            return
    elif a.system.startswith("torch"):
        import torch
        torch.set_num_threads(a.threads)
        mode = a.system.split("-", 1)[1] if "-" in a.system else "eager"
        module = model.to_torch()
        xt = torch.from_numpy(x)
        if mode == "channels_last":
            module = module.to(memory_format=torch.channels_last)
            xt = xt.contiguous(memory_format=torch.channels_last)
        if mode == "compile":
            t0 = time.perf_counter()
            module = torch.compile(module)
            with torch.inference_mode():
                module(xt[:a.batch])
            result["compile_s"] = time.perf_counter() - t0

        def run():
            with torch.inference_mode():
                for i in range(0, len(xt), a.batch):
                    module(xt[i:i + a.batch])
        with torch.inference_mode():
            for i in range(0, len(warm), a.batch):
                module(xt[i:i + a.batch])
        rates = _passes(run, a.windows, a.samples)
    else:
        import tempfile

        import onnxruntime as ort
        opts = ort.SessionOptions()
        opts.intra_op_num_threads, opts.inter_op_num_threads = a.threads, 1
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        with tempfile.TemporaryDirectory() as folder:
            path = model.to_onnx(os.path.join(folder, "m.onnx"))
            session = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])

        def run():
            for i in range(0, len(x), a.batch):
                session.run(None, {"input": x[i:i + a.batch]})
        for i in range(0, len(warm), a.batch):
            session.run(None, {"input": warm[i:i + a.batch]})
        rates = _passes(run, a.windows, a.samples)
    result["rates"] = rates
    print(MARKER + json.dumps(result), flush=True)


def _command(a, system: str, model: str, ranks: int, threads: int) -> list[str]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", system, "--model", model,
           "--threads", str(threads), "--samples", str(a.samples), "--batch", str(a.batch),
           "--warmup", str(a.warmup), "--windows", str(a.windows)]
    if ranks > 1:
        mpiexec = shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or "mpiexec"
        cmd = [mpiexec, "-n", str(ranks), *cmd]
    return cmd


def _run(cmd, threads: int, timeout: float):
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}",
           "OMP_NUM_THREADS": str(threads), "OPENBLAS_NUM_THREADS": str(threads),
           "MKL_NUM_THREADS": str(threads)}
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, "timed out"
    for line in proc.stdout.splitlines():
        if line.startswith(MARKER):
            return json.loads(line[len(MARKER):]), ""
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    return None, f"exit {proc.returncode}: {tail[:200]}"


def _cells(a):
    """(model, config, system) of every measurement: distnn in every config, the peers in
    the one-process ones."""
    peers = ["onnxruntime"] + [f"torch-{m}" if m != "eager" else "torch" for m in a.torch_modes]
    for model in a.models:
        for config in a.configs:
            ranks, threads = CONFIGS[config]
            for system in ["distnn"] + (peers if ranks == 1 else []):
                yield model, config, system
            peer_config = f"1p{ranks * threads}t"  # a multi-rank row's peers, same cores
            if ranks > 1 and peer_config not in a.configs:
                for system in peers:
                    yield model, peer_config, system


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="resnet20,vgg11bn")
    ap.add_argument("--configs", default="1p1t,1p2t,2r1t")
    ap.add_argument("--torch-modes", default=",".join(TORCH_MODES))
    ap.add_argument("--samples", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--windows", type=int, default=3)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    ap.add_argument("--markdown", action="store_true", help="(the table is Markdown anyway)")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--model", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        a.system = a.worker
        worker(a)
        return 0
    if a.quick:
        a.samples, a.batch, a.warmup, a.windows, a.reps = 64, 32, 1, 1, 1
    a.models = a.models.split(",")
    a.configs = a.configs.split(",")
    a.torch_modes = [m for m in a.torch_modes.split(",") if m]
    bad = [m for m in a.models if m not in SHAPES] + [c for c in a.configs if c not in CONFIGS]
    if bad:
        ap.error(f"unknown models/configs {bad}; models: {sorted(SHAPES)}, configs: "
                 f"{sorted(CONFIGS)}")
    rates: dict[tuple, list[float]] = {}
    notes: list[str] = []
    cells = list(_cells(a))
    for rep in range(a.reps):
        for model, config, system in cells:
            ranks, threads = CONFIGS[config]
            got, why = _run(_command(a, system, model, ranks, threads), threads, a.timeout)
            if got is None:
                notes.append(f"SKIP {model} {config} {system} (rep {rep + 1}): {why}")
                print(notes[-1], file=sys.stderr, flush=True)
                continue
            rates.setdefault((model, config, system), []).extend(got["rates"])
            if "compile_s" in got:
                notes.append(f"{model} {config} {system}: compile {got['compile_s']:.1f} s "
                             "(not counted)")
    print(f"Inference, samples/s (median over {a.reps} rep(s) x {a.windows} pass(es) of "
          f"{a.samples} samples, batch {a.batch}); ratio = distnn ÷ the fastest peer on the "
          "same cores\n")
    print("| model | config | system | samples/s | IQR | distnn ÷ system |")
    print("|---|---|---|---:|---:|---:|")
    for model in a.models:
        for config in a.configs:
            ranks, threads = CONFIGS[config]
            peer_config = f"1p{ranks * threads}t"
            mine = rates.get((model, config, "distnn"))
            med = statistics.median(mine) if mine else None
            peers = {s: statistics.median(v) for (m, c, s), v in rates.items()
                     if m == model and c == peer_config and s != "distnn"}
            own = config == peer_config or peer_config not in a.configs
            rows = [("distnn", config, mine)] + (
                [(s, peer_config, rates[(model, peer_config, s)]) for s in sorted(peers)]
                if own else [])
            for system, where, values in rows:
                if not values:
                    print(f"| {model} | {where} | {system} | failed | - | - |")
                    continue
                m = statistics.median(values)
                q = statistics.quantiles(values, n=4) if len(values) > 1 else [m, m, m]
                ratio = f"{med / m:.2f}" if med and system != "distnn" else "-"
                print(f"| {model} | {where} | {system} | {m:,.0f} | {q[2] - q[0]:,.0f} | "
                      f"{ratio} |")
            if peers and med:
                best = max(peers, key=peers.get)
                print(f"| {model} | {config} | **distnn ÷ fastest peer** ({best} "
                      f"{peer_config}) | | | **{med / peers[best]:.2f}** |")
    for note in notes:
        print(f"\n{note}", end="")
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
