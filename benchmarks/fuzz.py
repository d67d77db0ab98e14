"""Fuzzing campaign (issue 44): every reader and every option of the ``distnn`` command fed
broken inputs, through the command itself (in-process), with hypothesis.

    python -m benchmarks.fuzz --budget 200 [--seed 44] [--only TOML]

For each reader (``benchmarks/fuzz_targets.py``) and for the options, ``--budget`` inputs:
a copy of valid seed files with one file mutated (``benchmarks/fuzz_inputs.py``), or one
option given one odd value. Each input must end in exit status 0 (the input was fine), 2
with exactly one line "distnn CMD: error: ..." naming the mutated file (or the option), or
3 (training diverged). Never: an exception out of ``main`` (a traceback), a run past the
time limit (a hang), a file written or changed that is not an output the command names,
or the marker file of a pickle that runs code. The table counts inputs, failures by kind
and tracebacks; the exit status is 1 when any failure was found.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import os
import resource
import shutil
import signal
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from . import fuzz_inputs as fi
from .fuzz_keras import KERAS_TARGETS
from .fuzz_targets import SYNTH, TARGETS, Target, option_names

ALL_TARGETS = TARGETS + KERAS_TARGETS

TIME_LIMIT_S = 120  # one input (2 shared cores); a reader that takes longer hangs
MEMORY_HEADROOM = 6 << 30  # address space an input may add before a MemoryError


class Hang(Exception):
    pass


@dataclass
class Result:
    code: int | None
    err: str
    error: str | None = None  # the traceback of an exception out of the command


def _alarm(signum, frame):
    raise Hang("no answer within the time limit")


def _vm_size() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def _build(argv: list[str], mode: str) -> int:
    """The command's checks and its run built without training (``mode`` "build"), its
    configuration only ("config"), or ``distnn search``'s configuration ("search"); the
    exit status main would give."""
    from distnn import distributed as dist
    from distnn.cli.main import _after, build_parser, config_from_args
    from distnn.cli.search import search_config
    from distnn.run import ConfigError, RunError, build_run
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        parser.commands[args.command].error(f"unrecognized arguments: {' '.join(unknown)}"
                                            f"{_after(argv, unknown[0])}")
    try:
        if mode == "search":
            search_config(args)
            return 0
        cfg = config_from_args(args)
        if mode == "build":
            build_run(cfg, dist.LocalComm())
    except (RunError, ConfigError) as exc:
        sys.stderr.write(f"distnn {args.command}: error: {exc}\n")
        return getattr(exc, "exit_code", 2)
    return 0


def run_command(argv: list[str], cwd: Path, mode: str = "run",
                limit_s: int = TIME_LIMIT_S) -> Result:
    """``distnn ARGV`` in this process, in folder ``cwd``, under a time and memory limit."""
    from distnn.cli.main import main
    err, out = io.StringIO(), io.StringIO()
    here = os.getcwd()
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = _vm_size() + MEMORY_HEADROOM
    previous = signal.signal(signal.SIGALRM, _alarm)
    code, error = None, None
    try:
        os.chdir(cwd)
        resource.setrlimit(resource.RLIMIT_AS, (min(limit, hard) if hard > 0 else limit, hard))
        signal.alarm(limit_s)
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            try:
                code = main(argv) if mode == "run" else _build(argv, mode)
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - what the campaign looks for
        error = traceback.format_exc()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
        os.chdir(here)
    return Result(code, err.getvalue(), error)


def snapshot(folder: Path) -> dict[str, str]:
    out = {}
    for p in sorted(folder.rglob("*")):
        rel = str(p.relative_to(folder))
        out[rel] = "dir" if p.is_dir() else hashlib.sha1(p.read_bytes()).hexdigest() \
            if p.is_file() else "other"
    return out


def problems(result: Result, culprits: tuple[str, ...], outputs: tuple[str, ...],
             before: dict, after: dict, folder: Path) -> list[str]:
    """What is wrong with the outcome of one input (empty: nothing)."""
    found = []
    if (folder / fi.MARKER).exists() or any(p.name == fi.MARKER for p in folder.rglob("*")):
        found.append("code execution from a data file")
    if result.error is not None:
        last = result.error.strip().splitlines()[-1]
        kind = "hang" if last.startswith(("Hang", "benchmarks.fuzz.Hang")) else "traceback"
        found.append(f"{kind}: {last[:160]}")
        return found
    if result.code not in (0, 2, 3):
        found.append(f"exit status {result.code}")
    lines = [line for line in result.err.splitlines() if ": note: " not in line]
    if result.code in (2, 3):
        if len(lines) != 1 or not lines[0].startswith("distnn ") or ": error: " not in lines[0]:
            found.append(f"not one error line: {result.err[-300:]!r}")
        elif not any(c and c.lower() in lines[0].lower() for c in culprits):
            found.append(f"the line names none of {culprits}: {lines[0][:200]!r}")
    if "Traceback" in result.err:
        found.append("traceback text on stderr")
    allowed = outputs if result.code == 0 else ()
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k)
                     and not any(k == o or k.startswith(o + "/") for o in allowed))
    if changed:
        found.append(f"files written or changed: {changed[:4]}")
    return found


@dataclass
class Tally:
    inputs: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)  # problem -> the input's story
    tracebacks: int = 0
    seconds: float = 0.0
    refused: int = 0  # inputs that ended in exit status 2 (or 3)


class Campaign:
    """Seeds made once under ``root``; each input runs in a fresh copy of them."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.seeds: dict[str, tuple[Path, list[str]]] = {}
        self.count = 0
        self.last_code: int | None = None

    def seed(self, target: Target) -> tuple[Path, list[str]]:
        if target.name not in self.seeds:
            folder = Path(tempfile.mkdtemp(prefix="seed-", dir=self.root))
            names = target.seed(folder)
            if target.seed_argv:
                result = run_command(target.seed_argv, folder, limit_s=900)
                assert result.code == 0, (target.name, result)
            self.seeds[target.name] = (folder, names)
            # The seed itself must pass: a reader that refuses everything fails here.
            trial = self.fresh()
            fi.copy_seed(folder, trial)
            result = run_command(target.argv, trial, target.mode, limit_s=900)
            if result.code != 0:
                raise AssertionError(f"{target.name}: the valid seed files fail: "
                                     f"{result.error or result.err}")
            shutil.rmtree(trial, ignore_errors=True)
        return self.seeds[target.name]

    def fresh(self) -> Path:
        self.count += 1
        folder = self.root / f"input-{self.count:06d}"
        folder.mkdir()
        return folder

    def file_input(self, target: Target, data: st.DataObject) -> tuple[str, list[str]]:
        """One mutated copy of ``target``'s seed, run: (description, problems)."""
        seed, names = self.seed(target)
        folder = self.fresh()
        fi.copy_seed(seed, folder)
        name = data.draw(st.sampled_from(names), label="file")
        mutate = data.draw(target.mutations(name), label="mutation")
        kind = mutate(folder / name)
        before = snapshot(folder)
        result = run_command(target.argv, folder, target.mode)
        named = getattr(mutate, "culprit", None)  # the option a config mutation set
        culprits = (Path(name).name, *target.culprit, *((named,) if named else ()))
        found = problems(result, culprits, target.outputs, before, snapshot(folder), folder)
        story = f"{target.name}: {name} <- {kind}; {result.error or result.err.strip()[-300:]}"
        shutil.rmtree(folder, ignore_errors=True)
        self.last_code = result.code
        return kind, [f"{p} || {story}" for p in found]

    def option_input(self, data: st.DataObject) -> tuple[str, list[str]]:
        """``distnn train`` (built, not trained) with one option given one odd value."""
        name = data.draw(st.sampled_from(option_names()), label="option")
        value = data.draw(OPTION_VALUES, label="value")
        folder = self.fresh()
        argv = ["train", *SYNTH, "--parallel", "sequential", f"--{name}", value]
        before = snapshot(folder)
        result = run_command(argv, folder, "build")
        flag = f"--{name}"
        found = problems(result, (flag, flag.replace("_", "-"), name), (), before,
                         snapshot(folder), folder)
        shutil.rmtree(folder, ignore_errors=True)
        story = f"--{name} {value!r}: {result.error or result.err.strip()[-300:]}"
        self.last_code = result.code
        return "option value", [f"{p} || {story}" for p in found]


