"""``distnn train --autotune`` on 2 ranks: the first steps try the bucket sizes, one line
names the size kept, and the run is the run without tuning, weight for weight (two ranks
sum exactly whatever the buckets; a compression's residuals carry over the rebuilds)."""
from __future__ import annotations

import re

import numpy as np
import pytest
from helpers import needs_mpi
from rulejobs import run_cli

RUN = ["train", "--model", "simplecnn", "--dataset", "synthetic", "--num_samples", "512",
       "--batch_size", "16", "--num_epochs", "1", "--steps_per_epoch", "14",
       "--validation_split", "0", "--seed", "3"]
LINE = re.compile(r"^autotune: bucket_size_mb (\S+) \(median step time of the slowest rank "
                  r"over 2 steps: (.*)\)$", re.M)


@needs_mpi
@pytest.mark.parametrize("compression", ["none", "topk:0.05", "fp16"])
def test_tuned_run_equals_the_untuned_run(tmp_path, compression):
    runs = {}
    for name, extra in (("tuned", ["--autotune", "--autotune_steps", "2"]), ("plain", [])):
        proc = run_cli(2, *RUN, "--gradient_compression", compression,
                       "--save_weights", f"{name}.npz", *extra, cwd=tmp_path)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        runs[name] = proc.stdout + proc.stderr
    found = LINE.findall(runs["tuned"])  # stdout, or stderr while a progress bar is drawn
    assert len(found) == 1, runs["tuned"]  # once, from rank 0
    chosen, tried = found[0]
    # simplecnn's 0.6 MB: one bucket per layer (0), 0.25 MiB, and 4 MiB (one bucket)
    sizes = re.findall(r"(\S+) \((\d+) buckets?\) ([\d.]+) ms", tried)
    assert [s for s, _, _ in sizes] == ["4", "0", "0.25"], tried
    assert len({n for _, n, _ in sizes}) == 3 and all(float(t) > 0 for _, _, t in sizes)
    # the fastest (the line prints 0.1 ms: two sizes may tie there, argmin took either)
    times = {s: float(t) for s, _, t in sizes}
    assert times[chosen] == min(times.values()), tried
    assert "autotune" not in runs["plain"]
    with np.load(tmp_path / "tuned.npz") as a, np.load(tmp_path / "plain.npz") as b:
        assert sorted(a.files) == sorted(b.files)
        for k in a.files:
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_one_process_has_nothing_to_tune(tmp_path):
    proc = run_cli(0, *RUN, "--autotune", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "autotune" not in proc.stdout
