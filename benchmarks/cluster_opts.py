"""Options of benchmarks/cluster.py that need no emulated cluster: the link-rate scaling of
N hosts on a few cores, the network-free rows (the same ranks on one host, through shared
memory) and time to target located by evaluations every K steps.

Link-rate scaling (issue 43, item 2): N emulated hosts x 1 rank on C cores give each rank
C/N of a core when N > C, so compute runs N/C times slower than on a one-core node while a
link does not; shaping the link to ``rate x C/N`` keeps the compute-to-communication ratio
of one-core nodes on the named link (8 hosts on 2 cores: 1 Gbit/s is shaped to 250 Mbit/s).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MPIEXEC = Path(sys.executable).parent / "mpiexec"
UNITS = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}
NETWORK_FREE = "shm"  # the "rate" of a network-free row


PARAMS = {"simplecnn": 149_210, "resnet20": 272_474, "vgg11bn": 9_753_674}
FMNIST_TRAIN, BATCH = 60_000, 64

CLUSTER = {"prefix": "bc", "net": 66}  # --prefix/--net move it (two benchmarks at once)


def cluster(hosts: int, rate: str | None):
    from distnn.cluster import EmulatedCluster
    return EmulatedCluster(hosts, rate=rate, cores="split", **CLUSTER)


def steps_run(args, hosts: int = 2) -> int:
    """Training steps of one accuracy run on ``hosts`` ranks (every rank takes each)."""
    per_epoch = -(-FMNIST_TRAIN // (BATCH * hosts))
    if args.steps_per_epoch:
        per_epoch = min(per_epoch, args.steps_per_epoch)
    return per_epoch * args.epochs


def crossed(sent: int, least: float, what: str) -> str | None:
    """None when ``sent`` bytes crossed the links, at least ``least``; else the failure."""
    if sent >= least and sent > 0:
        return None
    return (f"only {sent} bytes crossed the links, {what} need at least {least:.0f}: the "
            "run did not train over the network")


def parse_rate(rate: str) -> float:
    """Bits per second of a tc rate such as '1gbit', '250mbit', '1.5gbit'."""
    m = re.fullmatch(r"([0-9]*\.?[0-9]+)([kmg]?)bit", str(rate).strip().lower())
    if not m:
        raise ValueError(f"rate {rate!r}: give NUMBER[k|m|g]bit, e.g. 1gbit or 250mbit")
    return float(m.group(1)) * UNITS[m.group(2)]


def format_rate(bits: float) -> str:
    """The shortest exact tc spelling of ``bits`` per second (whole kbit at least)."""
    for unit in ("g", "m", "k"):
        value = bits / UNITS[unit]
        if value >= 1 and abs(value - round(value)) < 1e-9:
            return f"{round(value)}{unit}bit"
    return f"{round(bits / 1e3)}kbit"


def least_bytes(compression: str, rule: str | None = None) -> float:
    """Bytes per parameter a step's exchange puts on the wire at least: 4 dense, 2 fp16,
    0.004 for top-k/PowerSGD (simplecnn's powersgd:2 sends ~0.1; only 'nothing crossed'
    is to be caught), and for a rule other than data (its exchanges every K steps or with
    a probability: only 'nothing crossed' is caught)."""
    if rule not in (None, "data"):
        return 0.004
    return {"none": 4.0, "ddp": 4.0, "fp16": 2.0}.get(compression, 0.004)


def cores() -> int:
    return len(os.sched_getaffinity(0))


def link_rate(rate: str | None, hosts: int, scale: bool, ncores: int | None = None):
    """The rate to shape ``hosts`` hosts' links to: ``rate`` x min(1, cores / hosts) when
    ``scale``, else ``rate`` (None and the network-free row pass through)."""
    if rate in (None, NETWORK_FREE) or not scale:
        return rate
    share = min(1.0, (ncores or cores()) / hosts)
    return format_rate(parse_rate(rate) * share)


def rate_label(rate: str | None, hosts: int, scale: bool) -> str:
    """How a table names a row's link: 'one host (shared memory)', '1gbit' or
    '1gbit as 250mbit' (scaled)."""
    if rate == NETWORK_FREE:
        return "one host (shared memory)"
    if rate is None:
        return "one host"
    shaped = link_rate(rate, hosts, scale)
    return rate if shaped == rate else f"{rate} as {shaped}"


def time_to_target(step_evals: list[dict], target: float) -> dict:
    """From the evaluations every K steps: the first step whose held-out accuracy reaches
    ``target`` and the training time (evaluations excluded) to it; None when none does."""
    hit = next((r for r in step_evals if r["accuracy"] >= target), None)
    return {"step_to_target": hit and hit["step"],
            "time_to_target_steps": hit and hit["train_s"],
            "evals": len(step_evals),
            "curve": [[r["train_s"], r["accuracy"]] for r in step_evals]}


def local_env() -> dict:
    return dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
                MKL_NUM_THREADS="1")


def run_rule_local(ranks: int, rule: str, options: dict, args, out: Path) -> dict:
    """The network-free row of the accuracy part: ``ranks`` ranks of benchmarks/rules.py on
    this host (MPI through shared memory), the same recipe as the cluster rows."""
    cmd = [str(MPIEXEC), "-n", str(ranks), sys.executable, str(HERE / "rules.py"), "--run",
           rule, "--out", str(out), "--epochs", str(args.epochs), "--batch", "64", "--lr",
           "0.01", "--options", json.dumps(options), "--steps-per-epoch",
           str(args.steps_per_epoch), *eval_args(args)]
    t = time.perf_counter()
    proc = subprocess.run(cmd, env=local_env(), capture_output=True, text=True,
                          timeout=3600, cwd=ROOT)
    wall = time.perf_counter() - t
    if proc.returncode != 0 or not out.exists():
        return {"error": (proc.stderr or proc.stdout).strip().splitlines()[-1:]}
    res = json.loads(out.read_text())
    hist = res["history"]
    reach = next((h for h in hist if h["val_accuracy"] >= args.target), None)
    return {"epochs_to_target": reach and reach["epoch"],
            "time_to_target": reach and sum(h["time"] for h in hist
                                            if h["epoch"] <= reach["epoch"]),
            "final_acc": hist[-1]["val_accuracy"], "wall": wall, "epochs": len(hist),
            "bytes_per_epoch": 0, "bytes_per_step": 0,
            **time_to_target(res.get("step_evals", []), args.target)}


def eval_args(args) -> list[str]:
    """rules.py's options for evaluations every K steps (none when --eval-every is 0)."""
    if not getattr(args, "eval_every", 0):
        return []
    return ["--eval-every", str(args.eval_every), "--eval-samples", str(args.eval_samples)]


