import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

import pytest  # noqa: E402

from distnn import kernels  # noqa: E402


@pytest.fixture(params=["numpy", "numba"], scope="module")
def kernel_backend(request):
    """Run a module's tests on both kernel backends (NumPy and compiled): tests/kernels uses
    it for every test; other modules opt in with
    ``pytestmark = pytest.mark.usefixtures("kernel_backend")``."""
    if request.param == "numba":
        pytest.importorskip("numba")
    previous = kernels.backend()
    kernels.set_backend(request.param)
    yield request.param
    kernels.set_backend(previous)
