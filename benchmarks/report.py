"""What ``python -m benchmarks`` reports: pooled medians per (model, config, system),
the tables, the ratios against every peer and against the fastest PyTorch mode, the
targets each run is judged by, and the Markdown report."""
from __future__ import annotations

import argparse
import os
import re
import shlex
import statistics
import sys

from .host import machine_info

MODE_SUFFIX = {"eager": "", "channels_last": "-cl", "compile": "-compile"}


TORCH_SYSTEMS = tuple("torch" + s for s in MODE_SUFFIX.values())


DDP_SYSTEMS = tuple("torch-ddp" + s for s in MODE_SUFFIX.values())


# Targets of issue 13 (ratios of medians, same run).
ENGINE_TARGET = {"simplecnn": 1.0, "lenet": 1.0, "vgg11bn": 1.0, "resnet20": 1.0,
                 "simplecnn_pydtnn": 1.0}


ENGINE_TARGET_1T = {"simplecnn": 1.5, "lenet": 1.5}  # stricter at 1 process x 1 thread


PYDTNN_TARGET = 3.0  # 1p1t


DDP_TARGET = {"simplecnn": 1.3, "lenet": 1.3, "vgg11bn": 1.3, "resnet20": 1.3,
              "simplecnn_pydtnn": 1.3}


SCALING_TARGET = 0.9


SCALING_MODELS = ("vgg11bn", "resnet20")


THREADS_TARGET = 1.6  # distnn 1p2t ÷ 1p1t


BEST_TARGET = 1.0  # distnn ÷ the fastest PyTorch mode (issue 39), every model and config


THREADS_MODELS = ("resnet20", "vgg11bn")


def parse_config(name: str) -> tuple[int, int]:
    """'1p2t' -> (1 rank, 2 threads); '2r1t' -> (2 ranks, 1 thread each)."""
    m = re.fullmatch(r"(\d+)([pr])(\d+)t", name)
    if not m or int(m.group(1)) < 1 or int(m.group(3)) < 1 or (m.group(2) == "p"
                                                               and m.group(1) != "1"):
        raise argparse.ArgumentTypeError(
            f"config {name!r} must look like 1p<T>t (1 process, T threads) or <R>r<T>t "
            "(R ranks x T threads), e.g. 1p1t, 1p2t, 2r1t")
    return int(m.group(1)), int(m.group(3))


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def quantile(xs, q):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    pos = q * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


# ----------------------------------------------------------------------------- summary
def summarize(runs):
    sps = [v for r in runs for v in r["samples_per_s"]]
    step = [v for r in runs for v in r["step_s"]]
    comm = [v for r in runs for v in r["comm_wait_s"]]
    nranks = len(runs[0]["peak_rss_mib"])
    rss = [median([r["peak_rss_mib"][k] for r in runs]) for k in range(nranks)]
    med = median(sps)
    return {"sps": med, "iqr_pct": 100 * (quantile(sps, .75) - quantile(sps, .25)) / med,
            "step_ms": 1e3 * median(step), "comm_ms": 1e3 * median(comm),
            "compute_ms": 1e3 * median([s - c for s, c in zip(step, comm)]),
            "rss": rss, "rss_max": max(rss), "windows": len(sps), "runs": len(runs),
            "others": max(r["others_cores"] for r in runs)}


def fmt_ratio(x):
    return "—" if x is None else f"{x:.2f}x"