def throughput_worker(model: str, args, master: str = "127.0.0.1") -> list[str]:
    """The throughput part's worker command (one rank; the launcher goes before it):
    distnn's, or with ``--compression ddp`` PyTorch DDP's (gloo, rendezvous at
    ``master``: rank 0's address), the same model, batch and step counts."""
    if getattr(args, "compression", "none") == "ddp":
        return [sys.executable, str(HERE / "workers" / "torch_worker.py"), "--model", model,
                "--threads", "1", "--warmup", str(args.warmup), "--windows",
                str(args.windows), "--steps", str(args.steps), "--ddp", "--master-addr",
                master, "--port", "29581"]
    rule = getattr(args, "parallel", None)
    return [sys.executable, str(HERE / "workers" / "distnn_worker.py"), "--model", model,
            "--threads", "1", "--warmup", str(args.warmup), "--windows", str(args.windows),
            "--steps", str(args.steps), "--compression", getattr(args, "compression", "none"),
            "--bucket-mb", str(getattr(args, "bucket_mb", 4.0)),
            *(["--rule", rule, "--rule-options", getattr(args, "rule_options", "{}")]
              if rule else [])]


def run_throughput_local(model: str, ranks: int, args) -> dict:
    """The network-free row of the throughput part: the same worker, ``ranks`` ranks on
    this host through shared memory."""
    cmd = [str(MPIEXEC), "-n", str(ranks)] + throughput_worker(model, args)
    proc = subprocess.run(cmd, env=local_env(), capture_output=True, text=True,
                          timeout=1800, cwd=ROOT)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("BENCH_JSON ")), None)
    if proc.returncode != 0 or line is None:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:]
        return {"error": f"exit {proc.returncode}: {tail}"}
    rec = json.loads(line[len("BENCH_JSON "):])
    rec.update(bytes_per_step=0.0, steal=0.0, load=os.getloadavg())
    return rec
