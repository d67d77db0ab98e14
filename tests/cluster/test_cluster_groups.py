"""Worker groups across hosts (NNLO's --n-processes), on the emulated cluster: with a
group per host only the groups' leaders talk to the master across the link, so the link
carries less than with one worker per rank, and the run still learns Fashion-MNIST."""
import re
import subprocess

import pytest
from cluster_util import DISTNN, PREFIX, make_cluster, needs_cluster

from distnn.cluster import total_sent
from helpers import have_fashion_mnist

pytestmark = [needs_cluster, pytest.mark.mpi, pytest.mark.long,
              pytest.mark.skipif(not have_fashion_mnist(), reason="needs Fashion-MNIST")]

MODEL = ("from distnn.nn import Dense, Flatten, ReLU, Sequential\n\n\n"
         "def get_model():\n"
         "    return Sequential([Flatten(), Dense(64), ReLU(), Dense(10)])\n")
# NNLO's spellings; 3 epochs of a 50,890-parameter MLP, batch 32 per rank
EPOCHS = 3
TRAIN = ["train", "--mode", "downpour", "--loss", "categorical_crossentropy",
         "--dataset", "fashion_mnist", "--download", "false", "--num_epochs", str(EPOCHS),
         "--batch_size", "32", "--optimizer", "adam", "--learning_rate", "0.002",
         "--validation_split", "0", "--quiet", "--random_seed", "3"]


def on_hosts(cluster, argv, counts):
    """cluster.mpiexec's command with ``counts[i]`` ranks on host i (rank 0 on the first)."""
    cmd = cluster.mpiexec(argv, 1)
    cmd[cmd.index("-hosts") + 1] = ",".join(f"{PREFIX}{i + 1}:{n}"
                                            for i, n in enumerate(counts))
    cmd[cmd.index("-n") + 1] = str(sum(counts))
    return cmd


def accuracy(out: str) -> float:
    return float(re.search(r"Test: .*accuracy=([0-9.]+)", out).group(1))


def test_a_group_per_host_sends_less_over_the_link_and_learns(tmp_path):
    (tmp_path / "mlp.py").write_text(MODEL)
    argv = [DISTNN, *TRAIN, "--model", str(tmp_path / "mlp.py")]
    sent = {}
    outs = {}
    # host 1: the master (rank 0) and ranks 1, 2; host 2: ranks 3, 4
    with make_cluster(2, rate="1gbit") as c:
        for name, extra in (("groups", ["--n-processes", "2"]), ("ranks", [])):
            before = c.link_bytes()
            proc = subprocess.run(on_hosts(c, argv + extra, [3, 2]), env=c.env(),
                                  capture_output=True, text=True, timeout=600, cwd=tmp_path)
            sent[name] = total_sent(before, c.link_bytes())
            outs[name] = proc.stdout + proc.stderr
            assert proc.returncode == 0, outs[name][-3000:]
    print(sent, {k: accuracy(v) for k, v in outs.items()})
    # both runs' messages crossed: without groups each of host 2's workers sends 469
    # messages of 204 kB an epoch (15,000 samples, 32 a step) and gets as many back; with
    # one group on host 2 only its leader does, 469 an epoch (30,000 samples, 64 a step)
    weights = 50_890 * 4
    assert sent["ranks"] > EPOCHS * 2 * 2 * 450 * weights, sent
    assert sent["groups"] > EPOCHS * 2 * 450 * weights, sent
    assert sent["groups"] < 0.6 * sent["ranks"], sent
    assert accuracy(outs["groups"]) >= 0.85, outs["groups"][-2000:]
