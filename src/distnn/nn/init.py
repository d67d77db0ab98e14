"""Weight initializers: pure functions of (shape, fan_in, fan_out, rng, dtype)."""
from __future__ import annotations

from typing import Callable

import numpy as np

Initializer = Callable[[tuple, int, int, np.random.Generator, np.dtype], np.ndarray]


def glorot_uniform(shape, fan_in, fan_out, rng, dtype):
    limit = np.sqrt(6.0 / (fan_in + fan_out))
    return rng.uniform(-limit, limit, size=shape).astype(dtype)


def glorot_normal(shape, fan_in, fan_out, rng, dtype):
    std = np.sqrt(2.0 / (fan_in + fan_out))
    return (rng.standard_normal(size=shape) * std).astype(dtype)


def he_uniform(shape, fan_in, fan_out, rng, dtype):
    limit = np.sqrt(6.0 / fan_in)
    return rng.uniform(-limit, limit, size=shape).astype(dtype)


def he_normal(shape, fan_in, fan_out, rng, dtype):
    std = np.sqrt(2.0 / fan_in)
    return (rng.standard_normal(size=shape) * std).astype(dtype)


def zeros(shape, fan_in, fan_out, rng, dtype):
    return np.zeros(shape, dtype=dtype)


def ones(shape, fan_in, fan_out, rng, dtype):
    return np.ones(shape, dtype=dtype)


INITIALIZERS: dict[str, Initializer] = {
    "glorot_uniform": glorot_uniform,
    "xavier_uniform": glorot_uniform,
    "glorot_normal": glorot_normal,
    "xavier_normal": glorot_normal,
    "he_uniform": he_uniform,
    "he_normal": he_normal,
    "zeros": zeros,
    "ones": ones,
}


def get_initializer(name_or_fn: str | Initializer) -> Initializer:
    """Resolve an initializer by name (see INITIALIZERS) or return a callable unchanged."""
    if callable(name_or_fn):
        return name_or_fn
    try:
        return INITIALIZERS[name_or_fn]
    except KeyError:
        raise ValueError(
            f"initializer={name_or_fn!r} is not known; choose one of {sorted(INITIALIZERS)}"
        ) from None
