"""distnn across hosts, on the emulated cluster: the same updates as on one host, each
rank using its node's cores, and a lost host ending the whole job with its name."""
import os
import shutil
import subprocess
import time

import numpy as np
import pytest
from cluster_util import DISTNN, PREFIX, ROOT, local_run, make_cluster, needs_cluster, run
from helpers import reaped

from distnn.cluster import total_sent

pytestmark = [needs_cluster, pytest.mark.mpi]

# A short float64 run of the README's model on real Fashion-MNIST; global batch 64 on
# every launch, so 1 process, 1 host x 2 ranks and 2 hosts x 1 rank make the same steps.
TRAIN = [DISTNN, "train", "--dtype", "float64", "--num_epochs", "1", "--steps_per_epoch",
         "6", "--global_batch_size", "64", "--evaluate", "false", "--validation_split", "0",
         "--quiet"]


def weights(path) -> dict:
    with np.load(path) as f:
        return {k: f[k] for k in f.files}


def test_two_hosts_make_the_same_updates_as_one_host_and_one_process(tmp_path):
    one = local_run(TRAIN + ["--save_weights", str(tmp_path / "p1.npz")])
    assert one.returncode == 0, one.stderr
    shm = local_run(TRAIN + ["--save_weights", str(tmp_path / "shm.npz")], n=2)
    assert shm.returncode == 0, shm.stderr
    with make_cluster(2, rate="1gbit") as c:
        before = c.link_bytes()
        net = run(c, TRAIN + ["--save_weights", str(tmp_path / "net.npz")])
        sent = total_sent(before, c.link_bytes())
    assert net.returncode == 0, net.stderr
    # the gradients (149,210 float64) crossed the link at every one of the 6 steps
    assert sent >= 6 * 149_210 * 8, sent
    ref = weights(tmp_path / "p1.npz")
    for other in ("shm", "net"):
        got = weights(tmp_path / f"{other}.npz")
        assert got.keys() == ref.keys()
        for k in ref:
            np.testing.assert_allclose(got[k], ref[k], rtol=0, atol=1e-10, err_msg=other)
    # the steps changed the weights (so the comparison above could fail): 5 steps differ
    fewer = local_run([a if a != "6" else "5" for a in TRAIN]
                      + ["--save_weights", str(tmp_path / "five.npz")])
    assert fewer.returncode == 0, fewer.stderr
    five = weights(tmp_path / "five.npz")
    assert max(np.abs(ref[k] - five[k]).max() for k in ref) > 1e-6


def test_each_rank_uses_its_node_cores(tmp_path):
    # 2 hosts x 1 rank, every host with this machine's cores: each rank takes them all
    # (before, the rule counted all ranks of the job and gave each 1 thread).
    cores = len(os.sched_getaffinity(0))
    with make_cluster(2, rate="10gbit", cores="all") as c:
        info = run(c, [DISTNN, "info"], timeout=120)
        train = run(c, TRAIN[:2] + ["--num_epochs", "1", "--steps_per_epoch", "2",
                                    "--evaluate", "false"], timeout=120)
    assert info.returncode == 0, info.stderr
    assert "hosts: 2" in info.stdout
    for r in range(2):
        assert f"rank {r}: " in info.stdout
        line = next(ln for ln in info.stdout.splitlines() if f"rank {r}: " in ln)
        assert "local rank 0/1" in line and f"cores {cores}, train threads {cores}" in line
        assert f"openblas={cores}" in line  # what the BLAS pool is set to, not just said
    assert f"BLAS threads per rank in train: {cores} on rank 0's node" in info.stdout
    assert train.returncode == 0, train.stderr
    assert f"threads per rank {cores}" in train.stdout
    # the same machine as one host with 2 ranks: the cores are shared between them
    shared = local_run([DISTNN, "info"], n=2)
    assert "hosts: 1" in shared.stdout
    assert f"train threads {max(1, cores // 2)}" in shared.stdout