OPTION_VALUES = st.one_of(
    st.sampled_from(["", " ", "-1", "0", "1e309", "nan", "inf", "-inf", "1e-320",
                     "99999999999999999999", "true", "none", "ünïcödé ☃", "1,2,3", "a=b",
                     "../x.npz", "/dev/null", ".", "-", "0x10", "1_000", "1,", ",", "{}",
                     "adam", "data", "synthetic", "x.py", "x.py:build", "fp16", "topk:2"]),
    st.integers(-2**70, 2**70).map(str), st.floats().map(repr),
    st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"),
            max_size=12))


def fuzz_settings(budget: int, derandomize: bool) -> settings:
    return settings(max_examples=budget, derandomize=derandomize, database=None,
                    deadline=None, phases=[Phase.explicit, Phase.generate],
                    suppress_health_check=list(HealthCheck))


def run_target(campaign: Campaign, name: str, budget: int, seed: int, tally: Tally) -> None:
    target = next((t for t in ALL_TARGETS if t.name == name), None)

    @hypothesis_seed(seed)
    @fuzz_settings(budget, False)
    @given(st.data())
    def one(data):
        if target is None:
            kind, found = campaign.option_input(data)
        else:
            kind, found = campaign.file_input(target, data)
        tally.inputs += 1
        tally.refused += campaign.last_code in (2, 3)
        tally.by_kind[kind] = tally.by_kind.get(kind, 0) + 1
        for problem in found:
            key = problem.split(" || ")[0][:120]
            tally.tracebacks += problem.startswith("traceback")
            tally.failures.setdefault(key, problem)

    start = time.perf_counter()
    one()
    tally.seconds = time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget", type=int, default=100, help="inputs per reader")
    parser.add_argument("--seed", type=int, default=44)
    parser.add_argument("--only", default="", help="readers whose name holds this text")
    parser.add_argument("--skip", default="", help="not the readers whose name holds it")
    parser.add_argument("--verbose", action="store_true", help="print every failure")
    args = parser.parse_args(argv)
    names = [t.name for t in ALL_TARGETS] + ["options"]
    names = [n for n in names if args.only.lower() in n.lower()
             and not (args.skip and args.skip.lower() in n.lower())]
    tallies: dict[str, Tally] = {}
    with tempfile.TemporaryDirectory(prefix="distnn-fuzz-") as root:
        campaign = Campaign(Path(root))
        for name in names:
            tallies[name] = tally = Tally()
            run_target(campaign, name, args.budget, args.seed, tally)
            print(f"{name}: {tally.inputs} inputs, {len(tally.failures)} failures, "
                  f"{tally.seconds:.0f} s", file=sys.stderr, flush=True)
    print("| reader | inputs | refused (exit 2) | failures | tracebacks | seconds |\n"
          "|---|---:|---:|---:|---:|---:|")
    for name, t in tallies.items():
        print(f"| {name} | {t.inputs} | {t.refused} | {len(t.failures)} | {t.tracebacks} | "
              f"{t.seconds:.0f} |")
    total = sum(t.inputs for t in tallies.values())
    failures = sum(len(t.failures) for t in tallies.values())
    tracebacks = sum(t.tracebacks for t in tallies.values())
    print(f"| all | {total} | {sum(t.refused for t in tallies.values())} | {failures} | "
          f"{tracebacks} | "
          f"{sum(t.seconds for t in tallies.values()):.0f} |")
    kinds: dict[str, int] = {}
    for t in tallies.values():
        for k, n in t.by_kind.items():
            kinds[k] = kinds.get(k, 0) + n
    print("inputs by kind: " + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())))
    for name, t in tallies.items():
        for problem in t.failures.values():
            print(f"FAIL {name}: {problem if args.verbose else problem[:400]}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
