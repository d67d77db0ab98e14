"""Every reader fed broken files through the real ``distnn`` command, in-process (issue 44;
the longer campaign: ``python -m benchmarks.fuzz --budget N``).

Each input is a copy of valid seed files with one file mutated (byte flips, truncation,
wrong magic, huge declared dims, NaN/inf, wrong dtypes, missing or extra keys, zero length,
a folder instead of the file, a pickle that runs code...). It must end in exit status 0,
or 2 (3: diverged) with one line naming the file or its option; never a traceback, a hang,
a file written that the command does not name, or code run from the data.
Derandomized: the same inputs every run.
"""
from __future__ import annotations

import pickle

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from benchmarks import fuzz_inputs as fi
from benchmarks.fuzz import ALL_TARGETS, Campaign, fuzz_settings, run_command, snapshot
from benchmarks.fuzz_keras import KERAS_TARGETS, trap_json

TARGET_BY_NAME = {t.name: t for t in ALL_TARGETS}
KERAS = {t.name for t in KERAS_TARGETS}
EXAMPLES = 8  # per reader (Keras's: 3): the whole tests/fuzz set stays within a minute


@pytest.fixture(scope="module")
def campaign(tmp_path_factory):
    return Campaign(tmp_path_factory.mktemp("fuzz"))


@pytest.mark.parametrize("name", [t.name for t in ALL_TARGETS])
def test_broken_files_end_in_one_line_and_exit_2(campaign, name):
    target = TARGET_BY_NAME[name]
    seen: list[str] = []
    examples = 3 if name in KERAS else EXAMPLES

    @fuzz_settings(examples, derandomize=True)
    @given(st.data())
    def one(data):
        kind, found = campaign.file_input(target, data)
        seen.append(kind)
        assert found == []

    one()
    assert len(seen) == examples


def test_the_valid_seeds_pass(campaign):
    # A reader that refused every file would pass the test above: the seeds must not fail.
    for target in ALL_TARGETS:
        campaign.seed(target)  # raises when the unmutated files do not give exit status 0


# -- files that would run code if unpickled ---------------------------------------------------
def test_the_trap_runs_code_when_unpickled_carelessly(tmp_path):
    # The proof that the cases below can fail: plain pickle.loads runs the trap's code.
    pickle.loads(fi.trap_pickle(tmp_path))
    assert (tmp_path / fi.MARKER).exists()


def _plant_cifar(folder):
    (folder / "cifar-10-batches-py" / "data_batch_2").write_bytes(fi.trap_pickle(folder))
    return "data_batch_2"


def _plant_npz(key_of):
    def plant(folder):
        path = folder / key_of(folder)
        with np.load(path) as z:
            arrays = {k: z[k] for k in z.files}
        arrays[sorted(arrays)[-1]] = fi.trap_array(folder)
        np.savez(path, **arrays)
        return path.name
    return plant


TRAPS = {
    "CIFAR Python": _plant_cifar,
    "ImageNet NPZ": _plant_npz(lambda f: "train/train-00001.npz"),
    "checkpoint .npz": _plant_npz(lambda f: "ck.npz"),
    "weights (distnn)": _plant_npz(lambda f: "w.npz"),
    "weights (PyDTNN)": _plant_npz(lambda f: "w.npz"),
}


@pytest.mark.parametrize("name", sorted(TRAPS))
def test_a_pickle_in_a_data_file_is_refused_not_run(campaign, name):
    target = TARGET_BY_NAME[name]
    seed, _ = campaign.seed(target)
    folder = campaign.fresh()
    fi.copy_seed(seed, folder)
    planted = TRAPS[name](folder)
    before = snapshot(folder)
    result = run_command(target.argv, folder, target.mode)
    assert not (folder / fi.MARKER).exists(), "code ran from a data file"
    assert result.error is None, result.error
    assert result.code == 2, result.err
    line = result.err.strip()
    assert "\n" not in line and planted in line, line
    assert snapshot(folder) == before


def test_a_keras_json_with_code_is_refused_not_run(campaign, tmp_path):
    keras = pytest.importorskip("keras")
    from keras.src.saving import serialization_lib
    # The proof that the JSON would run code if Keras read it unsafely ...
    with serialization_lib.SafeModeScope(False):
        keras.models.model_from_json(trap_json(tmp_path))
    assert (tmp_path / fi.MARKER).exists()
    # ... and that distnn refuses it.
    folder = campaign.fresh()
    (folder / "m.json").write_text(trap_json(folder))
    target = TARGET_BY_NAME["Keras model JSON"]
    result = run_command(target.argv, folder, target.mode)
    assert not (folder / fi.MARKER).exists(), "code ran from a JSON file"
    assert result.error is None and result.code == 2, (result.error, result.err)
    assert "m.json" in result.err and "\n" not in result.err.strip()