def test_a_lost_host_ends_the_job_within_seconds_and_is_named(tmp_path):
    # 3 hosts; the job runs on the first two; the second dies mid-epoch; the run resumes
    # from its checkpoint on the first and the third (the job comes back on other hosts).
    ck = tmp_path / "ck.npz"
    argv = [DISTNN, "train", "--num_epochs", "200", "--steps_per_epoch", "15",
            "--checkpoint", str(ck), "--validation_split", "0", "--evaluate", "false"]
    h1, h2, h3 = (f"{PREFIX}{i}" for i in (1, 2, 3))
    with make_cluster(3, rate="1gbit") as c:
        proc = subprocess.Popen(c.mpiexec(argv, hosts=[h1, h2]), env=c.env(), cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        with reaped(proc):
            deadline = time.monotonic() + 120
            while not ck.exists() and time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.2)
            assert ck.exists(), "no checkpoint was written"
            time.sleep(1.0)  # mid-epoch: checkpoints come at epoch ends
            killed = c.kill(h2)
            assert killed
            t = time.monotonic()
            out, _ = proc.communicate(timeout=30)
            ended = time.monotonic() - t
            survivors_gone = c.wait_gone(h1, timeout=10)
        assert proc.returncode != 0
        assert ended < 10, ended
        assert survivors_gone, "rank 0's host still runs after the job ended"
        assert f"[{h2}] lost" in out, out[-2000:]
        # nothing half-written: the checkpoint loads, and the run resumes on h1 and h3
        assert not [p for p in os.listdir(tmp_path) if p.startswith("ck.npz.")]
        from distnn.training.checkpoint import load_checkpoint
        done = load_checkpoint(ck).epochs_done
        assert done >= 1
        resumed = run(c, [DISTNN, "train", "--resume", str(ck), "--num_epochs", str(done + 1),
                          "--steps_per_epoch", "15", "--evaluate", "false"], hosts=[h1, h3])
    assert resumed.returncode == 0, resumed.stderr
    assert f"Epoch {done + 1}/{done + 1}" in resumed.stderr + resumed.stdout


