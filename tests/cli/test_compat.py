"""The seed systems' own commands, options and files through the real ``distnn train``:
PyDTNN (pydtnn_benchmark), NNLO (TrainingDriver) and Theano-MPI (tmlauncher -cfg=...).

The commands are those of their documentation, shortened (few steps, 1-2 epochs) and with
data paths pointing at test fixtures or at Fashion-MNIST (which uses MNIST's file names).
"""
from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import COMMAND, child_env, launcher
from helpers import needs_mpiexec as needs_mpi

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data"))
from datafiles import write_h5_list, write_mnist, write_pydtnn_shards  # noqa: E402

FASHION = Path("/usr/share/datasets/fashion-mnist")


def run(*args, cwd=None, ranks=1, timeout=180, extra_env=None):
    return subprocess.run([*launcher(ranks), *COMMAND, *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, cwd=cwd, env=child_env(**(extra_env or {})))


def history(path) -> dict:
    return json.loads(Path(path).read_text())


@pytest.fixture
def mnist_dir(tmp_path):
    """Fashion-MNIST where installed, else MNIST-format fixture files (same file names)."""
    if all((FASHION / f"{n}.gz").is_file() for n in (
            "train-images-idx3-ubyte", "train-labels-idx1-ubyte",
            "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")):
        return FASHION
    write_mnist(tmp_path / "mnist", n_train=400, n_test=100)
    return tmp_path / "mnist"


# -- PyDTNN ------------------------------------------------------------------------------------
@needs_mpi
@pytest.mark.mpi
def test_pydtnn_readme_command(tmp_path, mnist_dir):
    # PyDTNN's README / run_mpi_mnist.sh (mpirun -np 4 ... benchmarks_CNN.py), shortened,
    # through PyDTNN's door (--like pydtnn: its meanings, the learning rate's included).
    proc = run(
        "train", "--like=pydtnn", "--model=simplecnn", "--dataset=mnist",
        f"--dataset_train_path={mnist_dir}", f"--dataset_test_path={mnist_dir}",
        "--test_as_validation=False", "--batch_size=32", "--validation_split=0.2",
        "--steps_per_epoch=3", "--num_epochs=2", "--evaluate=True", "--optimizer=rmsprop",
        "--learning_rate=0.001", "--momentum=0.9",
        "--loss_func=categorical_accuracy,categorical_cross_entropy",
        "--lr_schedulers=early_stopping,reduce_lr_every_nepochs",
        "--reduce_lr_every_nepochs_factor=0.5", "--reduce_lr_every_nepochs_nepochs=1",
        "--early_stopping_metric=val_categorical_cross_entropy",
        "--early_stopping_patience=10", "--parallel=data", "--non_blocking_mpi=False",
        "--tracing=False", "--profile=False", "--enable_gpu=False", "--dtype=float32",
        "--history_file=h.json", "--download=False", cwd=tmp_path, ranks=2)
    assert proc.returncode == 0, proc.stderr
    h = history(tmp_path / "h.json")
    # the metric of the --loss_func list is logged, the loss is cross-entropy
    assert {"loss", "accuracy", "val_loss", "val_accuracy"} <= set(h)
    # the LR schedule fired, on PyDTNN's per-sample rate: 0.001 / (32 x 2 ranks) each step
    assert h["lr"] == pytest.approx([0.001 / 64, 0.0005 / 64])
    assert proc.stderr.count("note: --learning_rate 0.001 is per sample") == 1
    # --evaluate=True: before and after training, as PyDTNN
    before = [line for line in proc.stdout.splitlines() if line.startswith("Test (before")]
    after = [line for line in proc.stdout.splitlines() if line.startswith("Test:")]
    assert len(before) == 1 and len(after) == 1, proc.stdout
    assert "accuracy=" in after[0]


@pytest.mark.parametrize("loss_func,keys", [
    ("mse", {"loss", "accuracy"}),
    ("bce", {"loss", "accuracy"}),
    ("mae", {"loss", "accuracy"}),
    ("categorical_accuracy,regression_mae,categorical_cross_entropy",
     {"loss", "accuracy", "mae"}),
])
def test_pydtnn_loss_functions_on_a_bundled_dataset(tmp_path, loss_func, keys):
    data = tmp_path / "mnist"
    write_mnist(data, n_train=64, n_test=32)
    proc = run("train", "--dataset=mnist", f"--dataset_path={data}", "--download=False",
               "--batch_size=16", "--steps_per_epoch=2", "--num_epochs=1", "--quiet",
               f"--loss_func={loss_func}", "--history_file=h.json", "--evaluate=False",
               cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    h = history(tmp_path / "h.json")
    assert keys | {f"val_{k}" for k in keys} <= set(h)
    assert np.isfinite(h["loss"][0])


@pytest.mark.parametrize("given,loss,metrics", [
    ("categorical_accuracy,categorical_cross_entropy", "categorical_cross_entropy",
     ("categorical_accuracy",)),
    ("regression_mse", "mse", ("categorical_accuracy",)),
    ("regression_mse,binary_cross_entropy", "binary_cross_entropy",
     ("categorical_accuracy", "mse")),
    ("categorical_crossentropy", "categorical_cross_entropy", ("categorical_accuracy",)),
])
def test_pydtnn_and_keras_loss_spellings(given, loss, metrics):
    from distnn.cli.main import build_parser, config_from_args
    cfg = config_from_args(build_parser().parse_args(["train", f"--loss_func={given}"]))
    assert cfg.optim.loss_func == loss and cfg.optim.metrics == metrics
    cfg = config_from_args(build_parser().parse_args(
        ["train", "--loss", given, "--metrics", "acc,regression_mae"]))
    assert cfg.optim.loss_func == loss and "mae" in cfg.optim.metrics


@pytest.mark.parametrize("given,model", [("vgg11bn_cifar10", "vgg11bn"),
                                          ("alexnet_cifar10", "alexnet_cifar10"),
                                          ("simplecnn", "simplecnn")])
def test_pydtnn_model_names(given, model):
    from distnn.cli.main import build_parser, config_from_args
    cfg = config_from_args(build_parser().parse_args(["train", f"--model={given}"]))
    assert cfg.model.model == model


def test_nnlo_train_data_needs_the_hdf5_dataset():
    from distnn.run.config import ConfigError
    from distnn.cli.main import build_parser, config_from_args
    cfg = config_from_args(build_parser().parse_args(["train", "--train_data", "t.list"]))
    assert cfg.data.dataset == "hdf5" and cfg.data.train_list == "t.list"
    with pytest.raises(ConfigError, match="--train_list/--train_data .* got --dataset mnist"):
        config_from_args(build_parser().parse_args(
            ["train", "--dataset", "mnist", "--train_data", "t.list"]))


def test_pydtnn_loss_list_errors_name_the_option(tmp_path):
    proc = run("train", "--loss_func=categorical_accuracy", "--num_epochs=0", cwd=tmp_path)
    assert proc.returncode == 2
    assert "--loss_func" in proc.stderr and "add a loss" in proc.stderr


def test_enable_gpu_is_a_clear_error(tmp_path):
    proc = run("train", "--enable_gpu=True", "--num_epochs=0", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().count("\n") == 0
    assert "--enable_gpu: no GPU backend in this build" in proc.stderr


@needs_mpi
@pytest.mark.mpi
def test_pydtnn_shared_storage_tracing_and_profile(tmp_path):
    data = tmp_path / "mnist"
    write_mnist(data, n_train=96, n_test=32)
    proc = run("train", "--dataset=mnist", f"--dataset_path={data}", "--download=False",
               "--batch_size=16", "--steps_per_epoch=2", "--num_epochs=1",
               "--evaluate=False", "--shared_storage=False", "--history_file=h{rank}.json",
               "--save_weights=w{rank}.npz", "--tracing=True", "--profile=True",
               "--blocking_mpi", cwd=tmp_path, ranks=2)
    assert proc.returncode == 0, proc.stderr
    # each rank wrote its own copy of the outputs
    for r in (0, 1):
        assert history(tmp_path / f"h{r}.json")["epoch"] == [1]
        assert (tmp_path / f"w{r}.npz").is_file()
        trace = json.loads((tmp_path / f"distnn-trace.json.rank{r}").read_text())
        assert trace  # --tracing: the Chrome trace
    assert "note: --tracing" in proc.stderr
    # --profile: distnn's per-layer table and PyDTNN's cProfile listing
    assert "Profile of epoch 1" in proc.stdout
    assert "cProfile (rank 0)" in proc.stdout and "cumtime" in proc.stdout


def test_pydtnn_imagenet_shards_round_trip(tmp_path):
    # --dataset_train_path / --dataset_test_path straight at two folders of PyDTNN shards
    write_pydtnn_shards(tmp_path / "np" / "train", [6, 5], num_classes=1000)
    _, _, y_val = write_pydtnn_shards(tmp_path / "np" / "validation", [7], seed=1)
    common = ["--dataset=imagenet", f"--dataset_train_path={tmp_path / 'np' / 'train'}",
              f"--dataset_test_path={tmp_path / 'np' / 'validation'}", "--model=simplemlp",
              "--batch_size=4", "--quiet"]
    proc = run("train", *common, "--validation_split=0.0", "--steps_per_epoch=2",
               "--num_epochs=1", "--evaluate=True", "--save_weights=w.npz", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "Test (before training)" in proc.stdout and "(7 samples" in proc.stdout
    proc = run("predict", *common, "--weights=w.npz", "--output=p.csv", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    with open(tmp_path / "p.csv") as f:
        rows = list(csv.DictReader(f))
    # labels 1..1000 of the (N, 1) int16 'y' come back 0-based, in order
    assert [int(r["label"]) for r in rows] == list(y_val[:, 0].astype(int) - 1)


# -- NNLO --------------------------------------------------------------------------------------
@needs_mpi
@pytest.mark.mpi
def test_nnlo_readme_command(tmp_path):
    # mpirun -np 3 TrainingDriver --model mnist --loss categorical_crossentropy --epochs 3
    #   --trial-name n3g1epoch3 --train_data /path/to/train_mnist.list
    #   --val_data /path/to/test_mnist.list
    train, _, _ = write_h5_list(tmp_path, "train_mnist", [40, 30, 50, 20], one_hot=True)
    val, _, _ = write_h5_list(tmp_path, "test_mnist", [30], one_hot=True, seed=1)
    proc = run("train", "--model", "mnist", "--loss", "categorical_crossentropy", "--epochs",
               "2", "--trial-name", "n3g1epoch3", "--train_data", train, "--val_data", val,
               "--batch", "10", "--target-metric", "val_acc,>,1.1", cwd=tmp_path, ranks=3)
    assert proc.returncode == 0, proc.stderr
    assert "note: --model mnist" in proc.stderr
    # --trial-name names the history file as NNLO does (MODELFILE_TRIAL_history.json; its
    # --model mnist is the file model_mnist_tf.py)
    h = history(tmp_path / "model_mnist_tf_n3g1epoch3_history.json")
    assert h["epoch"] == [1, 2] and {"val_loss", "val_accuracy"} <= set(h)
    assert h["loss"][1] < h["loss"][0]


@needs_mpi
@pytest.mark.mpi
def test_nnlo_validate_every_checkpoint_and_restore(tmp_path):
    # the GAN example's options (MPIGDriver): --features-name X --labels-name y
    # --checkpoint NAME --checkpoint-int 1, then --restore NAME; --early and --validate-every
    train, _, _ = write_h5_list(tmp_path, "train", [40, 40], features_name="X",
                                labels_name="y")
    val, _, _ = write_h5_list(tmp_path, "val", [24], features_name="X", labels_name="y",
                              seed=1)
    common = ["--model", "simplecnn", "--loss",
              "categorical_crossentropy", "--train_data", train, "--val_data", val,
              "--features-name", "X", "--labels-name", "y", "--batch", "10",
              "--checkpoint", "ganCP", "--checkpoint-int", "1", "--early", "val_loss,~<,4",
              "--history_file", "h.json", "--validate-every", "2"]
    proc = run("train", *common, "--epochs", "1", cwd=tmp_path, ranks=2)
    assert proc.returncode == 0, proc.stderr
    # 80 samples, global batch 20: 4 updates, validated after updates 2 and 4
    lines = [ln for ln in proc.stderr.splitlines() + proc.stdout.splitlines()
             if "Validation after" in ln]
    assert [ln.split("Validation after ")[1].split()[0] for ln in lines] == ["2", "4"]
    assert (tmp_path / "ganCP").is_file()
    # NNLO's restore command: the same command with --restore NAME added
    proc = run("train", *common, "--epochs", "2", "--restore", "ganCP", cwd=tmp_path,
               ranks=2)
    assert proc.returncode == 0, proc.stderr
    assert history(tmp_path / "h.json")["epoch"] == [1, 2]


def test_nnlo_model_file_with_its_horovod_and_timeline_options(tmp_path):
    # mpirun -np 5 python3 TrainingDriver.py --model examples/example_mnist.py
    #   --loss categorical_crossentropy --epochs 3 --n-processes 2   (+ --timeline)
    (tmp_path / "example_mnist.py").write_text(
        "from distnn.nn import Dense, Flatten, ReLU, Sequential\n\n\n"
        "def get_model():\n"
        "    return Sequential([Flatten(), Dense(16), ReLU(), Dense(10)])\n")
    train, _, _ = write_h5_list(tmp_path, "train", [48])
    val, _, _ = write_h5_list(tmp_path, "val", [16], seed=1)
    proc = run("train", "--model", "example_mnist.py", "--loss", "categorical_crossentropy",
               "--epochs", "1", "--n-processes", "2", "--train_data", train, "--val_data",
               val, "--batch", "16", "--timeline", "--trial-name", "ring", "--quiet",
               cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "note: --n_processes 2: under --parallel data every rank already trains" \
        in proc.stderr
    assert "note: --timeline" in proc.stderr
    trace = json.loads((tmp_path / "example_mnist_ring_timeline.json").read_text())
    assert trace and history(tmp_path / "example_mnist_ring_history.json")["epoch"] == [1]


SITE = '''
import os, h5py
_log = os.environ["H5_OPEN_LOG"]
_rank = os.environ.get("PMI_RANK", "0")
_open, _get = h5py.File.__init__, h5py.Dataset.__getitem__

def _logged_open(self, name, *a, **k):
    if isinstance(name, (str, os.PathLike)):
        with open(_log, "a") as f:
            f.write(f"{_rank} open {os.path.basename(str(name))}\\n")
    return _open(self, name, *a, **k)

def _logged_get(self, key):
    value = _get(self, key)
    if isinstance(key, slice):
        with open(_log, "a") as f:
            f.write(f"{_rank} read {os.path.basename(self.file.filename)} "
                    f"{self.name} {len(value)}\\n")
    return value

h5py.File.__init__, h5py.Dataset.__getitem__ = _logged_open, _logged_get
'''


@needs_mpi
@pytest.mark.mpi
@pytest.mark.parametrize("files", [4, 1])
def test_hdf5_each_rank_opens_only_its_part(tmp_path, files):
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(SITE)
    sizes = [30, 20, 25, 15][:files] if files > 1 else [60]
    train, _, _ = write_h5_list(tmp_path, "train", sizes)
    log = tmp_path / "opens.log"
    proc = run("train", "--train_data", train, "--batch", "8", "--epochs", "1",
               "--validation_split", "0.25", "--evaluate", "false", "--quiet",
               "--history_file", "h.json", cwd=tmp_path, ranks=2,
               extra_env={"PYTHONPATH": str(tmp_path / "site"), "H5_OPEN_LOG": str(log)})
    assert proc.returncode == 0, proc.stderr
    events = [line.split() for line in log.read_text().splitlines()]
    opened = {r: sorted(e[2] for e in events if e[0] == r and e[1] == "open")
              for r in ("0", "1")}
    if files >= 2:  # whole files, round-robin: rank 0 files 0 and 2, rank 1 files 1 and 3
        assert opened == {"0": ["train_0.h5", "train_2.h5"],
                          "1": ["train_1.h5", "train_3.h5"]}
    else:  # fewer files than ranks: every rank reads only its half of the rows
        reads = {(e[0], e[3]): int(e[4]) for e in events if e[1] == "read"}
        assert reads == {("0", "/features"): 30, ("0", "/labels"): 30,
                         ("1", "/features"): 30, ("1", "/labels"): 30}
    h = history(tmp_path / "h.json")
    assert h["epoch"] == [1] and np.isfinite(h["loss"][0])


# -- Theano-MPI --------------------------------------------------------------------------------
SYNTH = ["--dataset", "synthetic", "--input_shape", "1,8,8", "--num_samples", "256",
         "--batch_size", "16", "--steps_per_epoch", "3", "--num_epochs", "1",
         "--evaluate", "false"]


@needs_mpi
@pytest.mark.mpi
def test_theano_mpi_session_file(tmp_path):
    # examples/session.cfg of Theano-MPI, read by -cfg= as tmlauncher does
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "modelfile.py").write_text(
        "from distnn.nn import Dense, Flatten, ReLU, Sequential\n\n\n"
        "class ModelClass(Sequential):\n"
        "    def __init__(self, input_shape, num_classes):\n"
        "        super().__init__([Flatten(), Dense(32), ReLU(), Dense(num_classes)],\n"
        "                         input_shape=input_shape)\n")
    (tmp_path / "session.cfg").write_text(
        '# example launcher config : run with "tmlauncher -cfg=session.cfg"\n\n'
        "RULE=BSP\nMODELFILE=models.modelfile\nMODELCLASS=ModelClass\nSIZE=2\n"
        "DEVICES=cuda0,cuda1\nBSP_SYNC_TYPE=cdd\n")
    proc = run("train", "-cfg=session.cfg", *SYNTH, "--verbose", "--learning_rate", "0.01",
               "--learning_rate_scaling", "--history_file", "h.json", cwd=tmp_path, ranks=2)
    assert proc.returncode == 0, proc.stderr
    assert "note: DEVICES=cuda0,cuda1: not applicable" in proc.stderr
    assert "note: SIZE=2" in proc.stderr and "note: BSP_SYNC_TYPE=cdd" in proc.stderr
    assert proc.stderr.count("note: DEVICES") == 1  # said once, not once per rank
    # MODELFILE/MODELCLASS built the model: 64*32+32 + 32*10+10 parameters
    assert "2,410" in proc.stdout
    # RULE=BSP is distnn's synchronous data parallelism
    assert any(line.split() == ["parallel", ":", "data"] for line in proc.stdout.splitlines())
    # --learning_rate_scaling (Theano-MPI's advice): the rate times the number of workers
    assert history(tmp_path / "h.json")["lr"] == [pytest.approx(0.02)]


def test_theano_mpi_launcher_flags(tmp_path):
    # tmlauncher -r=BSP -file=models.modelfile -class=ModelClass -s=1 (its flags, no file)
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "modelfile.py").write_text(
        "from distnn.nn import Dense, Flatten, Sequential\n\n\n"
        "def ModelClass(num_classes):\n"
        "    return Sequential([Flatten(), Dense(num_classes)])\n")
    proc = run("train", "-r=BSP", "-file=models.modelfile", "-class=ModelClass", "-s=1",
               "-bsp_exch_strategy=nccl16", "-b", *SYNTH, "--history_file", "h.json",
               cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "650 parameters" in proc.stdout or "Total parameters: 650" in proc.stdout
    assert "note: BSP_EXCH_STRATEGY=nccl16: gradients travel as float16" in proc.stderr
    assert "note: SIZE=1" in proc.stderr and "note: BIND" in proc.stderr
    assert history(tmp_path / "h.json")["epoch"] == [1]


def test_theano_mpi_session_file_errors(tmp_path):
    (tmp_path / "bad.cfg").write_text("RULE=ASGD\n")
    proc = run("train", "--config", "bad.cfg", cwd=tmp_path)
    assert proc.returncode == 2 and "RULE=ASGD" in proc.stderr and "BSP" in proc.stderr
    (tmp_path / "half.cfg").write_text("RULE=BSP\nMODELCLASS=AlexNet\n")
    proc = run("train", "--config", "half.cfg", cwd=tmp_path)
    assert proc.returncode == 2 and "MODELFILE and MODELCLASS" in proc.stderr


@needs_mpi
@pytest.mark.mpi
@pytest.mark.parametrize("rule,parallel", [("EASGD", "easgd"), ("GOSGD", "gossip")])
def test_theano_mpi_rules(tmp_path, rule, parallel):
    (tmp_path / "session.cfg").write_text(f"RULE={rule}\nSIZE=2\n")
    proc = run("train", "-cfg=session.cfg", *SYNTH, "--verbose", "--history_file", "h.json",
               cwd=tmp_path, ranks=2)
    assert proc.returncode == 0, proc.stderr
    assert any(line.split() == ["parallel", ":", parallel]
               for line in proc.stdout.splitlines()), proc.stdout
    assert history(tmp_path / "h.json")["epoch"] == [1]
