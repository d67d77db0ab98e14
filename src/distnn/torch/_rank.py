"""One rank of an ``hvd.run`` job (``launch.run``): ``python -m distnn.torch._rank JOB_DIR``
runs the pickled ``fn`` after ``hvd.init()`` and writes its result (or traceback)."""
from __future__ import annotations

import pickle
import sys
import traceback
from pathlib import Path

import distnn.torch as hvd
from distnn.torch.launch import _pickler


def _rank_main(job: Path) -> None:
    hvd.init()
    rank = hvd.rank()
    try:
        with open(job / "path.pkl", "rb") as f:
            sys.path[:] = pickle.load(f)
        with open(job / "fn.pkl", "rb") as f:
            fn, args, kwargs = pickle.load(f)
        result = (True, fn(*args, **kwargs))
    except BaseException:
        result = (False, traceback.format_exc())
    with open(job / f"rank{rank}.pkl", "wb") as f:
        _pickler().dump(result, f)


if __name__ == "__main__":
    _rank_main(Path(sys.argv[1]))
