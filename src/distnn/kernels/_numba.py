"""Compiled loops (numba, parallel over the outer axis, cached on disk)."""
import numba  # noqa: F401
