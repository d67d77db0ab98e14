"""NNLO's --n-processes and --n-masters through the distnn command, in NNLO's spellings:
several masters on Fashion-MNIST (the top master's message count in the profile), and the
rules and layouts they are not built for refused with the option named."""
from __future__ import annotations

import re

import pytest

from rulejobs import run_cli
from helpers import have_fashion_mnist, needs_mpi

MODEL = ("from distnn.nn import Dense, Flatten, ReLU, Sequential\n\n\n"
         "def get_model():\n"
         "    return Sequential([Flatten(), Dense(64), ReLU(), Dense(10)])\n")


@needs_mpi
@pytest.mark.long
@pytest.mark.skipif(not have_fashion_mnist(), reason="needs Fashion-MNIST on disk")
def test_two_masters_learn_fashion_mnist_and_the_top_one_gets_fewer_messages(tmp_path):
    # 7 ranks: the top master, 2 sub-masters, 4 workers (2 per sub-master)
    (tmp_path / "mlp.py").write_text(MODEL)
    proc = run_cli(7, "train", "--model", str(tmp_path / "mlp.py"), "--mode", "downpour",
                   "--n-masters", "2", "--sync_every", "2", "--loss",
                   "categorical_crossentropy", "--dataset", "fashion_mnist", "--download",
                   "false", "--num_epochs", "6", "--batch_size", "32", "--optimizer", "adam",
                   "--learning_rate", "0.001", "--validation_split", "0", "--profile",
                   "--quiet", "--random_seed", "3", timeout=900, cwd=tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    epochs = out.split("Profile of epoch")[1:]
    assert len(epochs) == 6
    print(*re.findall(r"downpour rank \d: .*", out), sep="\n")
    for text in epochs:
        top = re.search(r"downpour rank 0: .* (\d+) messages received, (\d+) of them from the "
                        r"sub-masters", text)
        assert top, text
        ups = [int(m) for m in re.findall(r"downpour rank [12]: .* (\d+) exchanges with the "
                                          r"top master", text)]
        pushes = [int(m) for m in re.findall(r"downpour rank [3-6]: (\d+) messages sent", text)]
        assert len(ups) == 2 and len(pushes) == 4, text
        # the top master heard from the sub-masters only, once per 2 of their updates
        assert int(top.group(1)) == int(top.group(2)) == sum(ups)
        assert sum(ups) <= (sum(pushes) - 4) / 2 + 2  # a worker's DONE counts as sent
    acc = float(re.search(r"Test: .*accuracy=([0-9.]+)", out).group(1))
    print("test accuracy", acc)
    assert acc >= 0.85, out[-2000:]


@pytest.mark.parametrize("args,says", [
    (["--mode", "gem", "--n-masters", "2"],
     "--masters 2 is built for --parallel downpour, easgd, not --parallel gem"),
    (["--mode", "partial", "--n-processes", "2"],
     "--group_size 2 is built for --parallel downpour, easgd, gem, gossip, localsgd, not "
     "--parallel partial"),  # the rules in RULES' (alphabetical) order
    (["--mode", "downpour", "--n-masters", "2", "--synchronous"],
     "several masters serve asynchronous workers"),
])
def test_what_is_not_built_is_refused_naming_the_option(args, says):
    proc = run_cli(0, "train", *args, "--dataset", "synthetic", "--num_samples", "64",
                   "--steps_per_epoch", "1", "--quiet")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert says in proc.stderr, proc.stderr


@needs_mpi
def test_ranks_that_make_no_whole_groups_are_refused_on_every_rank():
    # 4 ranks: the master and 3 workers, which make no groups of 2
    proc = run_cli(4, "train", "--mode", "downpour", "--n-processes", "2", "--dataset",
                   "synthetic", "--num_samples", "64", "--steps_per_epoch", "1", "--quiet")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "--group_size" in proc.stderr and "do not make whole groups of 2" in proc.stderr