def build_tables(args, results, errors):
    summ = {k: summarize(v) for k, v in results.items()}
    rows = ["| model | config | system | samples/s | IQR | distnn ÷ system | step ms | "
            "compute ms | comm wait ms | peak RSS/rank MiB | windows | others' load |",
            "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    order = ["distnn", *TORCH_SYSTEMS, *DDP_SYSTEMS, "pydtnn"]
    for model in args.models:
        for config in args.configs:
            base = summ.get((model, config, "distnn"))
            for system in order:
                key = (model, config, system)
                if key in errors and key not in summ:
                    rows.append(f"| {model} | {config} | {system} | error | | | | | | | | |")
                    continue
                s = summ.get(key)
                if s is None:
                    continue
                ratio = (base["sps"] / s["sps"]) if base and system != "distnn" else None
                rows.append(
                    f"| {model} | {config} | {system} | {s['sps']:.0f} | {s['iqr_pct']:.0f}% "
                    f"| {fmt_ratio(ratio)} | {s['step_ms']:.2f} | {s['compute_ms']:.2f} | "
                    f"{s['comm_ms']:.2f} | {' / '.join(f'{m:.0f}' for m in s['rss'])} | "
                    f"{s['windows']} | {s['others']:.2f} |")
    best = []
    for model in args.models:
        for config in args.configs:
            base = summ.get((model, config, "distnn"))
            peer = best_torch(summ, model, config)
            if base and peer:
                best.append(f"| {model} | {config} | {peer[0]} | {peer[1]['sps']:.0f} | "
                            f"{base['sps']:.0f} | {base['sps'] / peer[1]['sps']:.2f}x |")
    if best:
        rows += ["", "Against the fastest PyTorch mode of each model and config:", "",
                 "| model | config | fastest PyTorch | its samples/s | distnn samples/s | "
                 "distnn ÷ it |", "|---|---|---|---:|---:|---:|"] + best
    compile_s = [(k, median([r["first_step_s"] for r in v])) for k, v in results.items()
                 if k[2].endswith("-compile") and all("first_step_s" in r for r in v)]
    if compile_s:
        rows += ["", "torch.compile's compile time (the first warm-up step, median over "
                 "repetitions; not in samples/s): " + ", ".join(
                     f"{m} {c} {s:.1f} s" for (m, c, _), s in compile_s)]
    return summ, "\n".join(rows)


def best_torch(summ, model, config):
    """(system, summary) of the fastest PyTorch mode measured on (model, config)."""
    ranks, _ = parse_config(config)
    found = [(s, summ[(model, config, s)]) for s in
             (TORCH_SYSTEMS if ranks == 1 else DDP_SYSTEMS) if (model, config, s) in summ]
    return max(found, key=lambda item: item[1]["sps"]) if found else None


def target_rows(args, summ):
    """[(target, value text, status)] for every target the run has data for."""
    out = []

    def ratio(model, config, peer):
        a, b = summ.get((model, config, "distnn")), summ.get((model, config, peer))
        return (a["sps"] / b["sps"]) if a and b else None

    def judge(name, value, target, unit="x"):
        if value is None:
            return
        if value >= target:
            status = f"met (+{100 * (value / target - 1):.0f}% margin)"
        else:
            status = (f"**MISSED** by {target - value:.2f}{unit} "
                      f"({100 * (1 - value / target):.0f}% short)")
        out.append((name, f"{value:.2f}{unit} (target ≥ {target:g}{unit})", status))

    def judge_best(model, config):
        peer, a = best_torch(summ, model, config), summ.get((model, config, "distnn"))
        if peer and a:
            judge(f"engine {config} {model}: distnn ÷ fastest PyTorch ({peer[0]})",
                  a["sps"] / peer[1]["sps"], BEST_TARGET)

    for config in args.configs:
        ranks, threads = parse_config(config)
        if ranks != 1:
            continue
        for model, tgt in ENGINE_TARGET.items():
            if config == "1p1t":
                tgt = ENGINE_TARGET_1T.get(model, tgt)
            judge(f"engine {config} {model}: distnn ÷ torch eager",
                  ratio(model, config, "torch"), tgt)
            judge_best(model, config)
        if config == "1p1t":
            judge(f"engine {config} simplecnn (PyDTNN's): distnn ÷ PyDTNN",
                  ratio("simplecnn_pydtnn", config, "pydtnn"), PYDTNN_TARGET)
        if threads > 1 and "1p1t" in args.configs:
            for model in THREADS_MODELS:
                a, b = summ.get((model, config, "distnn")), summ.get((model, "1p1t", "distnn"))
                if a and b:
                    judge(f"threads 1p1t → {config} {model}: distnn speed-up",
                          a["sps"] / b["sps"], THREADS_TARGET)
    for config in args.configs:
        ranks, threads = parse_config(config)
        if ranks == 1:
            continue
        for model, tgt in DDP_TARGET.items():
            judge(f"{config} {model}: distnn ÷ torch DDP (gloo)",
                  ratio(model, config, "torch-ddp"), tgt)
            judge_best(model, config)
        if threads == 1 and "1p1t" in args.configs:
            for model in SCALING_MODELS:
                a, b = summ.get((model, config, "distnn")), summ.get((model, "1p1t", "distnn"))
                if a and b:
                    judge(f"scaling 1p1t → {config} {model}: distnn efficiency",
                          a["sps"] / (ranks * b["sps"]), SCALING_TARGET, unit="")
    for (model, config, system), s in sorted(summ.items()):
        if system != "distnn":
            continue
        ranks, _ = parse_config(config)
        peer = summ.get((model, config, "torch" if ranks == 1 else "torch-ddp"))
        if not peer:
            continue
        over = s["rss_max"] / peer["rss_max"] - 1
        name = f"peak RSS/rank {model} {config}: distnn ≤ {'torch' if ranks == 1 else 'DDP'}"
        value = f"{s['rss_max']:.0f} vs {peer['rss_max']:.0f} MiB"
        status = (f"met ({-100 * over:.0f}% less)" if over <= 0
                  else f"**MISSED** by {s['rss_max'] - peer['rss_max']:.0f} MiB "
                       f"({100 * over:.0f}% more)")
        out.append((name, value, status))
    return out


def scaling_rows(args, summ):
    lines = []
    for system, peer1 in (("distnn", "distnn"), ("torch-ddp", "torch"), ("pydtnn", "pydtnn")):
        for model in args.models:
            for config in args.configs:
                ranks, threads = parse_config(config)
                if ranks == 1:
                    continue
                a = summ.get((model, config, system))
                b = summ.get((model, f"1p{threads}t", peer1))
                if a and b:
                    lines.append(f"| {system} | {model} | 1p{threads}t → {config} | "
                                 f"{a['sps'] / (ranks * b['sps']):.2f} |")
    if not lines:
        return ""
    return ("| system | model | configs | efficiency = N-rank ÷ (N × 1-rank) |\n"
            "|---|---|---|---:|\n" + "\n".join(lines))


def render(args, results, errors, notes, skips, load_before, load_after, idle_before,
           started, elapsed, capacity=()):
    summ, table = build_tables(args, results, errors)
    # A --quick run is a smoke test, not a measurement: its numbers judge no target.
    targets = [] if args.quick else target_rows(args, summ)
    mi = machine_info()
    cmd = "python -m benchmarks " + shlex.join(sys.argv[1:])
    lines = [f"## {started:%Y-%m-%d %H:%M} — `{cmd}`", ""]
    if args.quick:
        lines += ["*`--quick`: a smoke run with 2 tiny windows; not a measurement, so no "
                  "target is judged.*", ""]
    lines += [
        f"- machine: {mi.get('cpu', '?')}, {mi.get('cpus')} CPUs, {mi.get('mem_gib', '?')} GiB, "
        f"Linux {mi['kernel']}; Python {mi['python']}, numpy {mi['numpy']}, torch "
        f"{mi['torch']}, mpi4py {mi['mpi4py']}, numba {mi['numba']}; distnn git "
        f"{mi.get('git', '?')}; distnn kernels "
        f"{os.environ.get('DISTNN_KERNELS') or 'default (numba when installed)'}",
        # numpy's OpenBLAS (distnn's GEMMs, PyDTNN's) follows this variable; torch does not
        f"- CPU instruction set {mi.get('isa', '?')}; OPENBLAS_CORETYPE="
        f"{os.environ.get('OPENBLAS_CORETYPE', '(unset: OpenBLAS detects the core)')} "
        "in the environment of every system",
        f"- load average before / after: {load_before} / {load_after}; other processes used "
        f"{idle_before:.2f} cores just before the run; the last column is the most any "
        "measurement saw (cores, averaged over that run)",
        f"- task {args.task}; batch {args.batch} per rank, float32; {args.reps} "
        f"repetition(s), systems "
        f"alternated; wall time {elapsed / 60:.1f} min",
    ]
    if capacity:
        lines.append(
            "- host two-core capacity (two one-thread processes side by side ÷ one alone; "
            "2.00 = nothing shared), before the run and after each repetition: compute "
            "(384³ sgemm) " + ", ".join(f"{c:.2f}" for c, _ in capacity)
            + "; memory (64 MiB copies) " + ", ".join(f"{m:.2f}" for _, m in capacity))
    lines += [
        "",
        table, "",
        "samples/s: median over all timed windows of all repetitions (global: all ranks' "
        "samples over the slowest rank's window time); IQR: interquartile range of those "
        "windows ÷ median; distnn ÷ system: ratio of medians; step ms = compute + comm wait "
        "(medians per window); peak RSS: each rank's `ru_maxrss` (interpreter, libraries, "
        "data shard, model), median over repetitions.",
        "",
    ]
    sc = scaling_rows(args, summ)
    if sc:
        lines += ["Scaling:", "", sc, ""]
    if targets:
        lines += ["Targets (issues 13 and 39):", "", "| target | value | status |", "|---|---|---|"]
        lines += [f"| {n} | {v} | {s} |" for n, v, s in targets]
        lines.append("")
    extra = skips + notes + [f"ERROR {s} {m} {c}: {e.splitlines()[-1] if e else '?'}"
                             for (m, c, s), e in errors.items()]
    if extra:
        lines += ["Skipped / failed:", ""] + [f"- {x}" for x in extra] + [""]
    return "\n".join(lines), summ, targets
