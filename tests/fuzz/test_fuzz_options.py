"""Every option of ``distnn train`` given odd values (issue 44): strings into numbers,
negatives, huge, NaN, empty, unicode, paths that cannot be written. Each must end in exit
status 0 or 2 with one line naming the option; never a traceback, a hang or a file
written. In-process and built without training (``benchmarks.fuzz``'s "build" mode); a
few through ``mpiexec -n 2``: one line, exit 2, on every rank alike, no output left.
"""
from __future__ import annotations

import subprocess

import numpy as np
import pytest
from helpers import COMMAND, MPIEXEC, child_env
from hypothesis import given
from hypothesis import strategies as st

from benchmarks import fuzz_inputs as fi
from benchmarks.fuzz import Campaign, fuzz_settings, problems, run_command, snapshot
from benchmarks.fuzz_targets import SYNTH, option_names

ODD = ["", "-1", "1e309", "nan", "ünï☃"]  # parsed and checked (random values: built too)


@pytest.fixture(scope="module")
def campaign(tmp_path_factory):
    return Campaign(tmp_path_factory.mktemp("fuzz-options"))


@pytest.mark.parametrize("value", ODD)
def test_every_option_refuses_an_odd_value_in_one_line(campaign, value):
    bad = []
    for name in option_names():
        folder = campaign.fresh()
        before = snapshot(folder)
        result = run_command(["train", *SYNTH, "--parallel", "sequential", f"--{name}",
                              value], folder, "config")
        flag = f"--{name}"
        found = problems(result, (flag, flag.replace("_", "-"), name), (), before,
                         snapshot(folder), folder)
        bad += [f"{flag} {value!r}: {p}" for p in found]
    assert bad == []


def test_random_option_values(campaign):
    @fuzz_settings(40, derandomize=True)
    @given(st.data())
    def one(data):
        _, found = campaign.option_input(data)
        assert found == []

    one()


def test_a_value_that_looks_like_a_flag_names_the_option(tmp_path):
    result = run_command(["train", *SYNTH, "--flip_images", "-1e5"], tmp_path)
    assert result.code == 2 and "--flip_images" in result.err, result.err


def test_an_existing_output_is_kept_without_overwrite(tmp_path):
    args = ["train", *SYNTH, "--parallel", "sequential", "--quiet", "--num_epochs", "1",
            "--steps_per_epoch", "1", "--evaluate", "false"]
    (tmp_path / "w.npz").write_bytes(b"precious")
    (tmp_path / "h.json").write_text("{}")
    for option, name in (("--save_weights", "w.npz"), ("--history_file", "h.json")):
        result = run_command([*args, option, name], tmp_path)
        assert result.code == 2 and option in result.err and "--overwrite" in result.err
    assert (tmp_path / "w.npz").read_bytes() == b"precious"
    result = run_command([*args, "--save_weights", "w.npz", "--overwrite"], tmp_path)
    assert result.code == 0, result.err
    assert (tmp_path / "w.npz").read_bytes() != b"precious"


# -- the same on every rank --------------------------------------------------------------------
def _two_ranks(folder, *args):
    return subprocess.run([MPIEXEC, "-n", "2", *COMMAND, *args], capture_output=True,
                          text=True, timeout=180, cwd=folder, env=child_env())


@pytest.mark.mpi
@pytest.mark.skipif(MPIEXEC is None, reason="needs mpiexec")
def test_bad_files_on_two_ranks_are_one_line_and_exit_2(tmp_path):
    train = [*SYNTH, "--batch_size", "4", "--num_epochs", "1", "--steps_per_epoch", "1",
             "--evaluate", "false", "--quiet", "--model", "simplemlp"]
    proc = _two_ranks(tmp_path, "train", *train, "--checkpoint", "ck.npz")
    assert proc.returncode == 0, proc.stderr
    # A checkpoint whose metadata has the right entries of the wrong type, and weights
    # holding a pickle that would run code.
    with np.load(tmp_path / "ck.npz") as z:
        arrays = {k: z[k] for k in z.files}
    arrays["__meta__"] = np.array(str(arrays["__meta__"]).replace('"history": [',
                                                                   '"history": [true, '))
    np.savez(tmp_path / "bad.npz", **arrays)
    np.savez(tmp_path / "trap.npz", **{"dense/w": fi.trap_array(tmp_path)})
    cases = [(["train", *train, "--num_epochs", "2", "--resume", "bad.npz"], "bad.npz"),
             (["evaluate", *SYNTH, "--quiet", "--model", "simplemlp", "--weights",
               "trap.npz"], "trap.npz")]
    for args, name in cases:
        before = snapshot(tmp_path)
        proc = _two_ranks(tmp_path, *args)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2, proc.stderr
        assert len(lines) == 1 and lines[0].startswith("distnn ") and name in lines[0], lines
        assert "Traceback" not in proc.stderr
        assert snapshot(tmp_path) == before
    assert not (tmp_path / fi.MARKER).exists()
