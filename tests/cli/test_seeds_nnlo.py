"""NNLO's users through the real ``distnn`` command (issue 23): HDF5 file lists under
every training rule, a model file's data functions, its own hyper-parameters searched,
its output size checked, channels-last data for NHWC models, NNLO's output names.

The HDF5 files are written here in the real format (``datafiles.write_h5_list``); every
run is a real ``mpiexec -n N distnn ...``.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import COMMAND, MPIEXEC, child_env

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data"))
from datafiles import write_h5_list  # noqa: E402

pytestmark = [pytest.mark.mpi,
              pytest.mark.skipif(MPIEXEC is None, reason="needs mpiexec")]

MASTER_RULES = ("easgd", "downpour", "gem")

# Logs, per rank, every HDF5 file opened and every slice read (the rows each rank reads).
SITE = '''
import os, h5py
_log = os.environ["H5_OPEN_LOG"]
_rank = os.environ.get("PMI_RANK", "0")
_get = h5py.Dataset.__getitem__

def _logged_get(self, key):
    value = _get(self, key)
    if isinstance(key, slice):
        with open(_log, "a") as f:
            f.write(f"{_rank} {os.path.basename(self.file.filename)} {self.name} "
                    f"{len(value)}\\n")
    return value

h5py.Dataset.__getitem__ = _logged_get
'''


def run(*args, cwd, ranks=2, timeout=240, extra_env=None):
    return subprocess.run([MPIEXEC, "-n", str(ranks), *COMMAND, *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          env=child_env(**(extra_env or {})))


def history(path) -> dict:
    return json.loads(Path(path).read_text())


def write_model(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text)
    return path


# -- HDF5 parts under every rule -----------------------------------------------------------
@pytest.mark.parametrize("ranks", [2, 3, 4])
@pytest.mark.parametrize("rule", ["data", "localsgd", "gossip", *MASTER_RULES])
def test_every_rule_trains_on_per_rank_hdf5_parts(tmp_path, rule, ranks):
    # NNLO: mpirun -np N TrainingDriver --train_data train.list --val_data val.list
    #   --mode easgd|downpour|gem   (and distnn's own rules)
    sizes = [30, 20, 25, 15] if ranks < 4 else [50, 40]  # 4 ranks: fewer files than parts
    write_h5_list(tmp_path, "train", sizes, one_hot=True)
    write_h5_list(tmp_path, "val", [24], one_hot=True, seed=1)
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(SITE)
    log = tmp_path / "reads.log"
    proc = run("train", "--train_data", "train.list", "--val_data", "val.list", "--mode",
               rule, "--batch", 10, "--epochs", 2, "--quiet", "--history_file", "h.json",
               cwd=tmp_path, ranks=ranks,
               extra_env={"PYTHONPATH": str(tmp_path / "site"), "H5_OPEN_LOG": str(log)})
    assert proc.returncode == 0, proc.stderr
    # Which training rows each rank read: the ranks that train share the files (whole
    # files round-robin, or their rows of each file); a master reads none.
    reads: dict[int, dict[str, int]] = {}
    for line in log.read_text().splitlines():
        rank, file, dataset, n = line.split()
        if file.startswith("train_") and dataset == "/labels":
            reads.setdefault(int(rank), {})[file] = reads.get(int(rank), {}).get(file, 0) + int(n)
    trainers = list(range(1, ranks)) if rule in MASTER_RULES else list(range(ranks))
    files = [f"train_{k}.h5" for k in range(len(sizes))]
    if rule in MASTER_RULES:
        assert sum(reads.get(0, {}).values()) == 0  # the master holds no training part
    if len(files) >= len(trainers):
        for part, rank in enumerate(trainers):
            mine = files[part::len(trainers)]
            assert {f: n for f, n in reads[rank].items() if n} == \
                {f: sizes[files.index(f)] for f in mine}
    else:
        for k, f in enumerate(files):
            counts = [reads[r].get(f, 0) for r in trainers]
            assert sum(counts) == sizes[k] and min(counts) > 0
    h = history(tmp_path / "h.json")
    assert h["epoch"] == [1, 2] and np.all(np.isfinite(h["loss"]))
    assert h["loss"][1] < h["loss"][0]
    assert 0 <= h["val_accuracy"][1] <= 1


@pytest.mark.parametrize("rule", ["easgd", "downpour"])
def test_master_rules_with_a_validation_split_of_hdf5_parts(tmp_path, rule):
    write_h5_list(tmp_path, "train", [40, 30, 50])
    proc = run("train", "--train_data", "train.list", "--mode", rule, "--validation_split",
               0.2, "--batch", 10, "--epochs", 1, "--quiet", "--history_file", "h.json",
               cwd=tmp_path, ranks=3)
    assert proc.returncode == 0, proc.stderr
    assert "val_loss" in history(tmp_path / "h.json")


# -- a model file's NNLO data functions ----------------------------------------------------
NNLO_MODEL = '''
import glob
from distnn.nn import Dense, Flatten, ReLU, Sequential


def get_model():
    return Sequential([Flatten(), Dense(16), ReLU(), Dense(10)])


def get_name():
    return "mnist"


def get_train():
    return sorted(glob.glob("data/tr_*.h5"))


def get_val():
    return sorted(glob.glob("data/va_*.h5"))


def get_features():
    return "X"


def get_labels():
    return "Y"
'''


def test_model_file_data_functions_name_the_files_and_datasets(tmp_path):
    # NNLO: mpirun -np 3 TrainingDriver --model example_mnist.py --trial-name T
    # (no --train_data: the file's get_train()/get_val() list the HDF5 files)
    write_h5_list(tmp_path / "data", "tr", [40, 30], features_name="X", labels_name="Y")
    write_h5_list(tmp_path / "data", "va", [20], features_name="X", labels_name="Y", seed=1)
    write_model(tmp_path, "example_mnist.py", NNLO_MODEL)
    proc = run("train", "--model", "example_mnist.py", "--mode", "easgd", "--batch", 10,
               "--epochs", 2, "--trial-name", "T", cwd=tmp_path, ranks=3)
    assert proc.returncode == 0, proc.stderr
    assert ("note: --model example_mnist.py: NNLO data functions used: get_train(), "
            "get_val(), get_features(), get_labels()") in proc.stderr
    assert "on hdf5 (train 70, val 20)" in proc.stdout + proc.stderr
    h = history(tmp_path / "mnist_T_history.json")  # get_name(), as NNLO's driver names it
    assert h["epoch"] == [1, 2] and "val_accuracy" in h


def test_an_option_given_wins_over_the_model_files_function_with_a_note(tmp_path):
    write_h5_list(tmp_path / "data", "tr", [40], features_name="X", labels_name="Y")
    write_h5_list(tmp_path / "data", "va", [20], features_name="X", labels_name="Y", seed=1)
    write_h5_list(tmp_path, "other", [30], features_name="X", labels_name="Y", seed=2)
    write_model(tmp_path, "example_mnist.py", NNLO_MODEL)
    proc = run("train", "--model", "example_mnist.py", "--train_data", "other.list",
               "--batch", 10, "--epochs", 1, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "not used: get_train() (--train_list given)" in proc.stderr
    assert "on hdf5 (train 30, val 20)" in proc.stdout + proc.stderr


def test_a_bad_data_function_is_a_one_line_error(tmp_path):
    write_model(tmp_path, "m.py", NNLO_MODEL.replace(
        'return sorted(glob.glob("data/tr_*.h5"))', 'return "data/tr_0.h5"'))
    proc = run("train", "--model", "m.py", "--epochs", 1, cwd=tmp_path)
    assert proc.returncode == 2
    assert "get_train() must return a non-empty list of HDF5 file paths" in proc.stderr
    assert "Traceback" not in proc.stderr


# -- the model's output size --------------------------------------------------------------
def test_a_model_with_another_output_size_than_the_classes_stops_before_training(tmp_path):
    write_h5_list(tmp_path, "train", [40, 40])
    write_model(tmp_path, "seven.py", "from distnn.nn import Dense, Flatten, Sequential\n\n"
                "def get_model():\n    return Sequential([Flatten(), Dense(7)])\n")
    proc = run("train", "--model", "seven.py", "--train_data", "train.list", "--batch", 10,
               "--epochs", 1, cwd=tmp_path, ranks=3)
    assert proc.returncode == 2, proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if "error" in ln]
    assert len(errors) == 1, proc.stderr
    assert ("the model outputs 7 values per sample but the dataset (hdf5) has 10 classes"
            in errors[0])
    assert "Traceback" not in proc.stderr and "Epoch 1" not in proc.stderr


# -- channels-last data for a model written for NHWC input ---------------------------------
NHWC_TORCH = '''
import torch
{layout}

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.fc = torch.nn.Linear(4 * 6 * 6, 10)

    def forward(self, x):  # x: (N, H, W, C), as NNLO's HDF5 files store images
        x = x.permute(0, 3, 1, 2)
        return self.fc(torch.relu(self.conv(x)).flatten(1))


def get_model():
    return Net()
'''


def write_nhwc(folder: Path, name: str, n: int, seed: int) -> None:
    import h5py
    means = np.random.default_rng(7).standard_normal((10, 8, 8, 3))
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 10, n)
    with h5py.File(folder / f"{name}.h5", "w") as f:
        f["features"] = (means[y] + 0.5 * rng.standard_normal((n, 8, 8, 3))).astype("f4")
        f["labels"] = y
    (folder / f"{name}.list").write_text(f"{name}.h5\n")


@pytest.mark.parametrize("how", ["model file", "option", "neither"])
def test_channels_last_data_for_an_nhwc_torch_model(tmp_path, how):
    pytest.importorskip("torch")
    write_nhwc(tmp_path, "tr", 60, 1)
    write_nhwc(tmp_path, "va", 20, 2)
    layout = 'data_layout = "nhwc"' if how == "model file" else ""
    write_model(tmp_path, "nhwc_torch.py", NHWC_TORCH.format(layout=layout))
    extra = ["--data_layout", "nhwc"] if how == "option" else []
    proc = run("train", "--model", "nhwc_torch.py", "--train_data", "tr.list", "--val_data",
               "va.list", "--batch", 10, "--epochs", 2, "--quiet", "--history_file",
               "h.json", *extra, cwd=tmp_path)
    if how == "neither":  # read as NCHW (the default): the model says what it expected
        assert proc.returncode == 2
        assert "cannot run on inputs of shape (batch, 3, 8, 8)" in proc.stderr
        return
    assert proc.returncode == 0, proc.stderr
    h = history(tmp_path / "h.json")
    assert h["loss"][1] < h["loss"][0] and "val_accuracy" in h


def test_nhwc_refuses_the_nchw_augmentations(tmp_path):
    write_nhwc(tmp_path, "tr", 20, 1)
    proc = run("train", "--train_data", "tr.list", "--data_layout", "nhwc", "--flip_images",
               cwd=tmp_path)
    assert proc.returncode == 2
    assert "--flip_images and --crop_images work on NCHW images" in proc.stderr


# -- NNLO's own hyper-parameters searched ---------------------------------------------------
SEARCHED_MODEL = '''
from distnn.nn import Dense, Flatten, ReLU, Sequential


def get_model(**args):
    return Sequential([Flatten(), Dense(int(args.get("dense", 8))), ReLU(), Dense(10)])
'''


def test_search_passes_the_model_files_parameters_to_its_callable(tmp_path):
    # NNLO: get_model(**args) with get_model.parameter_range = [Integer(4, 40, name='dense')]
    write_h5_list(tmp_path, "train", [60, 40])
    write_h5_list(tmp_path, "val", [30], seed=1)
    write_model(tmp_path, "m.py", SEARCHED_MODEL)
    (tmp_path / "space.toml").write_text(
        "[space]\ndense = {int = [4, 40]}\nlearning_rate = {log_uniform = [1e-3, 1e-1]}\n")
    proc = run("search", "--model", "m.py", "--train_data", "train.list", "--val_data",
               "val.list", "--batch_size", 20, "--num_epochs", 1, "--block_size", 1,
               "--num_iterations", 3, "--space", "space.toml", "--output_dir", "out",
               cwd=tmp_path, ranks=3)
    assert proc.returncode == 0, proc.stderr
    trials = json.loads((tmp_path / "out" / "trials.json").read_text())
    best = trials["summary"]["best_params"]
    assert set(best) == {"dense", "learning_rate"} and 4 <= best["dense"] <= 40
    assert f'model_args = [["dense", {best["dense"]}]]' in \
        (tmp_path / "out" / "best.toml").read_text()
    # best.toml re-trains the best candidate: the model has its searched width
    proc = run("train", "--config", "out/best.toml", "--history_file", "h.json",
               cwd=tmp_path, ranks=1)
    assert proc.returncode == 0, proc.stderr
    dense = best["dense"]
    assert f"m.py ({64 * dense + dense + dense * 10 + 10:,} parameters)" in proc.stdout
    assert history(tmp_path / "h.json")["val_loss"][0] == pytest.approx(
        trials["summary"]["best_value"], rel=1e-6)


def test_search_refuses_a_key_the_model_callable_does_not_take(tmp_path):
    write_h5_list(tmp_path, "train", [40])
    write_model(tmp_path, "m.py", "from distnn.nn import Dense, Flatten, Sequential\n\n"
                "def get_model(width=8):\n    return Sequential([Flatten(), Dense(10)])\n")
    (tmp_path / "space.toml").write_text("[space]\ndense = {int = [4, 40]}\n")
    proc = run("search", "--model", "m.py", "--train_data", "train.list", "--space",
               "space.toml", cwd=tmp_path, ranks=2)
    assert proc.returncode == 2
    assert "get_model() takes no argument ['dense'] (its parameters: ['width'])" in proc.stderr


def test_model_args_on_the_command_line(tmp_path):
    write_h5_list(tmp_path, "train", [40])
    write_model(tmp_path, "m.py", SEARCHED_MODEL)
    proc = run("train", "--model", "m.py", "--model_args", "dense=33", "--train_data",
               "train.list", "--epochs", 1, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert f"m.py ({64 * 33 + 33 + 330 + 10:,} parameters)" in proc.stdout
    proc = run("train", "--model", "lenet", "--model_args", "dense=33", "--train_data",
               "train.list", "--epochs", 1, cwd=tmp_path)
    assert proc.returncode == 2 and "--model lenet is a zoo model" in proc.stderr


# -- NNLO's output names -------------------------------------------------------------------
def test_trial_name_and_one_collected_timeline_as_nnlo_names_them(tmp_path):
    # NNLO: mpirun -np 3 TrainingDriver --model mnist --trial-name n3 --timeline ...
    # writes model_mnist_tf_n3_history.json and one model_mnist_tf_n3_timeline.json
    write_h5_list(tmp_path, "train", [40, 40], one_hot=True)
    write_h5_list(tmp_path, "val", [20], one_hot=True, seed=1)
    proc = run("train", "--model", "mnist", "--train_data", "train.list", "--val_data",
               "val.list", "--mode", "downpour", "--batch", 10, "--epochs", 1,
               "--trial-name", "n3", "--timeline", "--quiet", cwd=tmp_path, ranks=3)
    assert proc.returncode == 0, proc.stderr
    assert history(tmp_path / "model_mnist_tf_n3_history.json")["epoch"] == [1]
    timeline = json.loads((tmp_path / "model_mnist_tf_n3_timeline.json").read_text())
    assert {e["pid"] for e in timeline["traceEvents"]} == {0, 1, 2}
    assert not list(tmp_path.glob("*.rank*"))
