"""Keras 3 models from users' files: the backend, NNLO's ``tensorflow.keras`` imports and
``--model FILE.json``.

distnn trains a Keras model on Keras's PyTorch backend, where a ``keras.Model`` is a
``torch.nn.Module`` (``distnn.torch.keras.KerasModel`` wraps it). Here:

* ``select_backend`` sets ``KERAS_BACKEND=torch`` before Keras is first imported (a
  backend chosen otherwise in the environment is overridden, with a note; a Keras already
  imported on another backend is an error, since the backend cannot change then);
* ``keras_build`` is the scope in which a model file is imported and its callable runs:
  Keras's float type is the run's ``--dtype`` and its seed ``--random_seed``; where
  TensorFlow is not installed, ``tensorflow.keras`` (NNLO's published model files import it)
  is an alias of ``keras`` for that scope only, and any other use of ``tensorflow`` fails
  naming what it used;
* ``load_json_model`` reads ``model.to_json()`` (Keras 3's format) with Keras's safe mode and
  only Keras's own classes: reading a JSON never runs code;
* ``missing_extra`` turns a missing ``keras``/``skopt``/``tensorflow`` into one line naming
  the extra to install.
"""
from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import sys
import types
from typing import Any

import numpy as np

EXTRA = "pip install 'distnn[keras]'"
# modules a model file may import that the keras extra provides (tensorflow: its alias)
EXTRA_MODULES = {"keras": "keras", "skopt": "scikit-optimize", "tensorflow": "keras"}
_SAFE_PACKAGES = ("keras",)


class KerasFileError(ValueError):
    """A Keras model file or JSON could not give a model (one line: why, what to do).
    ``local``: a module missing on this rank (each rank reports its own)."""

    local = False


def select_backend() -> str | None:
    """Make Keras use its torch backend; a note when the environment chose another one."""
    keras = sys.modules.get("keras")
    if keras is not None:
        backend = keras.backend.backend()
        if backend != "torch":
            raise KerasFileError(f"Keras was imported with its {backend!r} backend before "
                                 "distnn could select 'torch'; distnn trains Keras models on "
                                 "the torch backend: set KERAS_BACKEND=torch before importing "
                                 "keras")
        return None
    chosen = os.environ.get("KERAS_BACKEND")
    os.environ["KERAS_BACKEND"] = "torch"
    if chosen and chosen != "torch":
        return (f"KERAS_BACKEND={chosen} in the environment: distnn runs Keras models on its "
                "torch backend (KERAS_BACKEND=torch) in this run")
    return None


def missing_extra(exc: BaseException) -> str | None:
    """One line naming the extra to install when ``exc`` is a missing Keras-side module."""
    if not isinstance(exc, ModuleNotFoundError) or not exc.name:
        return None
    root = exc.name.split(".")[0]
    if root not in EXTRA_MODULES:
        return None
    return (f"{EXTRA_MODULES[root]} is not installed (No module named {exc.name!r}); Keras "
            f"models and NNLO's search ranges need distnn's keras extra: {EXTRA}")


def require_keras() -> None:
    """``KerasFileError`` (``local``) naming the extra when Keras cannot be imported here."""
    try:
        import keras  # noqa: F401
    except ModuleNotFoundError as exc:
        error = KerasFileError(missing_extra(exc) or str(exc))
        error.local = True
        raise error from None


def is_keras_model(obj: Any) -> bool:
    keras = sys.modules.get("keras")
    return keras is not None and isinstance(obj, keras.Model)


