"""Keras's files in the fuzzing campaign (issue 44): ``--model FILE.json`` (Keras's
``model.to_json()``, data that must never run code) and Keras's ``.weights.h5`` given to
``--weights_and_bias_filename``. Only where the keras extra is installed
(``KERAS_TARGETS`` is empty otherwise).
"""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
from hypothesis import strategies as st

from . import fuzz_inputs as fi
from .fuzz_targets import QUIET, SYNTH, TRAIN, Target

MODEL_PY = """\
import keras


def build_model(input_shape, num_classes):
    return keras.Sequential([keras.Input(input_shape), keras.layers.Flatten(),
                             keras.layers.Dense(num_classes)])
"""


def trap_json(folder: Path) -> str:
    """A Keras model JSON whose Lambda layer, if Keras deserialized it unsafely, would
    create the marker file while the model is built (the layer's marshalled code runs)."""
    import keras
    marker = str(Path(folder) / fi.MARKER)
    code = f"lambda x: (open({marker!r}, 'w').close(), x)[1]"
    layer = keras.layers.Lambda(eval(code))  # noqa: S307 - builds the trap, on purpose
    config = keras.Sequential([keras.Input((1, 8, 8)), keras.layers.Flatten(), layer,
                               keras.layers.Dense(10)]).to_json()
    (Path(folder) / fi.MARKER).unlink(missing_ok=True)  # built once here: not the test's
    return config


def seed_model_py(folder: Path) -> list[str]:
    (folder / "km.py").write_text(MODEL_PY)
    return ["w.weights.h5"]


def seed_json(folder: Path) -> list[str]:
    import keras
    model = keras.Sequential([keras.Input((1, 8, 8)), keras.layers.Flatten(),
                              keras.layers.Dense(16), keras.layers.ReLU(),
                              keras.layers.Dense(10)])
    (folder / "m.json").write_text(model.to_json())
    return ["m.json"]


def _json_edit(kind: str, change) -> fi.Mutate:
    def mutate(path: Path) -> str:
        config = json.loads(path.read_text())
        path.write_text(json.dumps(change(config, path)))
        return kind
    return mutate


def _layer(config, index=1):
    return config["config"]["layers"][index]


def _set(key, value):
    def change(config, path):
        _layer(config, 2)["config"][key] = value
        return config
    return change


def _json_mutations(name: str) -> st.SearchStrategy:
    def lambda_trap(config, path):
        return json.loads(trap_json(path.parent))

    def module(config, path):
        _layer(config).update({"module": "os", "class_name": "system",
                               "config": {"command": f"touch {path.parent / fi.MARKER}"}})
        return config

    def nested(config, path):
        return {"class_name": "Sequential", "config": {"layers": [[]] * 3}}

    def deep(path: Path) -> str:
        path.write_text("[" * 200_000 + "]" * 200_000)
        return "deep nesting"
    return st.one_of(fi.byte_mutations(), st.sampled_from([
        _json_edit("pickle that runs code", lambda_trap),
        _json_edit("names code", module),
        _json_edit("wrong dtype", nested),
        _json_edit("huge values", _set("units", 10**12)),
        _json_edit("huge values", _set("units", -3)),
        _json_edit("wrong dtype", _set("units", "ten")),
        _json_edit("wrong dtype", _set("activation", "os.system")),
        _json_edit("extra key", _set("bogus", 1)),
        _json_edit("missing key", lambda c, p: {k: v for k, v in c.items() if k != "config"}),
        deep]))


def _h5_mutations(name: str) -> st.SearchStrategy:
    def edit(kind: str, change) -> fi.Mutate:
        def mutate(path: Path) -> str:
            import h5py
            with h5py.File(path, "r+") as h5:
                found: list[str] = []
                h5.visititems(lambda n, o: found.append(n) if isinstance(o, h5py.Dataset)
                              else None)
                if found:
                    change(h5, sorted(found)[-1])
            return kind
        return mutate

    def nan(h5, key):
        h5[key][...] = np.nan

    def shape(h5, key):
        del h5[key]
        h5[key] = np.zeros(7)

    def drop(h5, key):
        del h5[key]

    def text(h5, key):
        del h5[key]
        h5[key] = np.array([b"abc"])
    return st.one_of(fi.byte_mutations(), st.sampled_from([
        edit("NaN", nan), edit("wrong shape", shape), edit("missing key", drop),
        edit("wrong dtype", text)]))


KERAS_TARGETS = [] if importlib.util.find_spec("keras") is None else [
    Target("Keras weights .h5", seed_model_py,
           ["evaluate", *SYNTH, "--model", "km.py", *QUIET, "--weights", "w.weights.h5"],
           mutations=_h5_mutations, culprit=("--weights_and_bias_filename",),
           seed_argv=["train", *SYNTH, "--model", "km.py", *TRAIN, "--save_weights",
                      "w.weights.h5"]),
    Target("Keras model JSON", seed_json, ["train", *SYNTH, "--model", "m.json", *TRAIN],
           mutations=_json_mutations, culprit=("--model",)),
]
