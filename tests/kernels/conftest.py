"""Every kernel test runs on both backends: the NumPy reference and the compiled one."""
import pytest


@pytest.fixture(autouse=True)
def _both_backends(request, kernel_backend):
    """``kernel_backend`` (tests/conftest.py) for every test here; a module whose kernels
    are compiled only says why in ``COMPILED_ONLY`` and skips the NumPy backend."""
    why = getattr(request.module, "COMPILED_ONLY", None)
    if why and kernel_backend == "numpy":
        pytest.skip(why)
    return kernel_backend


@pytest.fixture(params=[1, 2], ids=["1t", "2t"])
def threads(request):
    """kernels.set_num_threads(request.param) for the test (1 and 2), restored after."""
    from distnn import kernels

    previous = kernels.get_num_threads()
    kernels.set_num_threads(request.param)
    yield request.param
    kernels.set_num_threads(previous)


@pytest.fixture
def limits(monkeypatch):
    """``limits(**changes)``: replace some of the planner's ``LIMITS`` for this test."""
    from dataclasses import replace

    from distnn.kernels import planner as plan

    def change(**changes):
        monkeypatch.setattr(plan, "LIMITS", replace(plan.LIMITS, **changes))
        return plan.LIMITS
    return change