class _TensorflowAlias(types.ModuleType):
    """``tensorflow`` with only ``tensorflow.keras``: Keras 3 on the torch backend."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(f"tensorflow.{name}: TensorFlow is not installed; distnn "
                             "provides only tensorflow.keras (an alias of Keras 3 on the "
                             "torch backend) to model files")


_ALIASED = ("models", "layers", "backend", "optimizers", "losses", "metrics", "callbacks",
            "regularizers", "initializers", "activations", "utils")


@contextlib.contextmanager
def _tensorflow_alias():
    if "tensorflow" in sys.modules or importlib.util.find_spec("tensorflow") is not None:
        yield  # the real TensorFlow: the file uses it as it is
        return
    import keras
    fake = _TensorflowAlias("tensorflow", "alias of keras (distnn: no TensorFlow installed)")
    fake.keras = keras
    added = {"tensorflow": fake, "tensorflow.keras": keras}
    added.update({f"tensorflow.keras.{n}": getattr(keras, n) for n in _ALIASED})
    sys.modules.update(added)
    try:
        yield
    finally:
        for name, module in added.items():
            if sys.modules.get(name) is module:
                del sys.modules[name]


@contextlib.contextmanager
def keras_build(dtype=np.float32, seed: int = 0, *, needed: bool | None = None,
                alias: bool = True):
    """The scope a model file is imported and called in (see the module doc). ``needed``
    True: Keras must import; None: Keras's scope when Keras is installed; False (a model
    file that names neither keras nor tensorflow): only the backend is selected, and Keras
    is not imported. Without ``alias`` there is no ``tensorflow.keras`` (Keras's own code
    then sees no TensorFlow)."""
    select_backend()
    if needed is False or (needed is None and importlib.util.find_spec("keras") is None):
        yield
        return
    require_keras()
    import keras
    # Layers take their dtype from the global dtype policy, which Keras fixes from floatx
    # the first time it is read: both are set, and restored after.
    floatx, policy = keras.config.floatx(), keras.config.dtype_policy()
    keras.config.set_floatx(np.dtype(dtype).name)
    keras.config.set_dtype_policy(np.dtype(dtype).name)
    keras.utils.set_random_seed(int(seed))
    try:
        with _tensorflow_alias() if alias else contextlib.nullcontext():
            yield
    finally:
        keras.config.set_floatx(floatx)
        keras.config.set_dtype_policy(policy)


def _check_safe(node: Any, path: str) -> None:
    """Refuse what would run code or import non-Keras modules when deserialized."""
    if isinstance(node, dict):
        module = node.get("module")
        if isinstance(module, str) and module.split(".")[0] not in _SAFE_PACKAGES \
                and module != "builtins":
            raise KerasFileError(f"--model {path!r}: the JSON names module {module!r}; distnn "
                                 "reads only Keras's own classes from a JSON (custom layers: "
                                 "give the .py file that builds the model)")
        if node.get("class_name") == "Lambda" or node.get("class_name") == "__lambda__":
            raise KerasFileError(f"--model {path!r}: the JSON holds a Lambda layer, whose code "
                                 "distnn does not run from a JSON; give the .py file that "
                                 "builds the model")
        for value in node.values():
            _check_safe(value, path)
    elif isinstance(node, list):
        for value in node:
            _check_safe(value, path)


def _retype(node: Any, dtype: str) -> Any:
    """The JSON with its layers' float32 dtype policies set to ``dtype``."""
    if isinstance(node, dict):
        if node.get("class_name") == "DTypePolicy" and isinstance(node.get("config"), dict) \
                and node["config"].get("name") == "float32":
            return {**node, "config": {**node["config"], "name": dtype}}
        return {k: _retype(v, dtype) for k, v in node.items()}
    if isinstance(node, list):
        return [_retype(v, dtype) for v in node]
    return node


def load_json_model(path: str, *, dtype=np.float32, seed: int = 0):
    """The Keras model a ``model.to_json()`` file describes, built in ``dtype``."""
    try:
        with open(path) as f:
            config = json.load(f)
    except OSError as exc:
        raise KerasFileError(f"--model {path!r}: cannot read it: {exc.strerror}") from None
    except (ValueError, RecursionError) as exc:  # RecursionError: nested too deep
        raise KerasFileError(f"--model {path!r}: not a JSON file ({exc})") from None
    if not isinstance(config, dict) or "class_name" not in config:
        raise KerasFileError(f"--model {path!r}: not a Keras model JSON (no class_name); "
                             "write it with model.to_json()")
    version = str(config.get("keras_version", ""))
    if version[:1] in ("1", "2"):
        raise KerasFileError(f"--model {path!r}: written by Keras {version}, whose JSON Keras "
                             "3 cannot read; rebuild the model in Keras 3 and write "
                             "model.to_json() again, or give the .py file that builds it")
    _check_safe(config, path)
    with keras_build(dtype, seed, needed=True, alias=False):
        import keras
        from keras.src.saving import serialization_lib
        try:
            with serialization_lib.SafeModeScope(True):
                model = keras.models.model_from_json(json.dumps(
                    _retype(config, np.dtype(dtype).name)))
        except Exception as exc:
            hint = (" (a Keras 1/2 JSON? Keras 3 reads only its own format)"
                    if "module" not in json.dumps(config)[:2000] else "")
            raise KerasFileError(f"--model {path!r}: Keras cannot build it: "
                                 f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
                                 f"{hint}") from None
        if not isinstance(model, keras.Model):  # a JSON without its "config", say
            raise KerasFileError(f"--model {path!r}: describes a {type(model).__name__}, not "
                                 "a Keras model; write it with model.to_json()")
    return model


def mentions_keras(path: str | None) -> bool:
    """Whether the model file at ``path`` (or an already imported Keras) calls for
    ``keras_build``'s full scope: cheap, so that a torch or distnn model file does not pay
    for importing Keras."""
    if "keras" in sys.modules:
        return True
    if not path or not os.path.isfile(path):
        return False
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return False
    return "keras" in text or "tensorflow" in text
