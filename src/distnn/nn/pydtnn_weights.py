"""Weights files in PyDTNN's layout: one ``.npz`` entry per array, keyed
``<layer id>_<layer type>_<array>`` (``1_Conv2D_w``, ``1_Conv2D_b``, ``5_FC_w``,
``3_BatchNormalization_gamma``, ``..._running_mean``), the ids counting every layer of
PyDTNN's model from its Input layer (0).

Loading matches the file's layers that hold arrays with the model's, in order and by type
(PyDTNN's ``Conv2D``/``FC``/``BatchNormalization`` are distnn's ``Conv2D``/``Dense``/
``BatchNormalization``); the ids themselves need not agree (PyDTNN counts layers that
distnn has not, such as its Input). Convolution weights in NCHW order ``(co, ci, kh, kw)``
are distnn's; NHWC ones ``(ci, kh, kw, co)`` (PyDTNN's ``--tensor_format nhwc``) are
transposed, and the rows of the first Dense layer after them reordered from (H, W, C) to
distnn's (C, H, W) flattening. Both spellings of the array names are read: ``w``/``b``
(PyDTNN 3.x) and ``weights``/``biases`` (later releases). Saving writes the ``w``/``b``
spelling in NCHW order, ids counted as PyDTNN counts them (Input 0, then every layer).
"""
from __future__ import annotations

import os
import re

import numpy as np

from ..fileio import atomic_open, read_npz

_KEY = re.compile(r"^(\d+)_([A-Za-z][A-Za-z0-9]*)_(w|b|weights|biases|gamma|beta|"
                  r"running_mean|running_var)$")
_NAME = {"w": "w", "weights": "w", "b": "b", "biases": "b", "gamma": "gamma",
         "beta": "beta", "running_mean": "running_mean", "running_var": "running_var"}
# distnn's layer class -> PyDTNN's layer type (as in its keys)
_TYPES = {"Conv2D": "Conv2D", "Dense": "FC", "BatchNormalization": "BatchNormalization"}


def is_pydtnn_layout(keys) -> bool:
    """Whether the entries of an .npz file are PyDTNN's (every key ``<id>_<Type>_<array>``)."""
    keys = list(keys)
    return bool(keys) and all(_KEY.match(k) for k in keys)


def _file_layers(data) -> list[tuple[str, str, dict[str, np.ndarray]]]:
    """(``<id>_<Type>``, Type, {distnn array name: array}) per layer of the file, in id order."""
    layers: dict[int, tuple[str, str, dict]] = {}
    for key in data:
        lid, kind, name = _KEY.match(key).groups()
        entry = layers.setdefault(int(lid), (f"{lid}_{kind}", kind, {}))
        if entry[1] != kind:
            raise ValueError(f"layer id {lid} appears with two types ({entry[1]}, {kind})")
        entry[2][_NAME[name]] = data[key]
    return [layers[i] for i in sorted(layers)]


def _model_layers(model) -> list:
    return [layer for layer in model.walk()
            if (layer.params or layer.buffers) and type(layer).__name__ in _TYPES]


def _hwc_to_chw_rows(w: np.ndarray, chw: tuple[int, int, int]) -> np.ndarray:
    c, h, width = chw
    return w.reshape(h, width, c, -1).transpose(2, 0, 1, 3).reshape(w.shape)


