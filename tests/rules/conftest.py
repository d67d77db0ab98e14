"""The session's batch of rule jobs (rulejobs.BATCH): one launch per program and number
of ranks for every test of this folder that registered jobs (``rulejobs.Jobs``)."""
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def rule_batch(tmp_path_factory, request):
    """``rule_batch(key)``: the outcome of every job of ``key`` in the session's launch of
    it (the jobs of the collected test modules only)."""
    from helpers import needs_mpi
    from rulejobs import BATCH
    if needs_mpi.args[0]:
        pytest.skip(needs_mpi.kwargs["reason"])
    modules = {Path(item.path).stem for item in request.session.items}
    root = tmp_path_factory.mktemp("rule_batch")

    def outcome(key):
        prog, n = key
        return BATCH.run(key, root / f"{prog.stem}_np{n}", modules)
    return outcome
