"""Every kernel test runs on both backends: the NumPy reference and the compiled one."""
import pytest

from distnn import kernels


@pytest.fixture(params=["numpy", "numba"], scope="module", autouse=True)
def kernel_backend(request):
    if request.param == "numba":
        pytest.importorskip("numba")
    previous = kernels.backend()
    kernels.set_backend(request.param)
    yield request.param
    kernels.set_backend(previous)
