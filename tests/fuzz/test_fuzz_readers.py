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
from benchmarks.fuzz import Campaign, fuzz_settings, run_command, snapshot
from benchmarks.fuzz_targets import TARGET_BY_NAME, TARGETS

EXAMPLES = 8  # per reader: the whole tests/fuzz set stays within about a minute


@pytest.fixture(scope="module")
def campaign(tmp_path_factory):
    return Campaign(tmp_path_factory.mktemp("fuzz"))


@pytest.mark.parametrize("name", [t.name for t in TARGETS])
def test_broken_files_end_in_one_line_and_exit_2(campaign, name):
    target = TARGET_BY_NAME[name]
    seen: list[str] = []

    @fuzz_settings(EXAMPLES, derandomize=True)
    @given(st.data())
    def one(data):
        kind, found = campaign.file_input(target, data)
        seen.append(kind)
        assert found == []

    one()
    assert len(seen) == EXAMPLES


def test_the_valid_seeds_pass(campaign):
    # A reader that refused every file would pass the test above: the seeds must not fail.
    for target in TARGETS:
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
