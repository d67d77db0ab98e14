"""Every kernel test runs on both backends: the NumPy reference and the compiled one."""
import pytest


@pytest.fixture(autouse=True)
def _both_backends(kernel_backend):
    """``kernel_backend`` (tests/conftest.py) for every test here."""
    return kernel_backend


@pytest.fixture
def limits(monkeypatch):
    """``limits(**changes)``: replace some of the planner's ``LIMITS`` for this test."""
    from dataclasses import replace

    from distnn.kernels import plan

    def change(**changes):
        monkeypatch.setattr(plan, "LIMITS", replace(plan.LIMITS, **changes))
        return plan.LIMITS
    return change
