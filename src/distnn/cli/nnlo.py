"""What NNLO's ``TrainingDriver`` takes from a model file and how it names its outputs.

An NNLO model file may define, besides ``get_model()``, the data it trains on:
``get_train()`` and ``get_val()`` return lists of HDF5 files, ``get_features()`` and
``get_labels()`` the names of the datasets inside them, ``get_name()`` the model's name in
the output files. ``model_file_data`` turns them into distnn's options (``--train_list``,
``--val_list``, ``--features_name``, ``--labels_name``); an option given on the command
line or in the config file wins over the file's function, and a note says which were used
or why one was not (never silently). A file whose model expects channels-last images says
``data_layout = "nhwc"`` (``--data_layout auto`` then reads them so).

NNLO names its outputs ``MODEL_TRIAL_history.json`` and ``MODEL_TRIAL_timeline.json``
(``--trial-name``, default ``train``), MODEL being the model file's name (``get_name()``
where the file defines it, else the file's name without ``.py``) and, for its built-in
``--model mnist|mnist_torch|cifar10``, the file it loads (``model_mnist_tf`` ...);
``trial_files`` gives distnn's ``--history_file`` and ``--trace`` those names, the trace
gathered into one file as NNLO's ``Timeline.collect`` writes it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

# NNLO's --model words and the model files its driver loads for them.
BUILTIN_FILES = {"mnist": "model_mnist_tf", "mnist_torch": "model_mnist_torch",
                 "cifar10": "model_cifar10_tf"}
# model file function -> the distnn option it gives
DATA_FUNCTIONS = {"get_train": "train_list", "get_val": "val_list",
                  "get_features": "features_name", "get_labels": "labels_name"}


def _model_file(model: Any) -> str | None:
    """The .py file spec of ``--model``, or None for a zoo name or a module."""
    if not isinstance(model, str):
        return None
    target = model.rpartition(":")[0] if ":" in model else model
    return model if target.endswith(".py") else None


def _module(spec: str):
    from ..models.files import load_module
    return load_module(spec)


def _call(spec: str, module, name: str):
    try:
        return getattr(module, name)()
    except Exception as exc:
        raise ValueError(f"--model {spec!r}: {name}() failed: {type(exc).__name__}: "
                         f"{exc}") from None


def _checked(spec: str, name: str, value: Any) -> Any:
    if name in ("get_train", "get_val"):
        if isinstance(value, str) or not all(isinstance(f, str) and f for f in value or ()) \
                or not value:
            raise ValueError(f"--model {spec!r}: {name}() must return a non-empty list of "
                             f"HDF5 file paths, got {value!r}")
        return tuple(value)
    if not isinstance(value, str) or not value:
        raise ValueError(f"--model {spec!r}: {name}() must return the name of a dataset in "
                         f"the HDF5 files, got {value!r}")
    return value


def model_file_data(values: dict[str, Any], explicit: set[str]) -> list[str]:
    """Fill, in place, the data options an NNLO model file's functions give (see the
    module doc); return the notes. Raises ValueError naming the file and function."""
    from ..models.keras_files import select_backend
    model = values.get("model")
    notes = [note for note in [select_backend()] if note]  # before any file imports Keras
    if isinstance(model, str) and model.endswith(".json"):  # Keras's to_json()
        from ..models.keras_files import require_keras
        try:
            require_keras()  # here, before any data is read
        except ValueError as exc:
            exc.args = (f"--model {model!r}: {exc}",)
            raise
        return notes
    spec = _model_file(model)
    if spec is None or not Path(spec.rpartition(":")[0] if ":" in spec else spec).is_file():
        return notes  # a zoo name, or a file the model builder reports as missing
    module = _module(spec)
    refuse_keras_callbacks(spec, module)
    layout = getattr(module, "data_layout", None)
    if layout is not None and "data_layout" not in explicit:
        if layout not in ("nchw", "nhwc"):
            raise ValueError(f"--model {spec!r}: data_layout must be 'nchw' or 'nhwc', got "
                             f"{layout!r}")
        if values.get("data_layout") == "auto":
            values["data_layout"] = layout
    defined = [f for f in DATA_FUNCTIONS if callable(getattr(module, f, None))]
    used, unused = [], []
    other_data = "dataset" in explicit and values.get("dataset") != "hdf5"
    for func in defined:
        option = DATA_FUNCTIONS[func]
        if option in explicit:
            unused.append(f"{func}() (--{option} given)")
        elif other_data:
            unused.append(f"{func}() (--dataset {values['dataset']} given)")
        elif func == "get_val" and values.get("train_list") is None \
                and "get_train" not in defined:
            unused.append(f"{func}() (no training files: define get_train() or give "
                          "--train_data)")
        else:
            values[option] = _checked(spec, func, _call(spec, module, func))
            used.append(f"{func}()")
    if used:
        notes.append(f"--model {spec}: NNLO data functions used: {', '.join(used)} (the HDF5 "
                     "files and dataset names they give)")
    if unused:
        notes.append(f"--model {spec}: not used: {', '.join(unused)}")
    return notes


# Keras callbacks a model file lists, and distnn's option that does their work on every rank
KERAS_CALLBACKS = {
    "EarlyStopping": "--early_stopping 'val_loss,~<,4' (NNLO's syntax) or "
                     "--early_stopping_patience N",
    "ReduceLROnPlateau": "--reduce_lr_on_plateau_patience N (and _factor, _min_lr)",
    "LearningRateScheduler": "--lr_schedulers",
    "ModelCheckpoint": "--model_checkpoint_file FILE (or --checkpoint FILE, the full state)",
    "BackupAndRestore": "--checkpoint FILE and --resume FILE",
    "CSVLogger": "--history_file FILE.csv",
    "TensorBoard": "--tensorboard DIR",
    "TerminateOnNaN": "nothing: distnn stops on a NaN loss unless --ignore_nan",
    "ProgbarLogger": "nothing: rank 0 prints progress",
}


def refuse_keras_callbacks(spec: str, module) -> None:
    """A model file's Keras callbacks (``get_callbacks()`` or a ``callbacks`` list) are
    refused by name: distnn does not run Keras's ``fit()``, and a callback that stops
    training or changes the learning rate on one rank would split the ranks; each has an
    option that does its work on every rank alike."""
    found = getattr(module, "get_callbacks", None)
    if callable(found):
        found = _call(spec, module, "get_callbacks")
    elif found is None:
        found = getattr(module, "callbacks", None)
    if found is None or isinstance(found, (str, bytes)) or not hasattr(found, "__iter__"):
        return
    names = [type(cb).__name__ for cb in found
             if "keras" in type(cb).__module__ or any("keras" in c.__module__
                                                       for c in type(cb).__mro__)]
    if names:
        said = "; ".join(f"{n}: {KERAS_CALLBACKS.get(n, 'no counterpart, drop it')}"
                         for n in names)
        raise ValueError(f"--model {spec!r}: Keras callbacks are not run by distnn (it does "
                         f"not call Keras's fit()); use distnn's options instead: {said}")


def model_name(model: Any) -> str:
    """MODEL in NNLO's output names for ``--model`` (before it is translated)."""
    model = str(model)
    if model in BUILTIN_FILES:
        return BUILTIN_FILES[model]
    spec = _model_file(model)
    path = Path(model.split(":")[0])
    if spec is not None and path.is_file():
        module = _module(spec)
        if callable(getattr(module, "get_name", None)):
            name = _call(spec, module, "get_name")
            if not isinstance(name, str) or not name:
                raise ValueError(f"--model {spec!r}: get_name() must return a name, got "
                                 f"{name!r}")
            return name
    return path.stem


def trial_files(values: dict[str, Any], name: str) -> None:
    """``--trial-name`` and ``--timeline``: NNLO's output names (unless ``--history_file`` /
    ``--trace`` is given), the timeline gathered from every rank into one file."""
    trial = values.get("trial_name") or "train"
    if values.get("trial_name") and not values.get("history_file"):
        values["history_file"] = f"{name}_{trial}_history.json"
    if values.get("timeline"):
        if not values.get("trace"):
            values["trace"] = f"{name}_{trial}_timeline.json"
        values["trace_merged"] = True


def as_options(values: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    """A search candidate's parameters as option values: those that are not options of
    distnn train (NNLO's searched ``get_model(**args)`` parameters, which ``distnn search``
    accepts with ``--model FILE.py``) join ``model_args``."""
    from ..run.options import OPTION_BY_NAME
    model = {k: v for k, v in params.items() if k not in OPTION_BY_NAME}
    if not model:
        return dict(params)
    out = {k: v for k, v in params.items() if k not in model}
    given = dict(values.get("model_args") or ())
    out["model_args"] = tuple({**given, **model}.items())
    return out
