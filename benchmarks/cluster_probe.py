"""What one exchange costs on the emulated cluster's links, measured: the inputs of the cost
model's check (benchmarks/simgrid_scale.py --emulated) that are not the compute.

For N hosts x 1 rank on a link rate (shaped as benchmarks/cluster.py shapes it), one MPI
job times, through distnn's own communicator (``MPIComm``, in place, as the Reducer
calls it), the median of many blocking all-reduces of each size in ``--sizes`` bytes
(float32) and of a 4-byte ping-pong, and prints them next to what the analytic model
(``collectives.allreduce_time``) says on the same link with ``--latency-us``. Rows of the
same sizes through shared memory (no link) come first.

    python benchmarks/cluster_probe.py --hosts 2 4 --rates 1gbit 10gbit --scale-links \\
        --json probe.json

The 4-byte all-reduce of 2 hosts gives the link's latency per message (recursive
doubling: one exchange, ``α``): pass it to the check as ``--latency-us``.

``--compute``: the compute of N hosts on this machine's cores, without any exchange: N
copies of the one-process step (benchmarks/workers/distnn_worker.py, one thread) run at
once, each pinned to the cores its emulated host would get (``cores=split``), every step
timed; per N the mean step of a copy and the mean over steps of the slowest copy's step
(a synchronous step waits for the slowest rank: the straggler's share).

``--ranks-per-host R`` (default 1): N hosts x R ranks. The exchanges run R ranks on every
emulated host (the network-free rows: N x R ranks on one host), and the "model" column is
the flat all-reduce of N x R ranks on the link (it knows no hosts); the ping-pong is rank 0 with
rank R (host 2's first rank: it crosses the link); ``--compute`` runs R
copies on each host's cores (N x R copies at once). The JSON file's ``meta`` holds
``ranks_per_host`` (all options are there); row keys stay ``N/rate`` and ``compute/N``
with N the hosts; files without the key are R = 1.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

try:
    from benchmarks import cluster_opts as opts
except ImportError:  # run as a script: benchmarks/ is on sys.path
    import cluster_opts as opts

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MARKER = "PROBE_JSON "
SIZES = [4, 1912, 10528, 65536, 596840]


def worker(sizes: list[int], seconds: float, peer: int = 1) -> None:
    """One rank: time every size's all-reduce (and the ping-pong), rank 0 prints."""
    import numpy as np

    from distnn import distributed as dist
    comm = dist.init()
    out = {"ranks": comm.size, "allreduce_s": {}, "pingpong_s": None}
    for nbytes in sizes:
        buf = np.ones(max(1, nbytes // 4), np.float32)
        for _ in range(5):
            comm.allreduce_(buf)
        times, t_end = [], None
        while True:
            comm.barrier()
            t0 = time.perf_counter()
            comm.allreduce_(buf)
            times.append(time.perf_counter() - t0)
            # every rank stops after the same count: rank 0 decides
            stop = comm.bcast_obj(t_end is not None and time.perf_counter() > t_end
                                  or len(times) >= 2000)
            if t_end is None:
                t_end = time.perf_counter() + seconds
            if stop:
                break
        out["allreduce_s"][str(nbytes)] = comm.allgather_obj(statistics.median(times))
    peer = peer if peer < comm.size else 1  # rank 0's partner: host 2's first rank
    if comm.size >= 2:
        one = np.zeros(1, np.float32)
        times = []
        for i in range(205):
            comm.barrier()
            t0 = time.perf_counter()
            if comm.rank == 0:
                comm.send_(one, peer)
                comm.recv_(one, peer)
            elif comm.rank == peer:
                comm.recv_(one, 0)
                comm.send_(one, 0)
            if i >= 5:
                times.append(time.perf_counter() - t0)
        out["pingpong_s"] = statistics.median(times) if comm.rank == 0 else None
    if comm.rank == 0:
        print(MARKER + json.dumps(out), flush=True)


def probe(hosts: int, rate: str, args) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--sizes",
           *map(str, args.sizes), "--seconds", str(args.seconds),
           "--ranks-per-host", str(args.ranks_per_host)]
    if rate == opts.NETWORK_FREE:
        proc = subprocess.run([str(opts.MPIEXEC), "-n", str(hosts * args.ranks_per_host), *cmd],
                              env=opts.local_env(), capture_output=True, text=True,
                              timeout=600, cwd=ROOT)
    else:
        with opts.cluster(hosts, opts.link_rate(rate, hosts, args.scale_links)) as c:
            before = c.link_bytes()
            proc = subprocess.run(c.mpiexec(cmd, ranks_per_host=args.ranks_per_host),
                                  env=c.env(opts.local_env()),
                                  capture_output=True, text=True, timeout=600, cwd=ROOT)
            from distnn.cluster import total_sent
            sent = total_sent(before, c.link_bytes())
        if sent < sum(args.sizes):
            return {"error": f"only {sent} bytes crossed the links"}
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith(MARKER)), None)
    if proc.returncode != 0 or line is None:
        return {"error": (proc.stderr or proc.stdout).strip().splitlines()[-1:]}
    return json.loads(line[len(MARKER):])


