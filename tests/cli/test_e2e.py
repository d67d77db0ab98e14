"""End to end through the real ``distnn`` command on Fashion-MNIST (needs the dataset:
Debian's dataset-fashion-mnist, $DISTNN_DATA, or the download cache)."""
from __future__ import annotations

import re
import subprocess

import pytest
from helpers import COMMAND, MPIEXEC, needs_fashion_mnist



def distnn(*args, cwd, timeout=300):
    return subprocess.run([*COMMAND, *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=timeout)


pytestmark = [pytest.mark.slow, pytest.mark.compiled, needs_fashion_mnist]

TEST_LINE = re.compile(r"^Test: loss=(\S+) accuracy=(\S+) \((\d+) samples")


def _test_result(stdout: str) -> tuple[str, str, str]:
    for line in stdout.splitlines():
        match = TEST_LINE.match(line)
        if match:
            return match.groups()
    raise AssertionError(f"no 'Test:' line in:\n{stdout}")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One epoch of the PyTorch recipe: simplecnn, SGD lr 0.01 momentum 0.9, batch 64."""
    folder = tmp_path_factory.mktemp("e2e")
    proc = distnn("train", "--model", "simplecnn", "--dataset", "fashion_mnist",
                  "--num_epochs", "1", "--batch_size", "64", "--optimizer", "sgd",
                  "--learning_rate", "0.01", "--momentum", "0.9", "--validation_split", "0",
                  "--save_weights", "w.npz", "--history_file", "h.csv", cwd=folder)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return folder, proc


def test_one_epoch_reaches_83_percent(trained):
    folder, proc = trained
    loss, acc, samples = _test_result(proc.stdout)
    assert samples == "10000"
    assert float(acc) >= 0.83, proc.stdout[-2000:]
    assert "Training: 1 epoch in" in proc.stdout and "samples/s" in proc.stdout
    assert "simplecnn (149,210 parameters)" in proc.stdout  # the summary line at start
    assert (folder / "h.csv").read_text().startswith("epoch,loss,accuracy")


def test_evaluate_reproduces_the_test_accuracy(trained):
    folder, proc = trained
    ev = distnn("evaluate", "--model", "simplecnn", "--dataset", "fashion_mnist",
                "--weights_and_bias_filename", "w.npz", cwd=folder)
    assert ev.returncode == 0, ev.stderr
    assert _test_result(ev.stdout) == _test_result(proc.stdout)


def test_predict_writes_the_test_predictions(trained):
    folder, proc = trained
    pr = distnn("predict", "--dataset", "fashion_mnist", "--weights", "w.npz", "--output",
                "pred.csv", cwd=folder)
    assert pr.returncode == 0, pr.stderr
    rows = (folder / "pred.csv").read_text().splitlines()
    assert len(rows) == 10001
    correct = sum(int(p) == int(t) for _, p, t in (r.split(",") for r in rows[1:]))
    assert f"{correct / 10000:.4f}" == _test_result(proc.stdout)[1]


@pytest.mark.mpi
def test_readme_main_job_on_two_ranks_matches_one_rank(tmp_path):
    """`mpiexec -n 2 distnn train` (the README main job: defaults, batch 64 per rank, so a
    global batch of 128) reaches the test accuracy of 1 rank with the same global batch."""
    if MPIEXEC is None:
        pytest.skip("needs mpiexec")
    two = subprocess.run([MPIEXEC, "-n", "2", *COMMAND, "train"], capture_output=True,
                         text=True, cwd=tmp_path, timeout=400)
    assert two.returncode == 0, two.stderr[-3000:]
    assert "2 ranks" in two.stdout
    one = distnn("train", "--global_batch_size", "128", cwd=tmp_path, timeout=400)
    assert one.returncode == 0, one.stderr[-3000:]
    acc2, acc1 = float(_test_result(two.stdout)[1]), float(_test_result(one.stdout)[1])
    assert acc2 >= 0.83
    assert abs(acc2 - acc1) <= 0.01, (acc1, acc2)


FIRST_DONE = re.compile(r"^First step done in [\d.]+ s: (\d+) kernel signatures compiled "
                        r"\(cached for the next run\), (\d+) loaded from the cache$")


def test_the_first_step_says_it_prepares_the_compiled_kernels(trained):
    # The bar starts after the first step, so a cold numba cache's compilation is said in
    # a line and not spread over the bar's rate and time left.
    lines = trained[1].stdout.splitlines()
    start = lines.index("First step: loading this model's compiled kernels from numba's "
                        "cache, compiling those not cached yet ...")
    done = [i for i, line in enumerate(lines) if FIRST_DONE.match(line)]
    end = next(i for i, line in enumerate(lines) if line.startswith("Training: 1 epoch in"))
    assert len(done) == 1 and start < done[0] < end
    made, loaded = map(int, FIRST_DONE.match(lines[done[0]]).groups())
    assert made + loaded > 0


def test_no_first_step_line_on_the_numpy_kernels(tmp_path):
    import os
    proc = subprocess.run([*COMMAND, "train", "--model", "simplecnn", "--dataset",
                           "fashion_mnist", "--num_epochs", "1", "--steps_per_epoch", "2"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300,
                          env={**os.environ, "DISTNN_KERNELS": "numpy"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "First step" not in proc.stdout and "Training: 1 epoch in" in proc.stdout
