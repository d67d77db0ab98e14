"""What many test files share: the launcher, the ``distnn`` command, the environment of a
child process, the dataset guard, and the skip markers built on them.

Import it as ``from helpers import ...`` (tests/conftest.py puts tests/ on ``sys.path``).
The skip reasons are part of the suite's report: keep them as they are.
"""
from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent / "distnn"
# The installed ``distnn`` script beside this Python, else the module.
COMMAND = [str(BIN)] if BIN.exists() else [sys.executable, "-m", "distnn.cli.main"]

ONE_THREAD = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def find_mpiexec() -> str | None:
    """The ``mpiexec`` beside this Python (the mpich wheel's), else the one on PATH."""
    here = Path(sys.executable).parent / "mpiexec"
    return str(here) if here.exists() else shutil.which("mpiexec")


MPIEXEC = find_mpiexec()


def have_mpi4py() -> bool:
    return importlib.util.find_spec("mpi4py") is not None


@functools.lru_cache(maxsize=None)
def have_fashion_mnist() -> bool:
    """Fashion-MNIST loads without a download (Debian's dataset-fashion-mnist, $DISTNN_DATA
    or the download cache). Loaded once per session, not once per test module."""
    try:
        from distnn.data import load_dataset
        load_dataset("fashion_mnist", download=False)
    except Exception:
        return False
    return True


def child_env(**extra: str) -> dict[str, str]:
    """This process's environment with one BLAS/OpenMP thread per child process (a child
    is one rank; two ranks share the 2 cores), plus ``extra``."""
    env = dict(os.environ)
    env.update(ONE_THREAD)
    env.update(extra)
    return env


def checkout_env() -> dict[str, str]:
    """This process's environment for a script of this checkout (``python benchmarks/...``,
    ``python -m benchmarks``): the repository root first on PYTHONPATH, then the source
    folder of the distnn this process imported (so the child runs the same code, and finds
    the numba cache the suite warmed for it), then what PYTHONPATH held."""
    import distnn
    src = str(Path(distnn.__file__).resolve().parents[1])
    root = str(Path(__file__).resolve().parents[1])
    paths = [root, src, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(dict.fromkeys(paths))}


def launcher(ranks: int) -> list[str]:
    """``mpiexec -n ranks`` for more than one rank; nothing (a plain process) for one."""
    return [MPIEXEC, "-n", str(ranks)] if ranks > 1 else []