def compute_copies(n: int, args) -> dict:
    """N x R uncoupled copies of the one-process step at once, pinned as N emulated hosts
    (R = ``args.ranks_per_host`` copies share each host's cores)."""
    import os
    cpus = sorted(os.sched_getaffinity(0))
    if n >= len(cpus):
        sets = [[cpus[i % len(cpus)]] for i in range(n)]
    else:
        share = len(cpus) // n
        sets = [cpus[i * share:(i + 1) * share] for i in range(n)]
    rph = getattr(args, "ranks_per_host", 1)
    sets = [cores for cores in sets for _ in range(rph)]
    cmd = [sys.executable, str(HERE / "workers" / "distnn_worker.py"), "--model",
           args.model, "--threads", "1", "--warmup", "20", "--windows", str(args.steps),
           "--steps", "1", "--compression", "none"]
    procs = [subprocess.Popen(["taskset", "-c", ",".join(map(str, cores)), *cmd],
                              env=opts.local_env(), stdout=subprocess.PIPE, text=True,
                              cwd=ROOT) for cores in sets]
    steps = []
    for proc in procs:
        out, _ = proc.communicate(timeout=600)
        line = next((ln for ln in out.splitlines() if ln.startswith("BENCH_JSON ")), None)
        if proc.returncode != 0 or line is None:
            return {"error": f"a copy exited {proc.returncode}"}
        steps.append(json.loads(line[len("BENCH_JSON "):])["step_s"])
    k = min(map(len, steps))
    return {"copies": len(sets), "hosts": n, "ranks_per_host": rph,
            "mean_s": statistics.mean(t for one in steps for t in one[:k]),
            "median_s": statistics.median(t for one in steps for t in one[:k]),
            "max_mean_s": statistics.mean(max(one[i] for one in steps) for i in range(k))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--rates", nargs="+", default=["1gbit", "10gbit"])
    ap.add_argument("--sizes", type=int, nargs="+", default=SIZES, help="bytes")
    ap.add_argument("--seconds", type=float, default=1.5, help="per size")
    ap.add_argument("--scale-links", action="store_true")
    ap.add_argument("--ranks-per-host", type=int, default=1, metavar="R",
                    help="R ranks on every emulated host (--compute: R copies a host)")
    ap.add_argument("--latency-us", type=float, default=50.0,
                    help="the model's α for the 'model' column")
    ap.add_argument("--compute", action="store_true", help="the compute of N hosts "
                    "(N uncoupled one-process copies at once) instead of the exchanges")
    ap.add_argument("--model", default="simplecnn")
    ap.add_argument("--steps", type=int, default=300, help="--compute: timed steps a copy")
    ap.add_argument("--json")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.sizes, args.seconds, peer=args.ranks_per_host)
        return
    from distnn.cluster import unavailable_reason
    from distnn.costmodel.collectives import Link, allreduce_time
    why = unavailable_reason()
    if why:
        sys.exit(f"benchmarks/cluster_probe.py: {why}")
    rows = {}
    if args.compute:
        print(f"| copies (hosts x {args.ranks_per_host}) | mean step ms | median step ms | "
              "slowest copy's step, mean ms |")
        print("|---|---|---|---|")
        for h in sorted({1, *args.hosts}):
            rec = rows[f"compute/{h}"] = compute_copies(h, args)
            print(f"| {h} | failed: {rec['error']} | | |" if "error" in rec else
                  f"| {h} | {rec['mean_s'] * 1e3:.2f} | {rec['median_s'] * 1e3:.2f} | "
                  f"{rec['max_mean_s'] * 1e3:.2f} |", flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps({"meta": vars(args), "rows": rows},
                                                  indent=1))
        return
    print("| hosts | link (as shaped) | what | bytes | measured us (slowest rank) | "
          "model us |")
    print("|---|---|---|---|---|---|")
    for rate in [opts.NETWORK_FREE, *args.rates]:
        for h in args.hosts:
            rec = probe(h, rate, args)
            rows[f"{h}/{rate}"] = rec
            label = opts.rate_label(rate, h, args.scale_links)
            if "error" in rec:
                print(f"| {h} | {label} | failed: {rec['error']} | | | |", flush=True)
                continue
            shaped = opts.link_rate(rate, h, args.scale_links)
            link = (None if rate == opts.NETWORK_FREE else
                    Link(opts.parse_rate(shaped) / 1e9, args.latency_us * 1e-6))
            for nbytes, per_rank in rec["allreduce_s"].items():
                ranks = h * args.ranks_per_host
                model = (f"{allreduce_time(int(nbytes), ranks, link)[0] * 1e6:.0f}"
                         if link else "-")
                print(f"| {h} | {label} | all-reduce | {nbytes} | "
                      f"{max(per_rank) * 1e6:.0f} | {model} |")
            if rec.get("pingpong_s"):
                print(f"| {h} | {label} | ping-pong (round trip) | 4 | "
                      f"{rec['pingpong_s'] * 1e6:.0f} | "
                      f"{2 * args.latency_us if link else '-'} |", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"meta": vars(args), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