def load_pydtnn_weights(model, path: str | os.PathLike, data: dict | None = None) -> None:
    """Load a weights file in PyDTNN's layout into a built model of the same architecture
    (``data``: its arrays, when already read with ``fileio.read_npz``).

    Raises ValueError naming the file, the layer and what differs (number of layers,
    types, a missing or extra array, a shape), and what to do.
    """
    path = os.fspath(path)
    try:
        data = read_npz(path, finite=("",)) if data is None else data
        file_layers = _file_layers(data)
    except ValueError as exc:
        raise ValueError(f"weights file {path!r} (PyDTNN's layout): {exc}") from None
    mine = _model_layers(model)
    hint = "give the --model it was trained with (PyDTNN's model of the same name)"
    if len(file_layers) != len(mine):
        raise ValueError(
            f"weights file {path!r} (PyDTNN's layout) holds the arrays of {len(file_layers)} "
            f"layers ({', '.join(k for k, _, _ in file_layers[:6])}...) but model "
            f"{model.name!r} has {len(mine)} layers with weights "
            f"({', '.join(layer.name for layer in mine[:6])}...); {hint}")
    loaded: list[tuple[np.ndarray, np.ndarray]] = []
    walk = list(model.walk())
    nhwc = False
    for (fkey, kind, arrays), layer in zip(file_layers, mine):
        want = _TYPES[type(layer).__name__]
        if not kind.startswith(want):
            raise ValueError(f"weights file {path!r}: {fkey} is PyDTNN's {kind} but layer "
                             f"{layer.name!r} of {model.name!r} is a {type(layer).__name__} "
                             f"(PyDTNN's {want}); {hint}")
        targets = {**layer.params, **layer.buffers}
        missing = sorted(set(targets) - set(arrays))
        extra = sorted(set(arrays) - set(targets))
        if missing or extra:
            what = (f"lacks {', '.join(f'{fkey}_{m}' for m in missing)}" if missing else
                    f"has {', '.join(f'{fkey}_{e}' for e in extra)} that layer "
                    f"{layer.name!r} has not")
            raise ValueError(f"weights file {path!r}: {what} (layer {layer.name!r} holds "
                             f"{sorted(targets)}); {hint}")
        index = walk.index(layer)
        before = walk[index - 1] if index else None
        for name, target in targets.items():
            value = np.asarray(arrays[name])
            if kind == "Conv2D" and name == "w" and value.shape != target.shape \
                    and value.ndim == 4 and value.transpose(3, 0, 1, 2).shape == target.shape:
                value, nhwc = value.transpose(3, 0, 1, 2), True  # NHWC (ci, kh, kw, co)
            elif (name == "w" and want == "FC" and nhwc and before is not None
                  and type(before).__name__ == "Flatten" and len(before.input_shape) == 3
                  and value.shape == target.shape):
                value = _hwc_to_chw_rows(value, before.input_shape)
            elif value.shape != target.shape and value.size == target.size and value.ndim <= 2 \
                    and target.ndim == 1:
                value = value.reshape(target.shape)  # (1, C) statistics and biases
            if value.dtype.kind not in "biuf":
                raise ValueError(f"weights file {path!r}: {fkey}_{name} holds {value.dtype}, "
                                 f"not real numbers; {hint}")
            if value.shape != target.shape:
                raise ValueError(f"weights file {path!r}: {fkey}_{name} has shape "
                                 f"{value.shape} but layer {layer.name!r} of {model.name!r} "
                                 f"expects {target.shape}; {hint}")
            loaded.append((target, value))
    for target, value in loaded:
        target[...] = value


def pydtnn_arrays(model) -> dict[str, np.ndarray]:
    """The model's arrays keyed as PyDTNN keys them (``1_Conv2D_w``), in NCHW order."""
    out: dict[str, np.ndarray] = {}
    leaves = [layer for layer in model.walk() if not layer.sublayers()]
    for lid, layer in enumerate(leaves, start=1):
        kind = _TYPES.get(type(layer).__name__)
        arrays = {**layer.params, **layer.buffers}
        if not arrays:
            continue
        if kind is None:
            raise ValueError(f"layer {layer.name!r} ({type(layer).__name__}) has no "
                             "counterpart in PyDTNN's weights layout (only Conv2D, Dense and "
                             "BatchNormalization); save in distnn's layout instead")
        for name, value in arrays.items():
            out[f"{lid}_{kind}_{name}"] = np.array(value)
    return out


def save_pydtnn_weights(model, path: str | os.PathLike) -> None:
    """Write the model's weights in PyDTNN's layout to ``path`` (.npz) atomically."""
    arrays = pydtnn_arrays(model)
    with atomic_open(path) as f:
        np.savez(f, **arrays)
