"""The ``distnn`` command: options, config files, errors, and short runs on synthetic data."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from helpers import COMMAND, MPIEXEC, child_env
from helpers import needs_mpiexec as needs_mpi

from distnn.cli.main import build_parser, config_from_args, main
from distnn.cli.options import resolve_values
from distnn.run.config import (ConfigError, DataConfig, OptimizerConfig, RunConfig,
                               build_config, load_toml)
from distnn.run.options import OPTIONS

# Small, learnable, fast: simplecnn on 8x8 Gaussian classes.
DATA = ["--dataset", "synthetic", "--input_shape", "1,8,8", "--num_samples", "600",
        "--batch_size", "16", "--quiet"]
SYNTH = [*DATA, "--learning_rate", "0.001"]


def distnn(*args, cwd=None, timeout=120, launcher=()):
    return subprocess.run([*launcher, *COMMAND, *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, cwd=cwd, env=child_env())


def one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    return lines[0]


# -- --help --------------------------------------------------------------------------------
def test_train_help_lists_every_option():
    proc = distnn("train", "--help")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for option in OPTIONS:
        if "train" in option.commands:
            assert f"--{option.name}" in out, option.name
            assert option.help.split()[0] in out
    for title in ("Model:", "Dataset:", "Training:", "Optimizer:", "Parallel execution:",
                  "Learning-rate schedulers and callbacks:", "Output, profiling and tracing:"):
        assert title in out
    assert "--batch-size" in out and "--config" in out


@pytest.mark.parametrize("command", ["evaluate", "predict", "info", "convert-imagenet"])
def test_other_commands_have_help(command, capsys):
    with pytest.raises(SystemExit) as exc:
        main([command, "--help"])
    assert exc.value.code == 0
    assert "usage: distnn " + command in capsys.readouterr().out


def test_every_option_has_help_text():
    parser = build_parser()
    sub = parser._subparsers._group_actions[0].choices
    for command in ("train", "evaluate", "predict"):
        for action in sub[command]._actions:
            assert action.help, (command, action.dest)


# -- bad values: one line naming the option, the rule and the value, exit 2 -----------------
@pytest.mark.parametrize("args, words", [
    (["--batch_size", "0"], ["--batch_size", ">= 1", "'0'"]),
    (["--batch-size", "abc"], ["--batch_size", "integer", "abc"]),
    (["--learning_rate", "-1"], ["--learning_rate", "[0, inf)", "-1"]),
    (["--validation_split", "1.5"], ["--validation_split", "[0, 1)", "1.5"]),
    (["--model", "nosuchnet"], ["--model", "simplecnn", "nosuchnet"]),
    (["--dataset", "nosuchdata"], ["--dataset", "fashion_mnist", "nosuchdata"]),
    (["--optimizer", "foo"], ["--optimizer", "sgd", "foo"]),
    (["--flip_images", "maybe"], ["--flip_images", "true or false", "maybe"]),
    (["--lr_schedulers", "warm_up,bogus"], ["--lr_schedulers", "early_stopping", "bogus"]),
    (["--metrics", "bogus"], ["--metrics", "bogus"]),
    (["--early_stopping", "val_loss,<"], ["--early_stopping", "metric,op,value", "val_loss,<"]),
    (["--target_metric", "val_acc,>,high"], ["--target_metric", "number", "high"]),
    (["--nesterov", "--momentum", "0"], ["--nesterov", "momentum", "0"]),
    (["--no_such_option", "1"], ["unrecognized", "--no_such_option"]),
])
def test_bad_values_exit_2_with_one_line(args, words, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exc:
        code = main(["train", *args, "--num_epochs", "0", "--evaluate", "false",
                     "--dataset_path", str(tmp_path)])
        raise SystemExit(code)
    assert exc.value.code == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith("distnn train: error:")
    for word in words:
        assert word in line, (word, line)


def test_bad_value_through_the_real_command():
    proc = distnn("train", "--batch_size", "-3")
    assert proc.returncode == 2
    line = one_line(proc.stderr)
    assert "--batch_size" in line and "-3" in line and "Traceback" not in proc.stderr


def test_data_errors_exit_2_with_the_readers_message(tmp_path):
    # The reader's own message (it may span lines), no traceback, exit 2.
    proc = distnn("train", "--dataset", "mnist", "--dataset_path", tmp_path / "missing",
                  "--download", "false")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("distnn train: error: dataset")
    assert "missing" in proc.stderr and "Traceback" not in proc.stderr
    for name in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                 "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"):
        (tmp_path / name).write_bytes(b"garbage")
    proc = distnn("evaluate", "--dataset", "mnist", "--dataset_path", tmp_path,
                  "--weights", tmp_path / "w.npz")
    assert proc.returncode == 2
    assert proc.stderr.startswith("distnn evaluate: error: dataset")
    assert "idx3-ubyte" in proc.stderr and "Traceback" not in proc.stderr


def test_missing_weights_file(tmp_path):
    proc = distnn("evaluate", *DATA, "--weights_and_bias_filename", tmp_path / "none.npz")
    assert proc.returncode == 2
    assert "none.npz" in one_line(proc.stderr)
    proc = distnn("predict", *DATA, "--output", tmp_path / "p.npy")
    assert proc.returncode == 2
    assert "--weights_and_bias_filename" in one_line(proc.stderr)


# -- config files ----------------------------------------------------------------------------
def test_toml_config_and_command_line_override(tmp_path):
    cfg_file = tmp_path / "run.toml"
    cfg_file.write_text('model = "lenet"\nbatch-size = 32\n[optimizer]\noptimizer = "adam"\n'
                        'learning_rate = 0.001\nmetrics = ["accuracy", "top5"]\n'
                        '[schedule]\nlr_schedulers = "warm_up,early_stopping"\n')
    args = build_parser().parse_args(["train", "--config", str(cfg_file), "--batch_size", "8"])
    cfg = config_from_args(args)
    assert cfg.model.model == "lenet" and cfg.optim.optimizer == "adam"
    assert cfg.train.batch_size == 8  # command line wins
    assert cfg.optim.learning_rate == 0.001 and cfg.optim.metrics == ("accuracy", "top5")
    assert cfg.sched.lr_schedulers == ("warm_up", "early_stopping")
    assert cfg.data.dataset == "fashion_mnist"  # default


@pytest.mark.parametrize("text, match", [
    ("bogus_key = 1\n", "unknown option 'bogus_key'"),
    ("batch_size = 0\n", "batch_size: must be an integer >= 1, got 0"),
    ("batch_size = 3\nbatch-size = 4\n", "set twice"),
    ("[a.b]\nx = 1\n", "nested too deep"),
    ("model = \n", "not valid TOML"),
])
def test_bad_toml(tmp_path, text, match):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=match):
        load_toml(str(path))


def test_bad_toml_through_the_command(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("learning_rate = -2\n")
    proc = distnn("train", "--config", path)
    assert proc.returncode == 2
    line = one_line(proc.stderr)
    assert "learning_rate" in line and "-2" in line


def test_config_dataclasses_validate_in_post_init():
    with pytest.raises(ConfigError, match="--batch_size: must be an integer >= 1, got -1"):
        build_config("train", resolve_values({"batch_size": -1}))
    with pytest.raises(ConfigError, match="--validation_split"):
        DataConfig(validation_split=2.0)
    with pytest.raises(ConfigError, match="--nesterov needs --momentum > 0"):
        OptimizerConfig(nesterov=True, momentum=0.0)
    cfg = build_config("train", resolve_values({}))
    with pytest.raises(AttributeError):  # frozen dataclass
        cfg.train.batch_size = 3
    assert isinstance(cfg, RunConfig) and cfg.model.model == "simplecnn"
    with pytest.raises(ConfigError, match="needs a weights file"):
        build_config("evaluate", resolve_values({}))
    assert DataConfig(dataset="Fashion-MNIST").dataset == "fashion_mnist"


# -- short real runs on synthetic data -------------------------------------------------------
def _history(path):
    return json.loads(Path(path).read_text())


def _expected_stop(values, patience, smoothed, minimize=True):
    """Reference implementation of the NNLO rules, on a recorded sequence."""
    better = (lambda a, b: a < b) if minimize else (lambda a, b: a > b)
    best, wait = None, 0
    for i, v in enumerate(values):
        if best is None or better(v, best):
            best, wait = v, 0
        else:
            wait += 1
        if smoothed:
            if i + 1 >= 2 * patience:
                now = np.mean(values[i + 1 - patience:i + 1])
                then = np.mean(values[i + 1 - 2 * patience:i + 1 - patience])
                if not better(now, then):
                    return i + 1
        elif wait >= patience:
            return i + 1
    return None


@pytest.mark.parametrize("spec, lr, expected", [
    ("val_loss,<,2", "0", 3),      # constant metric: best at epoch 1, no improvement in 2, 3
    ("val_loss,~<,2", "0", 4),     # mean(e3, e4) is not below mean(e1, e2)
    ("val_acc,>,2", "0.02", None),  # a real run: check against the recorded sequence
])
def test_early_stopping_stops_at_the_right_epoch(tmp_path, spec, lr, expected):
    hist = tmp_path / "h.json"
    proc = distnn("train", *SYNTH, "--learning_rate", lr, "--num_epochs", "10",
                  "--early_stopping", spec, "--history_file", hist, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    h = _history(hist)
    metric, op, p = spec.split(",")
    key = "val_accuracy" if metric == "val_acc" else metric
    stop = _expected_stop(h[key], int(p), op.startswith("~"), minimize=op.endswith("<"))
    if expected is not None:
        assert stop == expected
    assert len(h["epoch"]) == (stop or 10)


def test_target_metric_stops_at_the_first_epoch_reaching_it(tmp_path):
    hist = tmp_path / "h.json"
    proc = distnn("train", *SYNTH, "--num_epochs", "12", "--target_metric", "val_acc,>,0.5",
                  "--history_file", hist, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    acc = _history(hist)["val_accuracy"]
    assert acc[-1] > 0.5 and all(a <= 0.5 for a in acc[:-1]), acc
    assert len(acc) < 12


def test_resume_through_the_command_is_exact(tmp_path):
    common = [*SYNTH, "--lr_schedulers", "warm_up,reduce_lr_on_plateau", "--warm_up_batches",
              "10", "--evaluate", "false"]
    assert distnn("train", *common, "--num_epochs", "2", "--save_weights", "a.npz",
                  cwd=tmp_path).returncode == 0
    assert distnn("train", *common, "--num_epochs", "1", "--checkpoint", "c.npz",
                  cwd=tmp_path).returncode == 0
    proc = distnn("train", *common, "--num_epochs", "2", "--checkpoint", "c.npz", "--resume",
                  "c.npz", "--save_weights", "b.npz", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    with np.load(tmp_path / "a.npz") as a, np.load(tmp_path / "b.npz") as b:
        assert sorted(a.files) == sorted(b.files)
        for key in a.files:
            np.testing.assert_array_equal(a[key], b[key])


def test_train_evaluate_predict_round_trip(tmp_path):
    proc = distnn("train", *SYNTH, "--num_epochs", "2", "--save_weights", "w.npz",
                  "--profile", "--trace", "t.json", "--cprofile", "p.prof",
                  "--quiet", "false", "--verbose", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "Total parameters" in out and "batch_size" in out  # summary and parameters
    assert "Profile of epoch 2" in proc.stdout + proc.stderr
    train_line = [l for l in out.splitlines() if l.startswith("Test:")][0]
    trace = json.loads((tmp_path / "t.json").read_text())
    assert any(e["name"] == "conv2d_0.forward" for e in trace["traceEvents"])
    assert (tmp_path / "p.prof").stat().st_size > 0

    proc = distnn("evaluate", *DATA, "--weights", "w.npz", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    eval_line = [l for l in proc.stdout.splitlines() if l.startswith("Test:")][0]
    assert eval_line.split("(")[0] == train_line.split("(")[0]

    for name in ("p.csv", "p.npz", "p.npy"):
        proc = distnn("predict", *DATA, "--weights", "w.npz", "--output", name, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
    rows = (tmp_path / "p.csv").read_text().splitlines()
    assert rows[0] == "index,predicted,label" and len(rows) == 151
    with np.load(tmp_path / "p.npz") as z:
        assert z["logits"].shape == (150, 10)
        np.testing.assert_array_equal(z["logits"], np.load(tmp_path / "p.npy"))
        acc = float(np.mean(z["predicted"] == z["labels"]))
    assert f"accuracy={acc:.4f}" in eval_line


def test_quiet_prints_only_results(tmp_path):
    proc = distnn("train", *SYNTH, "--num_epochs", "1", cwd=tmp_path)
    assert proc.returncode == 0
    assert proc.stdout.strip().startswith("Test:") and proc.stderr == ""


def test_info():
    proc = distnn("info")
    assert proc.returncode == 0, proc.stderr
    assert "ranks: 1" in proc.stdout


# -- under mpiexec ---------------------------------------------------------------------------


@pytest.mark.mpi
@needs_mpi
@pytest.mark.parametrize("ranks", [2, 3])
def test_data_parallel_run_matches_one_process(tmp_path, ranks):
    # 480 training samples in global batches of 50: uneven shards and a short last batch
    args = [*SYNTH, "--global_batch_size", "50", "--num_epochs", "2", "--history_file",
            "h{}.json", "--save_weights", "w{}.npz", "--evaluate", "false"]
    fmt = lambda n: [a.format(n) if "{}" in a else a for a in args]  # noqa: E731
    assert distnn("train", *fmt(1), cwd=tmp_path).returncode == 0
    proc = distnn("train", *fmt(ranks), "--parallel", "data", cwd=tmp_path,
                  launcher=(MPIEXEC, "-n", str(ranks)))
    assert proc.returncode == 0, proc.stderr
    with np.load(tmp_path / "w1.npz") as a, np.load(tmp_path / f"w{ranks}.npz") as b:
        for key in a.files:
            np.testing.assert_allclose(a[key], b[key], rtol=2e-4, atol=2e-5)
    h1, hn = _history(tmp_path / "h1.json"), _history(tmp_path / f"h{ranks}.json")
    assert hn["val_accuracy"] == pytest.approx(h1["val_accuracy"], abs=1 / 120 + 1e-9)
    assert hn["loss"] == pytest.approx(h1["loss"], rel=1e-3)


@pytest.mark.mpi
@needs_mpi
def test_data_error_under_mpi_exits_2_without_hanging(tmp_path):
    proc = distnn("train", "--dataset", "mnist", "--dataset_path", tmp_path / "missing",
                  "--download", "false", launcher=(MPIEXEC, "-n", "2"), timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "missing" in proc.stderr and "Traceback" not in proc.stderr


def test_convert_imagenet_then_train(tmp_path):
    pytest.importorskip("PIL")
    from distnn.data import encode_example, write_tfrecord
    from PIL import Image
    import io

    def jpeg(color):
        buf = io.BytesIO()
        Image.new("RGB", (20, 24), color).save(buf, format="JPEG")
        return buf.getvalue()

    files = []
    for k in range(2):
        path = tmp_path / f"train-{k:05d}-of-00002"
        write_tfrecord(path, [encode_example({"image/encoded": jpeg((40 * i, 0, 200)),
                                              "image/class/label": i + 1}) for i in range(3)])
        files.append(path)
    proc = distnn("convert-imagenet", *files, "--out_dir", tmp_path / "npz", "--image_size",
                  "16", "--shard_size", "4")
    assert proc.returncode == 0, proc.stderr
    assert "into 2 shard(s)" in proc.stdout
    proc = distnn("convert-imagenet", *files, "--out_dir", tmp_path / "npz")
    assert proc.returncode == 2 and "already holds" in one_line(proc.stderr)
    proc = distnn("train", "--dataset", "imagenet", "--dataset_path", tmp_path / "npz",
                  "--model", "simplecnn", "--num_epochs", "1", "--batch_size", "2",
                  "--validation_split", "0", "--evaluate", "false", "--quiet")
    assert proc.returncode == 0, proc.stderr


@pytest.mark.mpi
@needs_mpi
def test_sync_batchnorm_with_empty_shards_does_not_hang(tmp_path):
    # 101 samples in global batches of 50 on 3 ranks: the last batch has one sample, so
    # ranks 1 and 2 get empty shards and must still join the SyncBatchNorm all-reduces.
    args = ["--dataset", "synthetic", "--input_shape", "1,8,8", "--num_samples", "101",
            "--global_batch_size", "50", "--model", "resnet20", "--num_epochs", "1",
            "--validation_split", "0", "--evaluate", "false", "--quiet",
            "--history_file", "h{}.json"]
    fmt = lambda n: [a.format(n) if "{}" in a else a for a in args]  # noqa: E731
    assert distnn("train", *fmt(1), cwd=tmp_path).returncode == 0
    proc = distnn("train", *fmt(3), "--parallel", "data", "--sync_batchnorm", cwd=tmp_path,
                  launcher=(MPIEXEC, "-n", "3"), timeout=60)
    assert proc.returncode == 0, proc.stderr
    h1, h3 = _history(tmp_path / "h1.json"), _history(tmp_path / "h3.json")
    assert h3["loss"] == pytest.approx(h1["loss"], rel=1e-4)


def test_threads_option_sets_blas_and_compiled_kernel_threads_for_the_command_only():
    # The run builder applies --threads (tests/run/test_run_threads.py); the command puts back
    # what was there before once it ends (callers in the same process).
    from threadpoolctl import threadpool_info

    from distnn import kernels
    from distnn.cli.builders import threads
    from distnn.distributed import LocalComm
    from distnn.run import build_run

    def blas():
        return {p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"}

    kernels.set_num_threads(2)
    start, start_blas = kernels.get_num_threads(), blas()  # 2, or 1 on the NumPy backend
    cfg = build_config("train", resolve_values({"threads": 1, "dataset": "synthetic",
                                                "input_shape": (1, 8, 8),
                                                "num_samples": 64, "quiet": True}))
    with threads(cfg, LocalComm()):
        assert build_run(cfg, LocalComm()).threads == 1
        assert kernels.get_num_threads() == 1 and blas() == {1}
    assert kernels.get_num_threads() == start and blas() == start_blas  # restored