def run_distnn(*args, cwd, ranks: int = 1, timeout: float = 300, **env: str):
    """``distnn ARGS`` on ``ranks`` ranks (a plain process for one), in ``cwd``, with
    one BLAS thread per rank; the finished process, output captured as text."""
    import subprocess
    return subprocess.run([*launcher(ranks), *COMMAND, *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, cwd=cwd, env=child_env(**env))


def distnn_in_process(*args):
    """``distnn ARGS`` run in this process through the command's own entry
    (``distnn.cli.main.main(argv)``): its exit status (``SystemExit`` included), stdout and
    stderr, as ``run_distnn`` gives them, without the start of a process (Python, numpy,
    distnn: 1-2 CPU-s). For refusals of the options, which happen before a run joins MPI; a
    command that gets as far as making its communicator fails the test (that case needs a
    real process: ``run_distnn``). Keep one real-process test of each family of refusals,
    so that the command's path and "on every rank" stay covered."""
    import importlib
    import io
    import subprocess
    from unittest import mock

    cli = importlib.import_module("distnn.cli.main")  # the module (distnn.cli.main is also
    #                                                    the package's name for its function)

    def no_communicator(*_, **__):
        raise AssertionError(f"distnn {' '.join(map(str, args))} got past the option checks "
                             "in process: run it as a real process (run_distnn)")
    out, err = io.StringIO(), io.StringIO()
    with mock.patch.object(cli, "make_comm", no_communicator), \
            contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main([str(a) for a in args])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return subprocess.CompletedProcess([*COMMAND, *map(str, args)], code, out.getvalue(),
                                       err.getvalue())


@contextlib.contextmanager
def reaped(proc):
    """``proc`` (a ``subprocess.Popen``), killed and drained on the way out if it still
    runs: a failed assertion must not leave a job behind."""
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def finish(proc, timeout: float = 240):
    """``proc.communicate(timeout)``: its (stdout, stderr), the process reaped either way."""
    with reaped(proc):
        return proc.communicate(timeout=timeout)


def pids_of_rank(rank: int, mark: str = "", pids=None) -> list[int]:
    """The pids of MPI rank ``rank``'s processes (hydra's PMI_RANK), not their watchers
    (launch/rankwatch.py), whose environment holds ``mark``; among ``pids`` (default:
    every process)."""
    if pids is None:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    found = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                watcher = b"rankwatch" in f.read()
        except OSError:
            continue
        if (f"PMI_RANK={rank}".encode() in env and (not mark or mark.encode() in env)
                and not watcher):
            found.append(pid)
    return found


# Skip markers (the reasons are the ones the suite has always reported).
needs_mpiexec = pytest.mark.skipif(MPIEXEC is None, reason="needs mpiexec")
needs_mpi = pytest.mark.skipif(MPIEXEC is None or not have_mpi4py(),
                               reason="needs mpiexec and mpi4py")


def __getattr__(name: str):
    # ``needs_fashion_mnist`` is made on first import: loading the data set to see whether
    # it is there costs seconds that modules which never ask for it should not pay.
    if name == "needs_fashion_mnist":
        return pytest.mark.skipif(not have_fashion_mnist(), reason="Fashion-MNIST not found")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class SessionBatch:
    """Test cases of many tests that share a program and a rank count, run in one launch
    per key (one mpiexec start instead of one per test): tests register their cases when
    their module is imported (``add``), the first test that needs a key's results launches
    every case of that key (``run``), each test then asserts on its own results.

    ``command(key, cases, out)`` is the command line that runs ``cases`` (in order) and
    writes their results under ``out``; ``done(key, case, out)`` says whether a case's
    results are all written; ``label(key)`` names the launch in messages. A case has its
    own timeout, counted from the end of the case before it (from the launch for the
    first): a case that fails or hangs fails the tests that read it, with the launch's
    output; the launch is then ended, and the cases after it run again in a launch of
    their own, so that they pass or fail on their own."""

    def __init__(self, command, done, label=str):
        self.command, self.done, self.label = command, done, label
        self.cases: dict = {}      # key -> {name: (case, timeout, module)}
        self.outcome: dict = {}    # key -> {name: None (written) or the failure's message}
        self.out: dict = {}        # key -> the folder of its results

    def add(self, key, name: str, case: dict, timeout: float, module: str = "") -> None:
        cases = self.cases.setdefault(key, {})
        if name in cases and cases[name][0] != case:
            raise ValueError(f"two different batched cases are named {name!r}")
        cases[name] = (case, timeout, module)

    def run(self, key, out: Path, modules=None) -> dict:
        """Every case of ``key`` (of ``modules`` only, when given) run under ``out``, once
        a session; {name: None, or why it failed}."""
        if key not in self.outcome:
            names = [n for n, (_, _, m) in self.cases.get(key, {}).items()
                     if modules is None or m in modules]
            out.mkdir(parents=True, exist_ok=True)
            self.out[key] = out
            self.outcome[key] = {}
            launch = 0
            while names:
                launch += 1
                names = self._launch(key, names, out, launch)
        return self.outcome[key]

    def _launch(self, key, names: list[str], out: Path, launch: int) -> list[str]:
        """Runs ``names`` in one launch; returns the names still to run (after a failure)."""
        import subprocess
        import time
        cases = [self.cases[key][n] for n in names]
        log = out / f"launch{launch}.log"
        with open(log, "w") as sink:
            proc = subprocess.Popen(self.command(key, [c for c, _, _ in cases], out),
                                    stdout=sink, stderr=subprocess.STDOUT, text=True,
                                    env=child_env(), start_new_session=True)
            finished, timed_out = 0, False
            last = time.monotonic()
            deadline = last + cases[0][1]
            while True:
                running = proc.poll() is None
                now = time.monotonic()
                if now - last > 5:  # this process was stopped (SIGSTOP, ^Z), and likely
                    deadline += now - last  # the job with it: that time does not count
                last = now
                while finished < len(cases) and self.done(key, cases[finished][0], out):
                    finished += 1
                    if finished < len(cases):
                        deadline = time.monotonic() + cases[finished][1]
                if not running:
                    break
                if finished < len(cases) and time.monotonic() > deadline:
                    timed_out = True
                    break
                time.sleep(0.1)
            if proc.poll() is None:  # hung, or still ending after the last case
                if not timed_out:
                    try:
                        proc.wait(timeout=30)
                    except subprocess.TimeoutExpired:
                        timed_out = True
                if proc.poll() is None:
                    os.killpg(proc.pid, 9)
                    proc.wait()
        for name in names[:finished]:
            self.outcome[key][name] = None
        text = log.read_text(errors="replace")
        if finished == len(cases):
            if proc.returncode != 0:  # every case wrote its results, then the launch failed
                for name in names:
                    self.outcome[key][name] = (f"the batched launch exited with "
                                               f"{proc.returncode} after its last case:\n"
                                               f"{text[-6000:]}")
            return []
        why = (f"timed out after {cases[finished][1]:g} s" if timed_out
               else f"the launch exited with {proc.returncode}")
        self.outcome[key][names[finished]] = (
            f"batched case {names[finished]!r} ({self.label(key)}) failed: {why}; it ran after "
            f"{finished} other case(s) of its launch, whose output ends:\n{text[-6000:]}")
        return names[finished + 1:]
