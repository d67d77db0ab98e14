"""The catalogue of bad inputs, through the real ``distnn`` command on 1 and 2 ranks.

Every case must end every rank with exit status 2 and one line on stderr that names the
culprit (option or file) — no traceback — and must leave no output file behind, whole or
half-written (no ``.part`` temporary either), while files that existed are untouched.
"""
from __future__ import annotations

import hashlib
import os
import resource
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers import COMMAND, MPIEXEC, child_env, launcher

# Tiny and fast: the cases fail before training, or after one short epoch.
DATA = ["--dataset", "synthetic", "--input_shape", "1,8,8", "--num_samples", "96",
        "--batch_size", "16", "--quiet", "--evaluate", "false", "--num_epochs", "1",
        "--steps_per_epoch", "2", "--learning_rate", "0.001"]


def distnn(*args, cwd, ranks=1, limit_file_size=None):
    def limits():
        if limit_file_size is not None:  # writes beyond it fail (EFBIG): a full disk
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit_file_size, limit_file_size))

    return subprocess.run([*launcher(ranks), *COMMAND, *map(str, args)], capture_output=True,
                          text=True, timeout=180, cwd=cwd, env=child_env(), preexec_fn=limits)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A real checkpoint and a real weights file written by the command, and broken ones."""
    folder = tmp_path_factory.mktemp("inputs")
    proc = distnn("train", *DATA, "--checkpoint", "ck.npz", "--save_weights", "w.npz",
                  cwd=folder)
    assert proc.returncode == 0, proc.stderr
    raw = (folder / "ck.npz").read_bytes()
    (folder / "trunc.npz").write_bytes(raw[:len(raw) // 2])
    (folder / "random.npz").write_bytes(os.urandom(4096))
    (folder / "empty.npz").write_bytes(b"")
    return folder


# (id, arguments, words the one line must hold); files are copied into the run's folder.
CASES = [
    ("resume-random-bytes", ["--resume", "random.npz"], ["--resume", "random.npz"]),
    ("resume-truncated", ["--resume", "trunc.npz"], ["--resume", "trunc.npz", "truncated"]),
    ("resume-empty", ["--resume", "empty.npz"], ["--resume", "empty.npz"]),
    ("resume-weights-file", ["--resume", "w.npz"],
     ["--resume", "w.npz", "--weights_and_bias_filename"]),
    ("weights-checkpoint", ["--weights_and_bias_filename", "ck.npz"],
     ["--weights_and_bias_filename", "ck.npz", "--resume"]),
    ("weights-random-bytes", ["--weights", "random.npz"],
     ["--weights_and_bias_filename", "random.npz"]),
    ("weights-truncated", ["--weights", "trunc.npz"],
     ["--weights_and_bias_filename", "trunc.npz"]),
    ("weights-missing", ["--weights", "nope.npz"], ["--weights_and_bias_filename", "nope.npz"]),
    ("early-stopping-typo", ["--early_stopping", "val_los,<,2"],
     ["--early_stopping", "val_los", "val_loss"]),
    ("target-metric-typo", ["--target_metric", "val_acuracy,>,0.9"],
     ["--target_metric", "val_acuracy", "val_accuracy"]),
    ("plateau-metric-typo", ["--lr_schedulers", "reduce_lr_on_plateau",
                             "--reduce_lr_on_plateau_metric", "vall_loss"],
     ["--reduce_lr_on_plateau_metric", "vall_loss"]),
    ("stop-at-loss-no-threshold", ["--lr_schedulers", "stop_at_loss"],
     ["--stop_at_loss_threshold"]),
    ("model-checkpoint-pattern", ["--lr_schedulers", "model_checkpoint",
                                  "--model_checkpoint_file", "m-{val_los}.npz"],
     ["--model_checkpoint_file", "val_los"]),
    ("checkpoint-exists", ["--checkpoint", "ck.npz"], ["--checkpoint", "ck.npz", "--overwrite"]),
    ("save-weights-under-a-file", ["--save_weights", "w.npz/out.npz"], ["--save_weights"]),
    ("history-is-a-folder", ["--history_file", "."], ["--history_file", "folder"]),
    ("trace-under-a-file", ["--trace", "w.npz/t.json"], ["--trace", "w.npz"]),
    ("save-weights-device", ["--save_weights", "/dev/null"], ["--save_weights", "/dev/null"]),
    ("cprofile-under-a-file", ["--cprofile", "w.npz/p.prof"], ["--cprofile"]),
    ("same-file-twice", ["--save_weights", "same.npz", "--history_file", "same.npz"],
     ["--save_weights", "--history_file", "same.npz"]),
    # A full disk: a 16 kB tmpfs (as root), else (1 rank) a 16 kB file-size limit.
    ("disk-full-save-weights", ["--save_weights", "{full}/out.npz"], ["--save_weights"]),
    ("disk-full-checkpoint", ["--checkpoint", "{full}/ck.npz"], ["--checkpoint"]),
]


@pytest.fixture(scope="module")
def full_disk(tmp_path_factory):
    """A folder on a 16 kB file system (None when this process may not mount one)."""
    folder = tmp_path_factory.mktemp("full")
    mounted = False
    if os.geteuid() == 0 and shutil.which("mount"):
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs",
                                  str(folder)], capture_output=True).returncode == 0
    yield folder if mounted else None
    if mounted:
        subprocess.run(["umount", str(folder)], capture_output=True)


def _digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in folder.iterdir() if p.is_file()}


# One case of each class also runs on 2 ranks (every case costs a launch).
ON_TWO_RANKS = {"resume-truncated", "resume-weights-file", "weights-checkpoint",
                "weights-random-bytes", "early-stopping-typo", "checkpoint-exists",
                "save-weights-under-a-file", "trace-under-a-file", "disk-full-checkpoint"}
PARAMS = [pytest.param(*case, 1, id=f"{case[0]}-1") for case in CASES] + [
    pytest.param(*case, 2, id=f"{case[0]}-2", marks=pytest.mark.mpi)
    for case in CASES if case[0] in ON_TWO_RANKS]


@pytest.mark.parametrize("case, args, words, ranks", PARAMS)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(files, full_disk, tmp_path, case,
                                                         args, words, ranks):
    if ranks > 1 and MPIEXEC is None:
        pytest.skip("needs mpiexec")
    limit = None
    if any("{full}" in a for a in args):
        if full_disk is None and ranks > 1:
            pytest.skip("a full disk under mpiexec needs a tmpfs (root)")
        if full_disk is None:
            limit, where = 16_000, tmp_path / "full"  # writes beyond 16 kB fail (EFBIG)
            where.mkdir()
        else:
            where = full_disk
        args = [a.replace("{full}", str(where)) for a in args]
    for name in ("ck.npz", "w.npz", "trunc.npz", "random.npz", "empty.npz"):
        shutil.copy(files / name, tmp_path / name)
    before = _digest(tmp_path)
    # An output the run would write if it got that far (unless the case names it).
    extra = [] if "--save_weights" in args else ["--save_weights", "out.npz"]
    proc = distnn("train", *DATA, *extra, *args, cwd=tmp_path, ranks=ranks,
                  limit_file_size=limit)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr and "allow_pickle" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    line = lines[0]
    assert line.startswith("distnn train: error: "), line
    for word in words:
        assert word in line, (word, line)
    after = _digest(tmp_path)
    assert after == before, f"files changed or appeared: {set(after.items()) ^ set(before.items())}"
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith(".part")]
    if full_disk is not None:
        assert not os.listdir(full_disk)  # nothing half-written on the full disk
