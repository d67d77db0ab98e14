"""Model summary table and saving/loading weights by layer and parameter name."""
from __future__ import annotations

import os

import numpy as np

from ..fileio import atomic_open, read_npz


def summary(model) -> str:
    """A table like PyDTNN's: one row per layer with #params, output and weight shapes."""
    rows = [("Layer", "Type", "#Params", "Output shape", "Weights shape", "Parameters")]

    def visit(layer, depth):
        for child in layer.sublayers():
            is_chain = type(child).__name__ == "_Chain"
            if not is_chain:
                shapes = ", ".join(f"{k}{tuple(v.shape)}" for k, v in child.params.items())
                rows.append(("  " * depth + child.name, type(child).__name__,
                             f"{child.num_params:,}" if child.params else "0",
                             str(child.output_shape), shapes or "-", child.describe() or "-"))
            visit(child, depth if is_chain else depth + 1)

    visit(model, 0)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    line = "+" + "+".join("-" * (w + 2) for w in widths) + "+"

    def fmt(r):
        return "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"

    out = [line, fmt(rows[0]), line.replace("-", "=")] + [fmt(r) for r in rows[1:]] + [line]
    n = model.parameters_flat().size
    out.append(f"Total parameters: {n:,} ({n * model.dtype.itemsize / 2**20:.2f} MiB, "
               f"{model.dtype.name}); input shape {model.input_shape}, "
               f"output shape {model.output_shape}")
    return "\n".join(out)


def save_weights(model, path: str | os.PathLike) -> None:
    """Write parameters and buffers to ``path`` (.npz) atomically, keyed "<layer>/<name>"."""
    with atomic_open(path) as f:
        np.savez(f, **model.named_arrays())


def load_weights(model, path: str | os.PathLike) -> None:
    """Load weights saved by ``save_weights`` (or by PyDTNN, in its layout:
    ``nn.pydtnn_weights``) into a built model of the same architecture.

    Raises ValueError naming the first layer whose parameter is missing or differs in shape.
    """
    path = os.fspath(path)
    try:  # plain arrays only: an entry that holds a pickle is refused, never loaded
        data = read_npz(path, finite=("",))
    except FileNotFoundError:
        raise FileNotFoundError(f"weights file {path!r} does not exist") from None
    except ValueError as exc:
        raise ValueError(f"weights file {exc}") from None
    from .pydtnn_weights import is_pydtnn_layout, load_pydtnn_weights
    if is_pydtnn_layout(data):  # PyDTNN's own file (1_Conv2D_w, ...)
        load_pydtnn_weights(model, path, data)
        return
    arrays = model.named_arrays()
    extra = sorted(set(data) - set(arrays))
    for key, target in arrays.items():
        if key not in data:
            raise ValueError(
                f"weights file {path!r} has no entry for {key!r} (shape {target.shape}); "
                f"it was saved from a different architecture (file keys start with "
                f"{sorted(data)[:4]})")
        value = data[key]
        if value.dtype.kind not in "biuf":
            raise ValueError(f"weights file {path!r}: {key!r} holds {value.dtype}, not real "
                             "numbers; the file is corrupt or not a weights file")
        if value.shape != target.shape:
            raise ValueError(
                f"weights file {path!r}: {key!r} has shape {value.shape} but the model "
                f"expects {target.shape}; the architectures differ from layer "
                f"{key.split('/')[0]!r} on")
    if extra:
        raise ValueError(f"weights file {path!r} has entries the model lacks: {extra[:5]}; "
                         "it was saved from a different architecture")
    for key, target in arrays.items():
        target[...] = data[key]
