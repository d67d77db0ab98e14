"""Two source trees side by side: the README main job, the README tour's first run with its
checkpoint and resume, and tests/run/test_equivalence.py, each run once with each tree's own
code, then a table of what matched.

    python scripts/trees_side_by_side.py OLD_TREE NEW_TREE [--out DIR] [--skip main,tour,tests]

Each tree is a checkout of the repository (``git worktree add /tmp/old 75997ad``); its
``src`` goes first on PYTHONPATH for the command and every ``mpiexec`` child, so the
interpreter and the venv (mpiexec, the ``distnn`` entry point's Python) are the same for
both and only distnn's code differs.

The commands, in the order README.md gives them (run in DIR/<old|new>/<job>):
  main  ``mpiexec -n 2 distnn train`` plus ``--checkpoint ck.npz --history_file h.json
        --save_weights w.npz`` (the files to compare; writing them does not change the run)
  tour  ``mpiexec -n 2 distnn train --model lenet --num_epochs 2 --checkpoint ck.npz
        --history_file h.json --plot curves.png`` (ck.npz kept as ck2.npz), then ``mpiexec
        -n 2 distnn train --model lenet --num_epochs 4 --resume ck.npz`` plus
        ``--checkpoint ck4.npz --history_file h4.json --save_weights w4.npz``, then
        ``distnn info``
  tests ``python -m pytest -q -p no:cacheprovider tests/run/test_equivalence.py`` in the tree

Compared: every array of every .npz (bit for bit, else the largest difference), each
checkpoint's ``__meta__`` (JSON paths that differ, wall-clock fields listed apart), the
history files (exact, else the largest difference per key), the commands' standard output
with times and rates masked, and the test run's pass count. Exit status 0 when every weight
array and accuracy matched bit for bit and the tests passed in both trees, else 1.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

BIN = Path(sys.executable).parent
MPIEXEC = str(BIN / "mpiexec") if (BIN / "mpiexec").exists() else shutil.which("mpiexec")
DISTNN = [str(BIN / "distnn")] if (BIN / "distnn").exists() else [
    sys.executable, "-c", "import sys; from distnn.cli.main import main; sys.exit(main())"]
# wall-clock fields of histories and checkpoints: expected to differ
CLOCK_KEYS = {"time", "samples_per_s", "wall_s", "started", "finished", "date",
              "elapsed_s", "written_at", "duration_s"}
# times and rates in the commands' output
TIMING = re.compile(r"\d[\d,]*(\.\d+)?k? ?(s|samples/s|ms|µs|us|min|tokens/s)\b")
PATHS = re.compile(r"(/[\w.+-]+)+")
PIDS = re.compile(r"\bpid \d+")

JOBS = {
    "main": [
        [MPIEXEC, "-n", "2", *DISTNN, "train",
         "--checkpoint", "ck.npz", "--history_file", "h.json", "--save_weights", "w.npz"],
    ],
    "tour": [
        [MPIEXEC, "-n", "2", *DISTNN, "train", "--model", "lenet", "--num_epochs", "2",
         "--checkpoint", "ck.npz", "--history_file", "h.json", "--plot", "curves.png"],
        ["cp", "ck.npz", "ck2.npz"],
        [MPIEXEC, "-n", "2", *DISTNN, "train", "--model", "lenet", "--num_epochs", "4",
         "--resume", "ck.npz", "--checkpoint", "ck4.npz", "--history_file", "h4.json",
         "--save_weights", "w4.npz"],
        [*DISTNN, "info"],
    ],
}


def _env(tree: Path) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tree / "src"), *(
        [env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_job(tree: Path, folder: Path, commands: list[list[str]], reuse: bool = False) -> dict:
    saved = [folder / f"stdout{i}.txt" for i in range(len(commands))]
    if reuse and all(p.exists() for p in saved):
        return {"stdout": [p.read_text() for p in saved], "seconds": [0.0]}
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    out, took = [], []
    for cmd in commands:
        t0 = time.time()
        proc = subprocess.run(cmd, cwd=folder, env=_env(tree), capture_output=True,
                              text=True, timeout=3600)
        took.append(round(time.time() - t0, 1))
        (folder / "log.txt").open("a").write(
            f"$ {' '.join(cmd)}\n{proc.stdout}{proc.stderr}[exit {proc.returncode}]\n")
        if proc.returncode != 0:
            raise RuntimeError(f"{tree}: {' '.join(cmd)} exited {proc.returncode}:\n"
                               f"{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
        out.append(proc.stdout)
        (folder / f"stdout{len(out) - 1}.txt").write_text(proc.stdout)
    return {"stdout": out, "seconds": took}


def run_tests(tree: Path, folder: Path) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0",
           "tests/run/test_equivalence.py"]
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=tree, env=_env(tree), capture_output=True, text=True,
                          timeout=3600)
    (folder / "tests.txt").write_text(proc.stdout + proc.stderr)
    tail = [ln for ln in proc.stdout.splitlines() if re.search(r"\d+ (passed|failed)", ln)]
    return {"exit": proc.returncode, "summary": TIMING.sub("<t>", tail[-1]) if tail else
            "(no summary)", "seconds": round(time.time() - t0, 1)}


def _arrays(path: Path) -> dict:
    with np.load(path, allow_pickle=False) as data:
        return {k: data[k] for k in data.files}


def _flatten(value, prefix=""):
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _flatten(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _flatten(v, f"{prefix}[{i}]")
    else:
        yield prefix, value


def _leaf(path: str) -> str:
    return re.split(r"[.\[]", path.rsplit(".", 1)[-1])[0]


def compare_json(a, b) -> dict:
    """Paths that differ, split into wall-clock fields and the rest; numbers that differ
    get their absolute difference."""
    fa, fb = dict(_flatten(a)), dict(_flatten(b))
    clock, other, worst = [], [], 0.0
    for key in sorted(set(fa) | set(fb)):
        va, vb = fa.get(key, "<absent>"), fb.get(key, "<absent>")
        if va == vb:
            continue
        if _leaf(key) in CLOCK_KEYS:
            clock.append(key)
            continue
        if isinstance(va, (int, float)) and isinstance(vb, (int, float)):
            diff = abs(float(va) - float(vb))
            worst = max(worst, diff)
            other.append(f"{key}: {va!r} vs {vb!r} (diff {diff:.3g})")
        else:
            other.append(f"{key}: {va!r} vs {vb!r}")
    return {"clock": clock, "other": other, "worst": worst}


def compare_npz(a: Path, b: Path) -> dict:
    wa, wb = _arrays(a), _arrays(b)
    keys = sorted(set(wa) | set(wb))
    same, differ, meta = 0, [], None
    for k in keys:
        if k not in wa or k not in wb:
            differ.append(f"{k}: only in {'old' if k in wa else 'new'}")
        elif k == "__meta__":
            meta = compare_json(json.loads(str(wa[k])), json.loads(str(wb[k])))
        elif wa[k].dtype != wb[k].dtype or wa[k].shape != wb[k].shape:
            differ.append(f"{k}: {wa[k].dtype}{wa[k].shape} vs {wb[k].dtype}{wb[k].shape}")
        elif np.array_equal(wa[k], wb[k]) and wa[k].tobytes() == wb[k].tobytes():
            same += 1
        else:
            diff = (np.max(np.abs(wa[k].astype(np.float64) - wb[k].astype(np.float64)))
                    if wa[k].dtype.kind in "fiu" else float("nan"))
            differ.append(f"{k}: max |diff| {diff:.3g}")
    return {"arrays": len([k for k in keys if k != "__meta__"]), "same": same,
            "differ": differ, "meta": meta}


def _mask(text: str) -> list[str]:
    return [PIDS.sub("pid <n>", PATHS.sub("<path>", TIMING.sub("<t>", ln)))
            for ln in text.splitlines()]


def compare_stdout(a: str, b: str) -> list[str]:
    la, lb = _mask(a), _mask(b)
    out = [f"line {i + 1}: {x!r} vs {y!r}" for i, (x, y) in enumerate(zip(la, lb)) if x != y]
    if len(la) != len(lb):
        out.append(f"{len(la)} lines vs {len(lb)}")
    return out


def _accuracies(stdout: str) -> list[str]:
    return re.findall(r"^Test:[^\n]*?accuracy=([0-9.]+)", stdout, re.M)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("old", type=Path)
    ap.add_argument("new", type=Path)
    ap.add_argument("--out", type=Path, default=Path("/tmp/side_by_side"))
    ap.add_argument("--skip", default="", help="comma-separated: main, tour, tests")
    ap.add_argument("--reuse", action="store_true",
                    help="compare the files an earlier run left in --out (no new runs)")
    args = ap.parse_args(argv)
    skip = set(filter(None, args.skip.split(",")))
    trees = {"old": args.old.resolve(), "new": args.new.resolve()}
    for label, tree in trees.items():
        commit = subprocess.run(["git", "-C", str(tree), "log", "-1", "--format=%h %s"],
                                capture_output=True, text=True).stdout.strip()
        print(f"{label}: {tree} at {commit}")
    rows, ok = [], True
    runs = {}
    for job, commands in JOBS.items():
        if job in skip:
            continue
        for label, tree in trees.items():
            print(f"running {job} on {label} ...", flush=True)
            runs[(job, label)] = run_job(tree, args.out / label / job, commands,
                                          args.reuse)
            print(f"  {runs[(job, label)]['seconds']} s", flush=True)
        folder = {label: args.out / label / job for label in trees}
        for name in sorted(p.name for p in folder["old"].glob("*.npz")):
            cmp = compare_npz(folder["old"] / name, folder["new"] / name)
            ok &= not cmp["differ"]
            rows.append((f"{job}/{name}: arrays", f"{cmp['same']} of {cmp['arrays']} bit-"
                         "identical" + (f"; {'; '.join(cmp['differ'])}" if cmp["differ"]
                                        else "")))
            if cmp["meta"] is not None:
                meta = cmp["meta"]
                rows.append((f"{job}/{name}: __meta__",
                             (f"differs only in {len(meta['clock'])} wall-clock fields"
                              if not meta["other"] else "; ".join(meta["other"]))
                             + (f" ({', '.join(sorted({_leaf(k) for k in meta['clock']}))})"
                                if meta["clock"] else "")))
        for name in sorted(p.name for p in folder["old"].glob("h*.json")):
            cmp = compare_json(*(json.loads((folder[t] / name).read_text()) for t in trees))
            vals = {t: json.loads((folder[t] / name).read_text()).get("val_accuracy")
                    for t in trees}
            shown = (f" (val_accuracy by epoch {', '.join(f'{v:.4f}' for v in vals['old'])}"
                     f"{' in both' if vals['old'] == vals['new'] else ''})"
                     if vals["old"] else "")
            rows.append((f"{job}/{name}", ("identical but wall-clock fields" if not
                         cmp["other"] else "; ".join(cmp["other"])) + shown))
        for name in sorted(p.name for p in folder["old"].glob("*.png")):
            same = (folder["old"] / name).read_bytes() == (folder["new"] / name).read_bytes()
            rows.append((f"{job}/{name}", "same bytes" if same else "bytes differ "
                         "(a plot holds the wall-clock curves too)"))
        for i, cmd in enumerate(commands):
            if cmd[0] == "cp":
                continue
            out_a, out_b = (runs[(job, t)]["stdout"][i] for t in trees)
            diff = compare_stdout(out_a, out_b)
            acc_a, acc_b = _accuracies(out_a), _accuracies(out_b)
            if "info" not in cmd:
                ok &= acc_a == acc_b
            shown = " ".join(cmd[cmd.index("train") + 1:]) if "train" in cmd else "info"
            rows.append((f"{job} stdout: {shown[:60]}",
                         ("same lines (times masked)" if not diff else
                          f"{len(diff)} lines differ: " + " | ".join(diff[:4]))
                         + (f"; test accuracy {', '.join(acc_a)}" if acc_a == acc_b and acc_a
                            else f"; test accuracy old {acc_a} new {acc_b}" if acc_a or acc_b
                            else "")))
    if "tests" not in skip:
        for label, tree in trees.items():
            print(f"running tests/run/test_equivalence.py on {label} ...", flush=True)
            res = run_tests(tree, args.out / label)
            ok &= res["exit"] == 0
            rows.append((f"test_equivalence.py ({label} tree)",
                         f"{res['summary']} (exit {res['exit']}, {res['seconds']} s)"))
    width = max(len(r[0]) for r in rows) if rows else 10
    print(f"\n| {'what':<{width}} | old against new |\n|{'-' * (width + 2)}|---|")
    for what, said in rows:
        print(f"| {what:<{width}} | {said} |")
    print("\nwall seconds per job: " + ", ".join(
        f"{job}/{label} {sum(r['seconds']):.1f}" for (job, label), r in runs.items()))
    print("ALL MATCHED" if ok else "SOME DIFFER (see the table)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
