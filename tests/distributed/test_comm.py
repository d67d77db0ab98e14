"""Communicators: collectives under real mpiexec, and the size-1 paths."""
import subprocess
import sys

import numpy as np
import pytest

from mpijobs import mpirun
from helpers import child_env, needs_mpi
from distnn.distributed import LocalComm


def test_collectives_under_mpiexec(main_results):
    n, results = main_results  # main_prog.py asserts every collective; this sees it ran
    assert [res["size"] for res in results] == [n] * n
    for res in results:
        assert set(res["collectives"]["fp16_rel_err"]) == {"native", "op"}


def test_local_comm_is_identity():
    comm = LocalComm()
    a = np.arange(4.0)
    for op in ("sum", "mean", "max", "min"):
        assert comm.allreduce_(a, op) is a and np.all(a == np.arange(4.0))
    assert comm.iallreduce_(a).wait() is a
    assert comm.bcast_(a) is a
    assert comm.allgather(a).shape == (1, 4)
    assert comm.allgather_obj(3) == [3] and comm.bcast_obj("x") == "x"
    assert comm.allreduce_obj(2.5, "mean") == 2.5
    assert comm.split(0, 0).size == 1
    comm.barrier()


def test_bad_arguments_are_named():
    comm = LocalComm()
    with pytest.raises(ValueError, match="op must be one of"):
        comm.allreduce_(np.zeros(2), "avg")
    with pytest.raises(ValueError, match="C-contiguous"):
        comm.allreduce_(np.zeros((4, 4))[:, 1])
    with pytest.raises(TypeError, match="NumPy array"):
        comm.allreduce_([1.0, 2.0])
    with pytest.raises(ValueError, match="root must be 0"):
        comm.bcast_(np.zeros(2), root=1)


@needs_mpi
def test_mpi_singleton_without_mpiexec(tmp_path):
    proc = mpirun(0, "main_prog.py", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "rank0.pkl").exists()


def test_without_mpi4py_everything_is_size_1():
    code = ("import sys; sys.modules['mpi4py'] = None\n"
            "import numpy as np, distnn.distributed as dist\n"
            "c = dist.init(); assert type(c).__name__ == 'LocalComm', c\n"
            "assert dist.size() == 1 and dist.rank() == 0 and dist.allreduce(2.0) == 2.0\n"
            "assert not dist.mpi_available()\n"
            "print(dist.describe())\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, env=child_env())
    assert proc.returncode == 0, proc.stderr
    assert "ranks: 1" in proc.stdout and "MPI library: none" in proc.stdout


def test_mean_of_integers_is_refused_before_communicating():
    with pytest.raises(TypeError, match="op='mean' needs a floating array"):
        LocalComm().allreduce_(np.arange(3), "mean")
