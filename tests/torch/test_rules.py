"""Every training rule of ``--parallel`` applies to a torch module through the same rule
objects: on 3 real MPI ranks, a torch module and the same network in distnn layers end
with the same weights (float64) under each rule."""
from __future__ import annotations

import pickle
import sys

import numpy as np

from torchjobs import PROGS, mpirun, needs_mpi


@needs_mpi
def test_every_rule_trains_a_torch_module_like_a_distnn_model(tmp_path):
    from distnn.rules import RULES
    proc = mpirun(3, sys.executable, PROGS / "rules_prog.py", tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ranks = [pickle.load(open(tmp_path / f"rank{r}.pkl", "rb")) for r in range(3)]
    assert sorted(ranks[0]) == sorted(RULES)
    for name in RULES:
        finals = []
        for results in ranks:
            (torch_w, torch_acc), (distnn_w, distnn_acc) = results[name]
            np.testing.assert_allclose(torch_w, distnn_w, rtol=0, atol=1e-10, err_msg=name)
            assert torch_acc == distnn_acc > 0.6, name  # 3 classes: chance is 1/3
            finals.append(torch_w)
        if name == "data":
            assert all(np.array_equal(finals[0], w) for w in finals[1:])
