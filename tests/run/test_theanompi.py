"""Theano-MPI model classes (written against ``theano``, served by PyTensor) trained by
distnn's rules under real mpiexec: BSP equals one process on the global batch, EASGD and
GoSGD learn, from a session file and from Theano-MPI's Python form; the error lines."""
import json
import subprocess
import sys

import numpy as np
import pytest

from tests.helpers import COMMAND, MPIEXEC, ROOT, child_env, have_fashion_mnist, launcher, needs_mpi

pytest.importorskip("pytensor")
pytestmark = [needs_mpi, pytest.mark.mpi,
              pytest.mark.skipif(not have_fashion_mnist(), reason="needs Fashion-MNIST")]

CNN = ROOT / "examples" / "theanompi_fashion_cnn.py"
TIMEOUT = 1500  # PyTensor compiles the graphs in every rank (its cache makes reruns quick)

SCRIPT = """
import json, sys
from distnn.run.theanompi import train_model_class
rule, config, out = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
info = train_model_class({cnn!r}, "FashionCNN", rule, epochs=config.pop("epochs"),
                         rule_args=config.pop("rule_args", None), model_config=config)
from distnn import distributed as dist
if dist.get_comm().rank == 0:
    json.dump(info, open(out, "w"))
"""


# PyTensor's default (numba) compiles every op on first use; its Python linker starts at once
FLAGS = {"PYTENSOR_FLAGS": "mode=FAST_COMPILE"}


def _run(cmd, cwd, timeout=TIMEOUT):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          env=child_env(PYTHONPATH=str(ROOT / "src"), **FLAGS))


def train(tmp_path, ranks, rule, name, **config):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(cnn=str(CNN)))
    out = tmp_path / f"{name}.json"
    config.setdefault("weights_file", str(tmp_path / f"{name}.npz"))
    proc = _run([*launcher(ranks), sys.executable, str(script), rule, json.dumps(config),
                 str(out)], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text()), np.load(config["weights_file"]), proc


@pytest.mark.parametrize("ranks", [2, 3])
def test_bsp_on_n_ranks_is_one_process_on_the_global_batch(tmp_path, ranks):
    # float64, 3 steps of momentum SGD: the ranks' moves averaged every step are the
    # move of one process on the batch of all ranks
    common = dict(floatX="float64", n_train=ranks * 8 * 3, n_val=ranks * 8, epochs=1,
                  learning_rate=0.05, momentum=0.9)
    one, w_one, _ = train(tmp_path, 1, "BSP", "one", batch_size=8 * ranks, **common)
    many, w_many, _ = train(tmp_path, ranks, "BSP", "many", batch_size=8, **common)
    assert len(w_one.files) == 8
    moved = max(np.abs(w_one[k] - w_many[k]).max() for k in w_one.files)
    assert moved < 1e-11
    # the validation line: every rank's batches gathered, the same mean
    assert many["val_info"][0][1] == pytest.approx(one["val_info"][0][1], rel=1e-9)


def _first_and_last_val_cost(info):
    return info["val_info"][0][1], info["val_info"][-1][1]


def test_easgd_from_a_session_file_on_3_ranks_learns(tmp_path):
    # rank 0 is the server (Theano-MPI's first device), ranks 1 and 2 the workers
    (tmp_path / "session.cfg").write_text(
        "RULE=EASGD\n"
        f"MODELFILE={CNN}\nMODELCLASS=FashionCNN\nDEVICES=(cuda0 cuda1 cuda2)\n"
        "num_epochs=2\nsync_every=2\n"
        "model_args=n_train=1024,n_val=256,batch_size=16,lr_decay=1.0\n")
    proc = _run([*launcher(3), *COMMAND, "train", "--config", "session.cfg"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.count("note: DEVICES=cuda0 cuda1 cuda2: not applicable") == 1
    assert proc.stdout.count("devices run as CPU ranks") == 1
    costs = [float(line.split("cost:")[1].split()[0]) for line in proc.stdout.splitlines()
             if line.startswith("validation cost:")]
    assert len(costs) == 2
    assert costs[-1] < 1.2 < np.log(10)  # from chance (2.30) to well below it
    assert "global epoch 1 took" in proc.stdout


def test_gosgd_from_the_python_form_on_2_ranks_learns(tmp_path):
    script = tmp_path / "gosgd.py"
    script.write_text(
        "import json\n"
        "from distnn.run.theanompi import GOSGD\n"
        "rule = GOSGD(probability=0.5)\n"
        f"rule.init(devices=['cuda0', 'cuda1'], modelfile={str(CNN)!r}, "
        "modelclass='FashionCNN', epochs=2, model_config=dict(n_train=1024, n_val=256, "
        "batch_size=16, lr_decay=1.0))\n"
        "rule.wait()\n"
        "print('VAL', json.dumps(rule.info['val_info']))\n")
    proc = _run([*launcher(2), sys.executable, str(script)], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    val = json.loads(proc.stdout.split("VAL ")[1].splitlines()[0])
    assert [v[0] for v in val] == [64, 64]  # Theano-MPI's count: batches x workers
    assert val[-1][1] < 1.2
    assert val[-1][2] < 0.5  # the error rate


def test_the_python_form_started_alone_launches_the_devices(tmp_path):
    # rule.init in a plain process starts mpiexec -n len(devices), as Theano-MPI does
    script = tmp_path / "bsp.py"
    script.write_text(
        "from distnn.run.theanompi import BSP\n"
        "rule = BSP()\n"
        f"rule.init(devices=['cuda0', 'cuda1'], modelfile={str(CNN)!r}, "
        "modelclass='FashionCNN', epochs=1, model_config=dict(n_train=128, n_val=64, "
        "batch_size=16))\n"
        "raise SystemExit(rule.wait())\n")
    env = child_env(PYTHONPATH=str(ROOT / "src"), **FLAGS, PATH=f"{MPIEXEC.rsplit('/', 1)[0]}:"
                    + child_env()["PATH"])
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=TIMEOUT, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("validation cost:") == 1  # rank 0 of the 2 it started
    assert proc.stdout.count("devices run as CPU ranks") == 1


BAD_PARAMS = """
import numpy as np
import theano


class Bad:
    def __init__(self, config):
        self.params = [np.zeros(3)]
        self.data = type("D", (), {"n_batch_train": 2, "n_batch_val": 1})()
        self.n_epochs = 1

    def compile_iter_fns(self, **kw): pass
    def train_iter(self, count, recorder): pass
    def val_iter(self, count, recorder): pass
    def adjust_hyperp(self, epoch): pass


class Uneven(Bad):
    def __init__(self, config):
        super().__init__(config)
        self.params = [theano.shared(np.zeros(3))]
        self.data.n_batch_train = 2 + config["rank"]
"""


@pytest.mark.parametrize("cls, message", [
    ("Bad", "MODELCLASS=Bad: Bad.params[0] is ndarray, not a shared variable"),
    ("Uneven", "BSP: the ranks' Uneven.data.n_batch_train differ ([2, 3])")])
def test_bad_model_classes_are_one_line_on_2_ranks(tmp_path, cls, message):
    (tmp_path / "bad.py").write_text(BAD_PARAMS)
    (tmp_path / "session.cfg").write_text(f"RULE=BSP\nMODELFILE=bad.py\nMODELCLASS={cls}\n")
    proc = _run([*launcher(2), *COMMAND, "train", "--config", "session.cfg"], tmp_path,
                timeout=600)
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if message in line]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
