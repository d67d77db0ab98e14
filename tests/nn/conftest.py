"""``kernel_backend``: run a module's tests on both kernel backends (NumPy and compiled);
modules opt in with ``pytestmark = pytest.mark.usefixtures("kernel_backend")``."""
import pytest

from distnn import kernels


@pytest.fixture(params=["numpy", "numba"], scope="module")
def kernel_backend(request):
    if request.param == "numba":
        pytest.importorskip("numba")
    previous = kernels.backend()
    kernels.set_backend(request.param)
    yield request.param
    kernels.set_backend(previous)
