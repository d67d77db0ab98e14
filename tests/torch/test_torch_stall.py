"""``hvd.DistributedOptimizer(stall=inspector)``: the reducer tells the stall inspector
where this rank waits, so a late rank is named with the phase of the wait."""
from __future__ import annotations

import sys

import pytest
from torchjobs import PROGS, mpirun, needs_mpi


@needs_mpi
@pytest.mark.mpi
def test_a_late_rank_is_named_with_the_optimizer_phase():
    proc = mpirun(2, sys.executable, PROGS / "stall_torch_prog.py", timeout=90)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("[rank 0] stall: waited")]
    assert lines, proc.stderr
    # without stall= the reducer publishes nothing and the wait reads "start". (A busy host
    # can start rank 1 over a second late, a first warning at "start": any line may be it.)
    assert any("in step 0, optimizer step (collective); not arrived: rank 1" in ln
               for ln in lines), lines
