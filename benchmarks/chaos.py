"""Chaos run (issue 44): ``distnn launch`` on 4 emulated hosts for ``--minutes`` while a
seeded schedule injects every fault kind of benchmarks/chaos_faults.py (each ``--repeat``
times, some close together); then a table per kind: count, survived (training went on
with no person acting), mean time to recover, what the user saw.

    sudo .venv/bin/python -m benchmarks.chaos --minutes 20 --seed 1

Root (network namespaces, tc, a tmpfs). Addresses only in 198.18.<net>.0/24 (no route
beyond the bridge); every namespace, link, tmpfs and /etc/netns file is removed on exit,
also on an error or SIGINT/SIGTERM. The checkpoint lives on a small tmpfs (the storage
that fills); the driver checks that every checkpoint written loads. When the supervisor
gives up (a checkpoint that will not load, the budget spent), the driver does what a
user would: relaunch with --resume of the last good copy, and counts the fault as not
survived.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

from benchmarks.chaos_faults import inject, schedule
from benchmarks.chaos_report import TELLS, table
from distnn.cluster import EmulatedCluster

BIN = os.path.dirname(sys.executable)


class Chaos:
    def __init__(self, args):
        self.args = args
        self.rate = args.rate
        self.stopping = False
        self.lines: list[tuple[float, str]] = []       # (monotonic, supervisor/job line)
        self.progress: list[tuple[float, int]] = []    # (monotonic, global step)
        self.relaunches: list[tuple[float, str]] = []
        self.ck_checked = self.ck_bad = 0
        self.truncated: set[int] = set()  # mtimes of the checkpoints corrupt_ck truncated
        self.proc = None
        self.work = tempfile.mkdtemp(prefix="distnn-chaos-")
        self.ck_dir = os.path.join(self.work, "ck")
        self.ck = os.path.join(self.ck_dir, "ck.npz")
        self.good = os.path.join(self.work, "last_good.npz")
        self.cluster = EmulatedCluster(args.hosts, rate=args.rate, prefix=args.prefix,
                                       net=args.net)
        self.hosts = [h.name for h in self.cluster.hosts]
        self.mounted = False

    # -- helpers ---------------------------------------------------------------------
    def sleep(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end and not self.stopping:
            time.sleep(0.1)

    def ck_mtime(self) -> float:
        try:
            return os.stat(self.ck).st_mtime_ns
        except OSError:
            return 0

    def train_argv(self) -> list[str]:
        a = self.args
        return ["train", "--dataset", "fashion_mnist", "--model", a.model,
                "--global_batch_size", "64", "--steps_per_epoch", str(a.steps_per_epoch),
                "--num_epochs", str(a.epochs), "--validation_split", "0",
                "--random_seed", "7", "--learning_rate", "0.05",
                "--checkpoint", self.ck, "--checkpoint_steps", str(a.checkpoint_steps),
                "--stall_warning", str(a.stall_timeout / 4), "--stall_timeout",
                str(a.stall_timeout), "--overwrite"] + (
            ["--lr_schedulers", "reduce_lr_every_nepochs", "--reduce_lr_every_nepochs_factor",
             "0.5", "--reduce_lr_every_nepochs_nepochs", str(a.halve_lr_every)]
            if a.halve_lr_every else [])

    # -- the job ---------------------------------------------------------------------
    def launch(self, resume: bool) -> None:
        argv = self.train_argv() + (["--resume", self.ck] if resume else [])
        env = self.cluster.env(dict(os.environ, TMPDIR=os.path.join(self.work, "tmp"),
                                    PYTHONUNBUFFERED="1"))
        os.makedirs(env["TMPDIR"], exist_ok=True)
        cmd = [os.path.join(BIN, "distnn"), "launch", "--cluster", self.args.prefix,
               "--max_restarts", str(self.args.max_restarts), "--min_hosts", "2", "--",
               *argv]
        self.proc = subprocess.Popen(cmd, cwd=self.work, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True)
        threading.Thread(target=self._read, args=(self.proc,), daemon=True).start()

    def _read(self, proc) -> None:
        for line in proc.stdout:
            self.lines.append((time.monotonic(), line.rstrip().split("\r")[-1]))
            if self.args.verbose or TELLS.search(line) or "accuracy" in line:
                print(f"[{time.monotonic() - self.t0:7.1f}] {line.rstrip()[:300]}",
                      flush=True)

    def _watch(self) -> None:
        """Progress (the supervisor's progress file) and every new checkpoint loads."""
        from distnn.training.checkpoint import load_checkpoint
        seen = 0
        while not self.stopping:
            for p in glob.glob(os.path.join(self.work, "tmp", "distnn-launch-*", "progress")):
                try:
                    with open(p) as f:
                        step = int(f.read().split()[0])
                except (OSError, ValueError, IndexError):
                    continue
                if not self.progress or self.progress[-1][1] != step:
                    self.progress.append((time.monotonic(), step))
            m = self.ck_mtime()
            if m in self.truncated:  # truncated on purpose; the run resumes the previous
                seen = m
            if m and m != seen and not self.corrupting:
                seen = m
                try:
                    shutil.copy(self.ck, self.good + ".tmp")
                    load_checkpoint(self.good + ".tmp")
                    os.replace(self.good + ".tmp", self.good)
                    self.ck_checked += 1
                except (OSError, ValueError) as exc:
                    if not self.corrupting:
                        self.ck_bad += 1
                        print(f"checkpoint did not load: {exc}", flush=True)
            time.sleep(0.25)

    # -- the run ---------------------------------------------------------------------
    def run(self, faults=None) -> dict:
        """Inject ``faults`` (default: the seeded schedule); the result as a dict."""
        a = self.args
        self.cluster.up()
        os.makedirs(self.ck_dir)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={a.disk_mb}m", "chaos",
                        self.ck_dir], check=True)
        self.mounted = True
        self.corrupting = False
        self.t0 = time.monotonic()
        if faults is None:
            faults = schedule(a.seed, a.minutes * 60 * 0.8, self.hosts, a.stall_timeout,
                              a.repeat)
        self.launch(resume=False)
        threading.Thread(target=self._watch, daemon=True).start()
        threads = []
        last = self.t0
        for f in faults:
            # --paced: also wait for a step taken after the previous fault (a loaded
            # machine's slow start-ups then never swallow a fault)
            while not self.stopping and (self._before(f) or a.paced and
                                         not any(t > last for t, _ in self.progress)):
                self._supervise()
                if self.finished() or time.monotonic() > self.t0 + a.minutes * 60:
                    break
                time.sleep(0.2)
            last = time.monotonic()
            if self.stopping or self.finished():
                break
            if f.kind == "corrupt_ck":
                self.corrupting = True
            print(f"[{time.monotonic() - self.t0:7.1f}] inject {f.kind} {f.host} "
                  f"{f.duration:g}s", flush=True)
            t = threading.Thread(target=self._inject, args=(f,), daemon=True)
            t.start()
            threads.append(t)
        end = self.t0 + (a.minutes + a.grace) * 60  # the faults stop at 80 %
        while time.monotonic() < end and not self.stopping and not self.finished():
            self._supervise()
            time.sleep(0.5)
        for t in threads:
            t.join(timeout=70)
        done = self.finished() and self.proc.returncode == 0
        if not done and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(30)
        time.sleep(1)
        return self.report([f for f in faults if f.injected], done, time.monotonic() - self.t0)

    def _inject(self, f) -> None:
        try:
            inject(self, f)
        finally:
            if f.kind == "corrupt_ck":
                time.sleep(5)
                self.corrupting = False

    def _before(self, f) -> bool:
        """Not yet time for ``f``: in seconds, or with --at_steps in the job's global steps
        (the same schedule on a machine of any speed)."""
        if self.args.at_steps:
            return not self.progress or self.progress[-1][1] < f.at
        return time.monotonic() - self.t0 < f.at

    def finished(self) -> bool:
        return self.proc is not None and self.proc.poll() == 0

    def _supervise(self) -> None:
        """The supervisor gave up: a user's relaunch from the last good checkpoint."""
        if self.proc.poll() in (None, 0) or self.stopping:
            return
        last = next((s for _, s in reversed(self.lines) if "distnn launch:" in s), "")
        self.relaunches.append((time.monotonic(), last))
        print(f"[{time.monotonic() - self.t0:7.1f}] supervisor exit {self.proc.returncode}:"
              f" relaunching with --resume of the last good copy", flush=True)
        if os.path.exists(self.good):
            subprocess.run(["cp", self.good, self.ck], check=False)
        for fn in glob.glob(os.path.join(self.ck_dir, "filler*")):
            os.unlink(fn)
        self.launch(resume=os.path.exists(self.ck))

    # -- the figures -----------------------------------------------------------------
    def report(self, faults, done: bool, seconds: float) -> dict:
        t0 = self.t0
        rows = [{"kind": f.kind, "host": f.host, "at_s": round(f.injected - t0, 1),
                 "ended_s": round(f.ended - t0, 1) if f.ended else None,
                 "duration_s": f.duration, "notes": f.notes}
                for f in sorted(faults, key=lambda f: f.injected)]
        acc = next((s for _, s in reversed(self.lines) if re.search(r"test.*accuracy", s,
                                                                    re.I)), "")
        return {"seed": self.args.seed, "seconds": round(seconds), "finished": done,
                "final": acc, "faults": rows, "relaunches": [s for _, s in self.relaunches],
                "relaunch_s": [round(t - t0, 1) for t, _ in self.relaunches],
                "lines": [(round(t - t0, 1), s) for t, s in self.lines
                          if TELLS.search(s) or "distnn launch" in s],
                "progress": [(round(t - t0, 2), st) for t, st in self.progress],
                "checkpoints_loaded": self.ck_checked, "checkpoints_bad": self.ck_bad,
                "last_step": self.progress[-1][1] if self.progress else 0}

    def teardown(self) -> None:
        self.stopping = True
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for h in self.hosts:  # a stopped rank, a downed link, a throttle: undone
            self.cluster.kill(h, signal.SIGCONT, quiet=True)
        self.cluster.down()
        if self.mounted:
            subprocess.run(["umount", "-l", self.ck_dir], check=False)
        shutil.rmtree(self.work, ignore_errors=True)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=20)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--grace", type=float, default=3,
                   help="minutes after --minutes the job may take to finish")
    p.add_argument("--repeat", type=int, default=2, help="times each fault kind")
    p.add_argument("--hosts", type=int, default=4)
    p.add_argument("--rate", default="1gbit")
    p.add_argument("--prefix", default="chx")
    p.add_argument("--net", type=int, default=93)
    p.add_argument("--model", default="lenet")
    p.add_argument("--epochs", type=int, default=40)
    p.add_argument("--steps_per_epoch", type=int, default=100)
    p.add_argument("--checkpoint_steps", type=int, default=20)
    p.add_argument("--halve_lr_every", type=int, default=0, metavar="EPOCHS",
                   help="halve the learning rate every EPOCHS epochs (a final accuracy "
                        "that settles, to compare with the fault-free run); 0: constant")
    p.add_argument("--stall_timeout", type=float, default=20)
    p.add_argument("--max_restarts", type=int, default=60)
    p.add_argument("--disk_mb", type=int, default=64,
                   help="the checkpoint tmpfs: room for 3 checkpoints (newest, previous, "
                        "the one being written)")
    p.add_argument("--json", default=None)
    p.add_argument("--table", default=None, metavar="JSON",
                   help="print the table of a saved run and exit")
    p.add_argument("--paced", action="store_true",
                   help="inject a fault only after a step taken since the previous one")
    p.add_argument("--at_steps", action="store_true",
                   help="a fault's time is the job's global step, not seconds after start")
    p.add_argument("--verbose", action="store_true")
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    if args.table:
        with open(args.table) as f:
            print(table(json.load(f)))
        return 0
    chaos = Chaos(args)

    def stop(signum, frame):
        chaos.stopping = True
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, stop)
    try:
        result = chaos.run()
    finally:
        chaos.teardown()
    print(json.dumps(result, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    print(table(result))
    print(f"finished: {result['finished']}; {result['final']}; checkpoints loaded "
          f"{result['checkpoints_loaded']}, bad {result['checkpoints_bad']}")
    return 0 if result["finished"] else 1


if __name__ == "__main__":
    sys.exit(main())
