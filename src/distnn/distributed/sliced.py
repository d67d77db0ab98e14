"""Build a model with only this rank's slice of its parameters (ZeRO stage 3, issue 56).

A dense build allocates every parameter on every rank (the layers' initial values, then
the flat parameter and gradient buffers) before ``ShardedOptimizer.shard()`` keeps the
slice ``bounds[rank]``: the whole model bounds each rank's memory. ``build_sliced`` builds
the model layer by layer instead (``Sequential.build(each_layer=...)``): as each top-level
layer is built, ``root``'s initial values of each of its parameters are scattered
(``alltoallv_``, from ``root`` only) to the ranks whose slices they fall in, and the layer
keeps placeholders; no flat buffer is allocated. The weights are ``root``'s, exactly those
``broadcast_parameters`` makes every rank's in a dense run
(docs/design.md §Randomness and seeds), whatever the other ranks' generators draw; at most
one layer's values are alive on a rank at a time (the layout pass before the build too: it
builds a copy of the unbuilt model, one layer at a time).

The model then holds ``param_slice`` (a ``ParameterSlice``), which ``ShardedOptimizer``
(stage 3) takes as its parameter shard; ``unshard()`` gives the model whole buffers again.
"""
from __future__ import annotations

import copy
from typing import NamedTuple

import numpy as np

from .comm import Communicator, get_comm
from .sharded_units import overlap_counts, shard_bounds


class ParameterSlice(NamedTuple):
    """This rank's slice [lo, hi) of a model's flat parameter buffer of ``total`` elements,
    cut over ``size`` ranks as ``shard_bounds`` cuts it; ``values`` its elements."""
    lo: int
    hi: int
    total: int
    size: int
    values: np.ndarray


def _layout_size(model, input_shape, dtype) -> int:
    """Parameters of ``model`` once built for ``input_shape`` (a copy built layer by layer:
    one layer's values at a time; its draws come from a generator of its own)."""
    shapes = copy.deepcopy(model)
    shapes.build(input_shape, rng=0, dtype=dtype, each_layer=lambda layer: None)
    return int(sum(n for *_, n in shapes._layout))


def build_sliced(model, input_shape, *, rng=None, dtype=None, comm: Communicator | None = None,
                 root: int = 0):
    """Build the unbuilt ``Sequential`` ``model`` holding only this rank's slice of its
    parameters: ``root``'s initial values (see the module doc). Collective; every rank
    builds the same architecture. Returns the model (``model.param_slice`` set).

    Args:
        model: an unbuilt ``distnn.nn.Sequential``.
        input_shape: per-sample input shape.
        rng: generator or seed of the initial weights (``root``'s are the ones kept).
        dtype: float32 or float64 (default: the model's).
        comm: communicator (default: ``get_comm()``).
        root: the rank whose initial weights every slice takes.
    """
    from .sharded import check_shardable
    comm = comm if comm is not None else get_comm()
    if not hasattr(model, "layer_ranges") or getattr(model, "built", False):
        raise TypeError(f"build_sliced takes an unbuilt distnn Sequential, got "
                        f"{'a built ' if getattr(model, 'built', False) else ''}"
                        f"{type(model).__name__}; build it with build_sliced instead of "
                        "input_shape= or model.build")
    dtype = np.dtype(model.dtype if dtype is None else dtype)
    input_shape = tuple(input_shape)
    total = _layout_size(model, input_shape, dtype)
    check_shardable(total, comm.size, "build_sliced")
    bounds = shard_bounds(total, comm.size)
    lo, hi = bounds[comm.rank]
    values = np.empty(hi - lo, dtype=dtype)
    none, nothing = [0] * comm.size, np.empty(0, dtype=dtype)
    at = [0]

    def scatter(layer) -> None:
        for sub in layer.walk():
            for p in sub.params.values():
                a, b = at[0], at[0] + p.size
                counts = overlap_counts(a, b, bounds)
                start = min(max(a, lo), hi) - lo
                mine = values[start:start + counts[comm.rank]]
                recv = list(none)
                recv[root] = counts[comm.rank]
                if comm.rank == root:
                    comm.alltoallv_(np.ascontiguousarray(p, dtype=dtype).reshape(-1), counts,
                                    mine, recv)
                else:
                    comm.alltoallv_(nothing, none, mine, recv)
                at[0] = b

    model.build(input_shape, rng=rng, dtype=dtype, each_layer=scatter)
    model.param_slice = ParameterSlice(lo, hi, total, comm.size, values)
    from ..nn.allocator import release_freed_memory
    release_freed_memory()  # the layers' values, kept by distnn's heap thresholds
    return model