def test_ranks_pinned_to_their_own_cores_are_not_divided_again():
    # hydra's -bind-to core gives each rank a core of its own: the rank keeps all of its
    # cores (here 1) instead of dividing them by the ranks on the node.
    prog = ("import os; from distnn import distributed as d; c = d.init(); "
            "rows = c.allgather_obj(f'{c.rank} {len(os.sched_getaffinity(0))} "
            "{c.core_sharers} {d.default_threads(c)}'); c.rank or print(*rows, sep=chr(10))")
    import sys
    shared = local_run([sys.executable, "-c", prog], n=2)
    pinned = local_run([sys.executable, "-c", prog], n=2, bind="core")
    assert shared.returncode == 0 and pinned.returncode == 0, shared.stderr + pinned.stderr
    cores = len(os.sched_getaffinity(0))
    for line in shared.stdout.split("\n")[:-1]:
        assert line.split()[1:] == [str(cores), "2", str(max(1, cores // 2))], line
    for line in pinned.stdout.split("\n")[:-1]:
        own = int(line.split()[1])
        assert line.split()[2:] == ["1", str(own)], line


def test_a_host_without_the_dataset_is_named(tmp_path):
    # The data folder is node-local: h1 has Fashion-MNIST, h2 does not. The job ends on
    # every rank before training, with one error naming the host that lacks it and where
    # it looked.
    data = tmp_path / "data"
    src = "/usr/share/datasets/fashion-mnist"
    if not os.path.isdir(src):
        pytest.skip(f"needs Debian's dataset-fashion-mnist in {src}")
    with make_cluster(2, rate="10gbit", private_dirs=[str(data)]) as c:
        for name in os.listdir(src):
            os.symlink(os.path.join(src, name), os.path.join(c.backing(f"{PREFIX}1",
                                                                       str(data)), name))
        t = time.monotonic()
        proc = run(c, [DISTNN, "train", "--dataset_path", str(data), "--download", "false",
                       "--num_epochs", "1", "--steps_per_epoch", "2"], timeout=120)
        seconds = time.monotonic() - t
        # the same for a model file that only h1 has
        model = data / "mymodel.py"
        shutil.copy(ROOT / "examples" / "mnist_distnn.py", c.backing(f"{PREFIX}1", str(data)))
        os.rename(os.path.join(c.backing(f"{PREFIX}1", str(data)), "mnist_distnn.py"),
                  os.path.join(c.backing(f"{PREFIX}1", str(data)), "mymodel.py"))
        nomodel = run(c, [DISTNN, "train", "--model", str(model), "--num_epochs", "1",
                          "--steps_per_epoch", "2"], timeout=120)
    assert nomodel.returncode == 2, nomodel.stdout + nomodel.stderr
    said = [ln for ln in nomodel.stderr.splitlines() if "error:" in ln]
    assert len(said) == 1 and f"host {PREFIX}2" in said[0] and str(model) in said[0], said
    assert proc.returncode == 2, proc.stdout + proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if "error:" in ln]
    assert len(errors) == 1, proc.stderr  # said once, by rank 0, not by every rank
    assert f"[rank 1 on host {PREFIX}2] dataset 'fashion_mnist' not found" in errors[0]
    assert str(data) in proc.stderr and "Traceback" not in proc.stderr
    assert seconds < 60


def test_node_local_storage_checkpoints_per_node_and_resume_names_a_host_without_it(
        tmp_path):
    out = tmp_path / "out"
    ck = out / "ck.npz"
    h1, h2, h3 = (f"{PREFIX}{i}" for i in (1, 2, 3))
    base = [DISTNN, "train", "--steps_per_epoch", "5", "--validation_split", "0",
            "--evaluate", "false", "--quiet"]
    with make_cluster(3, rate="10gbit", private_dirs=[str(out)]) as c:
        def on(host):
            return os.path.join(c.backing(host, str(out)), "ck.npz")
        # shared storage (the default): written once, by rank 0, on its node
        once = run(c, base + ["--num_epochs", "1", "--checkpoint", str(ck)], hosts=[h1, h2])
        assert once.returncode == 0, once.stderr
        assert os.path.exists(on(h1)) and not os.path.exists(on(h2))
        os.remove(on(h1))
        # PyDTNN's --shared_storage false: node-local disks, one copy on every node
        local = run(c, base + ["--num_epochs", "1", "--checkpoint", str(ck),
                               "--shared_storage", "false"], hosts=[h1, h2])
        assert local.returncode == 0, local.stderr
        assert os.path.exists(on(h1)) and os.path.exists(on(h2)) and not os.path.exists(on(h3))
        # on h1 and h2, each node reads its own copy: no word about it
        back = run(c, base + ["--num_epochs", "2", "--resume", str(ck), "--shared_storage",
                              "false"], hosts=[h1, h2])
        # the job comes back on h2 and h3: h3 has no copy, said in one line naming it, and
        # it gets h2's over MPI (issue 44: a node that lost its disk is taken back)
        lost = run(c, base + ["--num_epochs", "3", "--resume", str(ck), "--shared_storage",
                              "false", "--checkpoint", str(ck)], hosts=[h2, h3])
        h3_has_it = os.path.exists(on(h3))
    assert back.returncode == 0 and "checkpoints differ" not in back.stderr, back.stderr
    assert lost.returncode == 0, lost.stdout + lost.stderr
    said = [ln for ln in lost.stderr.splitlines() if "node-local checkpoints differ" in ln]
    assert len(said) == 1 and f"rank 1 on host {h3}: checkpoint" in said[0] \
        and "does not exist" in said[0] and "sent over MPI to rank 1" in said[0], lost.stderr
    assert h3_has_it  # written there when the resumed run checkpointed
