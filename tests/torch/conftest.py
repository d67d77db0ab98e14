"""The tests of distnn.torch need torch (the [torch] extra)."""
import pytest

pytest.importorskip("torch")
