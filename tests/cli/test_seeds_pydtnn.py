"""PyDTNN's and Theano-MPI's users, round 2, through the real ``distnn`` command: PyDTNN's
per-sample learning rate, its ImageNet nets and weights files; Theano-MPI's MODELFILE as
a package module next to the session file."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data"))
from datafiles import write_pydtnn_shards  # noqa: E402

from distnn.cli.compat import option_of  # noqa: E402
from distnn.cli.pydtnn_rate import PYDTNN_FLAGS  # noqa: E402
from test_compat import FASHION, history, needs_mpi, run  # noqa: E402

needs_fashion = pytest.mark.skipif(not (FASHION / "train-images-idx3-ubyte.gz").is_file(),
                                   reason="needs Fashion-MNIST in /usr/share/datasets")

# PyDTNN's README example (pydtnn_benchmark ... --optimizer=Adam --learning_rate=0.1), on
# Fashion-MNIST (MNIST's file names), 1 epoch, through PyDTNN's door (--like pydtnn)
PYDTNN_README = [
    "--like=pydtnn", "--model=simplecnn", "--dataset=mnist", f"--dataset_train_path={FASHION}",
    f"--dataset_test_path={FASHION}", "--test_as_validation=False", "--batch_size=64",
    "--validation_split=0.2", "--num_epochs=1", "--evaluate=True", "--optimizer=Adam",
    "--learning_rate=0.1", "--loss_func=categorical_accuracy,categorical_cross_entropy",
    "--parallel=data", "--tracing=False", "--profile=False", "--enable_gpu=False",
    "--dtype=float32", "--download=False"]
NOTE = "note: --learning_rate 0.1 is per sample, PyDTNN's meaning"


def _test_accuracy(stdout: str) -> float:
    line = [ln for ln in stdout.splitlines() if ln.startswith("Test:")]
    assert len(line) == 1, stdout
    return float(re.search(r"accuracy=([0-9.]+)", line[0]).group(1))


# -- PyDTNN's learning rate ---------------------------------------------------------------------
def _config(*argv):
    from distnn.cli.main import build_parser, config_from_args
    args, unknown = build_parser().parse_known_args(["train", *argv])
    assert not unknown
    return config_from_args(args)


def _at_default(flag: str) -> str:
    """``--flag=VALUE`` with the value its option has anyway (the line means the same)."""
    default = option_of(flag).default
    if default is None or isinstance(default, bool):
        return f"--{flag}={str(default).lower()}"
    return f"--{flag}={','.join(default) if isinstance(default, tuple) else default}"


@pytest.mark.parametrize("flag", sorted(PYDTNN_FLAGS))
def test_learning_rate_means_the_same_with_or_without_a_pydtnn_only_flag(flag):
    # outside the door: distnn's meaning, whatever else the line spells
    plain = _config("--learning_rate=0.05")
    spelled = _config("--learning_rate=0.05", _at_default(flag))
    assert plain.optim.learning_rate == spelled.optim.learning_rate == 0.05
    assert not plain.optim.lr_per_sample and not spelled.optim.lr_per_sample
    assert spelled == plain  # the whole configuration, not only the rate
    # through PyDTNN's door: PyDTNN's meaning (per sample), with or without its spellings
    door = _config("--like", "pydtnn", "--learning_rate=0.05")
    door_spelled = _config("--like=pydtnn", "--learning_rate=0.05", _at_default(flag))
    assert door.optim.learning_rate == door_spelled.optim.learning_rate == 0.05
    assert door.optim.lr_per_sample and door_spelled.optim.lr_per_sample
    assert door_spelled == door
    assert [n for n in door.notes if "per sample, PyDTNN's meaning (--like pydtnn)" in n]


def test_the_door_is_explicit_and_lr_per_sample_decides_inside_it():
    # PyDTNN's value spellings (a metrics-and-loss --loss_func list, a *_cifar10 model)
    # are not a door either
    cfg = _config("--learning_rate=0.1", "--model=vgg11_cifar10",
                  "--loss_func=categorical_accuracy,categorical_cross_entropy")
    assert (cfg.model.model, cfg.optim.lr_per_sample) == ("vgg11", False)
    assert any("run distnn train --like pydtnn" in n for n in cfg.notes), cfg.notes
    # no note when the line gives no rate, or says which meaning it wants
    assert not _config("--tracing=false").notes
    assert not _config("--tracing=false", "--learning_rate=0.1", "--lr_per_sample=false").notes
    # inside the door, an explicit --lr_per_sample false keeps the rate as given
    cfg = _config("--like=pydtnn", "--learning_rate=0.1", "--lr_per_sample=false")
    assert not cfg.optim.lr_per_sample and not cfg.notes
    cfg = _config("--like=distnn", "--learning_rate=0.1", "--lr_per_sample=true")
    assert cfg.optim.lr_per_sample
    with pytest.raises(SystemExit):
        _config("--like=keras")


@needs_mpi
@needs_fashion
@pytest.mark.mpi
def test_pydtnn_readme_command_trains_with_its_per_sample_rate(tmp_path):
    proc = run("train", *PYDTNN_README, "--history_file=h.json", cwd=tmp_path, ranks=2,
               timeout=400)
    assert proc.returncode == 0, proc.stderr
    # one note line, once (rank 0), saying what --learning_rate means here and the way out
    notes = [ln for ln in proc.stderr.splitlines() if "per sample" in ln]
    assert len(notes) == 1 and NOTE in notes[0], proc.stderr
    assert "--lr_per_sample false" in notes[0] and "(--like pydtnn)" in notes[0]
    # PyDTNN's effective_learning_rate: 0.1 / (64 x 2 ranks)
    assert "learning rate 0.00078125" in proc.stdout
    assert history(tmp_path / "h.json")["lr"] == [pytest.approx(0.1 / 128)]
    assert _test_accuracy(proc.stdout) >= 0.80


@needs_mpi
@pytest.mark.mpi
def test_distnn_spelling_keeps_its_learning_rate_and_the_switch_works_both_ways(tmp_path):
    synth = ["--dataset=synthetic", "--num_samples=256", "--num_classes=4",
             "--input_shape=1,8,8", "--model=simplemlp", "--batch_size=16",
             "--steps_per_epoch=2", "--num_epochs=1", "--quiet"]
    # distnn's own spelling: the rate as given, no note
    proc = run("train", *synth, "--learning_rate", "0.05", "--history_file", "a.json",
               cwd=tmp_path, ranks=2)
    assert proc.returncode == 0, proc.stderr
    assert "per sample" not in proc.stderr
    assert history(tmp_path / "a.json")["lr"] == [pytest.approx(0.05)]
    # distnn's spelling asking for PyDTNN's meaning: / (16 x 2)
    proc = run("train", *synth, "--learning_rate=0.05", "--lr_per_sample=true",
               "--history_file=b.json", cwd=tmp_path, ranks=2)
    assert proc.returncode == 0, proc.stderr
    assert history(tmp_path / "b.json")["lr"] == [pytest.approx(0.05 / 32)]
    proc = run("train", *synth, "--learning_rate=0.05", "--lr_per_sample=true",
               "--history_file=b3.json", cwd=tmp_path, ranks=3)  # / (16 x 3)
    assert proc.returncode == 0, proc.stderr
    assert history(tmp_path / "b3.json")["lr"] == [pytest.approx(0.05 / 48)]
    # a PyDTNN command line (its --enable_gpu=False, --optimizer_momentum) choosing distnn's
    # meaning: as given, no note
    proc = run("train", *synth, "--learning_rate=0.05", "--enable_gpu=False",
               "--optimizer_momentum=0.5", "--lr_per_sample=False", "--history_file=c.json",
               cwd=tmp_path, ranks=2)
    assert proc.returncode == 0, proc.stderr
    assert "per sample" not in proc.stderr
    assert history(tmp_path / "c.json")["lr"] == [pytest.approx(0.05)]
    # ... and the same line without the switch: outside PyDTNN's door, still distnn's
    # meaning (its spellings do not change what --learning_rate means); a note names the door
    proc = run("train", *synth, "--learning_rate=0.05", "--enable_gpu=False",
               "--optimizer_momentum=0.5", "--global_batch_size=40", "--history_file=d.json",
               cwd=tmp_path, ranks=2)
    assert proc.returncode == 0, proc.stderr
    assert "is per sample" not in proc.stderr
    assert proc.stderr.count("run distnn train --like pydtnn") == 1, proc.stderr
    assert history(tmp_path / "d.json")["lr"] == [pytest.approx(0.05)]
    # through the door: PyDTNN's meaning, said once, with or without its spellings
    for name, pydtnn_flags in (("e", ["--enable_gpu=False", "--optimizer_momentum=0.5"]),
                               ("f", [])):
        proc = run("train", "--like", "pydtnn", *synth, "--learning_rate=0.05", *pydtnn_flags,
                   "--global_batch_size=40", f"--history_file={name}.json", cwd=tmp_path,
                   ranks=2)
        assert proc.returncode == 0, proc.stderr
        assert proc.stderr.count("is per sample, PyDTNN's meaning (--like pydtnn)") == 1, \
            proc.stderr
        assert "--global_batch_size 40" in proc.stderr
        assert history(tmp_path / f"{name}.json")["lr"] == [pytest.approx(0.05 / 40)]


@needs_mpi
@pytest.mark.mpi
def test_pydtnn_effective_learning_rate_and_decay_rate(tmp_path):
    # the two entries of PyDTNN's parameter dump, given back as options
    synth = ["--dataset=synthetic", "--num_samples=128", "--num_classes=4",
             "--input_shape=1,8,8", "--model=simplemlp", "--batch_size=16",
             "--steps_per_epoch=2", "--num_epochs=1"]
    proc = run("train", *synth, "--effective_learning_rate=0.000390625",
               "--decay_rate=0.0005", "--enable_gpu=False", "--verbose",
               "--history_file=h.json", cwd=tmp_path, ranks=2)
    assert proc.returncode == 0, proc.stderr
    assert history(tmp_path / "h.json")["lr"] == [pytest.approx(0.000390625)]
    dump = {tuple(ln.split()[:1]): ln.split()[-1] for ln in proc.stdout.splitlines()
            if len(ln.split()) == 3 and ln.split()[1] == ":"}
    assert dump[("decay",)] == "0.0005"
    assert dump[("lr_per_sample",)] == "False"
    assert "per sample" not in proc.stderr  # the effective rate is the rate applied
    # with a --learning_rate too: the effective one is applied and a note says so
    proc = run("train", *synth, "--learning_rate=0.1", "--effective_learning_rate=0.001",
               "--history_file=g.json", "--quiet", cwd=tmp_path, ranks=2)
    assert proc.returncode == 0, proc.stderr
    assert "note: --learning_rate 0.1: not used, --effective_learning_rate 0.001" in \
        proc.stderr
    assert history(tmp_path / "g.json")["lr"] == [pytest.approx(0.001)]
    proc = run("train", *synth, "--effective_learning_rate=0.001", "--lr_per_sample=true",
               cwd=tmp_path)
    assert proc.returncode == 2
    assert "--effective_learning_rate 0.001 is the rate applied" in proc.stderr


# -- PyDTNN's ImageNet nets -------------------------------------------------------------------
@pytest.mark.parametrize("model,built", [("alexnet", "alexnet_imagenet"),
                                         ("vgg11", "vgg11_imagenet")])
def test_pydtnn_imagenet_models_on_imagenet_shards(tmp_path, model, built):
    from distnn.models import get_model
    write_pydtnn_shards(tmp_path / "train", [4], shape=(3, 112, 112), num_classes=1000)
    write_pydtnn_shards(tmp_path / "val", [2], shape=(3, 112, 112), seed=1)
    proc = run("train", f"--model={model}", "--dataset=imagenet",
               f"--dataset_train_path={tmp_path / 'train'}",
               f"--dataset_test_path={tmp_path / 'val'}", "--validation_split=0.0",
               "--batch_size=2", "--steps_per_epoch=1",
               f"--num_epochs={1 if model == 'alexnet' else 0}", "--history_file=h.json",
               cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    expected = get_model(built, input_shape=(3, 112, 112), num_classes=1000, rng=0)
    header = proc.stdout.splitlines()[0]
    assert f"{model} (the zoo's {built}, for 3x112x112 images)" in header, header
    assert f"({expected.parameters_flat().size:,} parameters)" in header
    cifar = get_model(model, input_shape=(3, 32, 32), num_classes=1000, rng=0)
    assert cifar.name == model  # CIFAR-sized input keeps the CIFAR net


# -- PyDTNN's weights files ---------------------------------------------------------------------
@needs_mpi
@pytest.mark.mpi
def test_pydtnn_weights_files_round_trip_through_the_command(tmp_path):
    synth = ["--dataset=synthetic", "--num_samples=256", "--num_classes=10",
             "--input_shape=1,28,28", "--batch_size=16"]
    proc = run("train", *synth, "--model=simplecnn", "--steps_per_epoch=4", "--num_epochs=1",
               "--save_weights=w.npz", "--weights_layout=pydtnn", "--quiet", cwd=tmp_path,
               ranks=2)
    assert proc.returncode == 0, proc.stderr
    with np.load(tmp_path / "w.npz") as data:
        assert sorted(data.files) == sorted(["1_Conv2D_w", "1_Conv2D_b", "3_Conv2D_w",
                                             "3_Conv2D_b", "7_FC_w", "7_FC_b", "9_FC_w",
                                             "9_FC_b"])
        assert data["1_Conv2D_w"].shape == (4, 1, 3, 3)
    # read back (evaluate), and again after a distnn-layout copy: the same results
    a = run("evaluate", *synth, "--model=simplecnn", "--weights_and_bias_filename=w.npz",
            "--enable_gpu=False", cwd=tmp_path, ranks=2)
    assert a.returncode == 0, a.stderr
    assert "per sample" not in a.stderr  # evaluating has no learning rate to speak of
    from distnn.models import get_model
    model = get_model("simplecnn", rng=5)
    model.load_weights(tmp_path / "w.npz")
    model.save_weights(tmp_path / "d.npz")
    b = run("evaluate", *synth, "--model=simplecnn", "--weights_and_bias_filename=d.npz",
            cwd=tmp_path, ranks=2)
    assert b.returncode == 0, b.stderr
    def results(stdout):  # "Test: loss=... accuracy=..." without the timing
        return [ln.split(" (")[0] for ln in stdout.splitlines() if ln.startswith("Test")]

    assert results(a.stdout) and results(a.stdout) == results(b.stdout)
    # the wrong model: one clear line, exit 2, on every rank (no hang)
    proc = run("evaluate", *synth, "--model=lenet", "--weights_and_bias_filename=w.npz",
               cwd=tmp_path, ranks=2)
    assert proc.returncode == 2
    assert "PyDTNN's layout) holds the arrays of 4 layers" in proc.stderr
    assert "'lenet' has 5 layers" in proc.stderr and "Traceback" not in proc.stderr


# -- Theano-MPI's MODELFILE, a module of a package ---------------------------------------------
@needs_mpi
@pytest.mark.mpi
@pytest.mark.parametrize("where,ranks", [("session folder", 2), ("elsewhere", 3)])
def test_theano_mpi_modelfile_is_a_package_module(tmp_path, where, ranks):
    # Theano-MPI's layout: models/modelfile.py imports models.data.dataname
    exp = tmp_path / "exp"
    (exp / "models" / "data").mkdir(parents=True)
    (exp / "models" / "__init__.py").write_text("")
    (exp / "models" / "data" / "__init__.py").write_text("")
    (exp / "models" / "data" / "dataname.py").write_text("HIDDEN = 24\n")
    (exp / "models" / "modelfile.py").write_text(
        "from distnn.nn import Dense, Flatten, ReLU, Sequential\n"
        "from models.data.dataname import HIDDEN\n\n\n"
        "class ModelClass(Sequential):\n"
        "    def __init__(self, num_classes):\n"
        "        super().__init__([Flatten(), Dense(HIDDEN), ReLU(), Dense(num_classes)])\n")
    (exp / "session.cfg").write_text("RULE=BSP\nMODELFILE=models.modelfile\n"
                                     "MODELCLASS=ModelClass\nSIZE=2\n")
    cwd = exp if where == "session folder" else tmp_path
    config = "session.cfg" if where == "session folder" else "exp/session.cfg"
    proc = run("train", f"-cfg={config}", "--dataset=synthetic", "--num_samples=64",
               "--num_classes=4", "--input_shape=1,6,6", "--batch_size=8", "--num_epochs=1",
               "--history_file=h.json", cwd=cwd, ranks=ranks)
    assert proc.returncode == 0, proc.stderr
    # 36*24+24 + 24*4+4 parameters: the class of the module, with its package's HIDDEN
    assert "(988 parameters)" in proc.stdout, proc.stdout
    assert history(cwd / "h.json")["epoch"] == [1]
