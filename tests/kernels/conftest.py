"""Every kernel test runs on both backends: the NumPy reference and the compiled one."""
import pytest


@pytest.fixture(autouse=True)
def _both_backends(kernel_backend):
    """``kernel_backend`` (tests/conftest.py) for every test here."""
    return kernel_backend
