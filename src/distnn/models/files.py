"""Users' own models: ``--model path/to/file.py[:name]`` or ``--model package.module:name``.

The file (or module) is imported and a callable in it builds the model:

* ``file.py:name`` / ``module:name`` calls ``name`` (a function or a class);
  ``DIR/package.module:name`` imports ``package.module`` from the folder DIR (Theano-MPI's
  ``MODELFILE`` next to its session file);
* ``file.py`` alone calls ``build_model``, else ``get_model`` (NNLO's example files).

The callable gets, by keyword, those of ``input_shape``, ``num_classes``, ``dtype`` and
``seed`` that its signature names (so ``build_model()`` works, and so does
``build_model(input_shape, num_classes)``). It returns a distnn ``Sequential`` (built or
not: an unbuilt one is built for the dataset's input shape) or a ``torch.nn.Module``, which
the run builder wraps in ``distnn.torch.TorchModel`` (``distnn.run.build.model_from_spec``:
``models/`` does not import ``torch/``). Theano-MPI's ``MODELFILE``/``MODELCLASS`` pair
is ``--model MODELFILE:MODELCLASS``.

Every failure is a ``ModelFileError`` whose one-line message names the file and what was
expected. torch is imported only when the file itself imports it.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.machinery
import importlib.util
import inspect
import os
import sys
from typing import Any, Callable

import numpy as np

DEFAULT_NAMES = ("build_model", "get_model")
OFFERED = ("input_shape", "num_classes", "dtype", "seed")  # what distnn gives by name


class ModelFileError(ValueError):
    """A model file or module could not give a model; the message says why and what to do."""


def is_model_spec(name: str) -> bool:
    """True when ``--model`` names a file or module rather than a zoo model."""
    if name.lower().endswith(".onnx"):  # an ONNX graph: models/onnx_import.py
        return True
    target = name.rsplit(":", 1)[0] if ":" in name else name
    return (":" in name or target.endswith((".py", ".json")) or os.sep in target
            or (os.altsep is not None and os.altsep in target))


def split_spec(spec: str) -> tuple[str, str | None]:
    """("path/or.module", callable name or None)."""
    target, sep, name = spec.rpartition(":") if ":" in spec else (spec, "", "")
    if sep and not name:
        raise ModelFileError(f"--model {spec!r}: nothing after ':'; write FILE.py:NAME or "
                             "leave out ':' to call build_model()")
    return target, (name or None)


def _rooted_module(target: str) -> tuple[str, str] | None:
    """(folder, module) of ``DIR/package.module`` (a module imported from DIR), else None."""
    folder, leaf = os.path.split(target)
    if target.endswith(".py") or not folder or not leaf:
        return None
    if not all(part.isidentifier() for part in leaf.split(".")):
        return None
    return folder, leaf


def _import(spec: str, target: str):
    from .theano_shim import theano_names_if_installed
    with theano_names_if_installed():  # a Theano-MPI model file's `import theano`
        return _import_target(spec, target)


def _import_target(spec: str, target: str):
    rooted = _rooted_module(target)
    if rooted is not None:
        folder, module = rooted
        if not os.path.isdir(folder):
            raise ModelFileError(f"--model {spec!r}: folder {folder!r} does not exist; "
                                 "DIR/package.module imports package.module from DIR")
        return _import_module(spec, module, os.path.abspath(folder))
    is_file = target.endswith(".py") or os.path.sep in target
    if is_file:
        path = os.path.abspath(target)
        if not os.path.isfile(path):
            raise ModelFileError(f"--model {spec!r}: file {target!r} does not exist "
                                 f"(looked in {os.getcwd()}); give the path of a .py file")
        mod_name = "distnn_model_" + "".join(c if c.isalnum() else "_" for c in path)
        folder = os.path.dirname(path)
        added = folder not in sys.path
        if added:  # the file may import its neighbours
            sys.path.insert(0, folder)
        try:
            module_spec = importlib.util.spec_from_file_location(mod_name, path)
            module = importlib.util.module_from_spec(module_spec)
            sys.modules[mod_name] = module
            module_spec.loader.exec_module(module)
        except Exception as exc:
            sys.modules.pop(mod_name, None)
            raise _failed(f"--model {spec!r}: importing {target!r} failed: {_why(exc)}",
                          exc) from None
        finally:
            if added and folder in sys.path:
                sys.path.remove(folder)
        return module
    return _import_module(spec, target, os.getcwd())  # relative to the working folder


def _import_module(spec: str, target: str, root: str):
    """Import the module ``target`` (package.module) with ``root`` first on the path, so
    that it imports its own package's modules (``import models.data.dataname``)."""
    added = root not in sys.path
    if added:
        sys.path.insert(0, root)
    try:
        return importlib.import_module(target)
    except Exception as exc:
        raise _failed(f"--model {spec!r}: importing module {target!r} from {root!r} "
                      f"failed: {_why(exc)}; give a zoo name, "
                      "FILE.py[:NAME] or an importable MODULE:NAME", exc) from None
    finally:
        if added and root in sys.path:
            sys.path.remove(root)


def load_module(spec: str):
    """The module a ``--model`` file or module spec names, imported (``ModelFileError`` when
    it cannot be): for what a file defines besides its model (NNLO's ``get_train()``)."""
    target, _ = split_spec(spec)
    with _keras_scope(spec, target):
        return _import(spec, target)


def _find(spec: str, target: str, module, name: str | None) -> tuple[str, Callable]:
    if name is not None:
        if not hasattr(module, name):
            public = sorted(k for k, v in vars(module).items()
                            if callable(v) and not k.startswith("_")
                            and getattr(v, "__module__", None) == module.__name__)
            raise ModelFileError(f"--model {spec!r}: {target!r} defines no {name!r}; it "
                                 f"defines {public or 'no functions or classes'}")
        fn = getattr(module, name)
        if not callable(fn):
            raise ModelFileError(f"--model {spec!r}: {name!r} in {target!r} is a "
                                 f"{type(fn).__name__}, not a function or class")
        return name, fn
    for candidate in DEFAULT_NAMES:
        fn = getattr(module, candidate, None)
        if callable(fn):
            return candidate, fn
    raise ModelFileError(f"--model {spec!r}: {target!r} defines neither build_model() nor "
                         "get_model(); define build_model() returning a distnn Sequential or "
                         "a torch.nn.Module, or name the callable: --model FILE.py:NAME")


def _parameters(fn: Callable) -> dict[str, inspect.Parameter]:
    try:
        return dict(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return {}


def _takes(params: dict[str, inspect.Parameter], name: str) -> bool:
    """Whether a callable with ``params`` takes the keyword ``name`` (by name or **kw)."""
    named = name in params and params[name].kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                                     inspect.Parameter.KEYWORD_ONLY)
    return named or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def model_callable(spec: str) -> tuple[str, Callable]:
    """(name, callable) that builds the model of a file or module spec (imported)."""
    target, name = split_spec(spec)
    with _keras_scope(spec, target):
        return _find(spec, target, _import(spec, target), name)


def check_model_args(spec: str, names) -> None:
    """``ModelFileError`` unless the callable of ``spec`` takes every keyword in ``names``
    (by name, or through ``**kwargs`` as NNLO's ``get_model(**args)``)."""
    name, fn = model_callable(spec)
    params = _parameters(fn)
    reserved = sorted(set(names) & set(OFFERED))
    if reserved:
        raise ModelFileError(f"--model {spec!r}: {reserved} are given by distnn (from the "
                             "dataset and options); they cannot be model arguments")
    refused = [n for n in names if not _takes(params, n)]
    if refused:
        taken = [k for k, p in params.items() if p.kind is not inspect.Parameter.VAR_POSITIONAL]
        raise ModelFileError(f"--model {spec!r}: {name}() takes no argument {refused} (its "
                             f"parameters: {taken}); name one of them, or give it **kwargs")


def _call(spec: str, name: str, fn: Callable, offered: dict[str, Any],
          extra: dict[str, Any] | None = None):
    params = _parameters(fn)
    kwargs = {k: v for k, v in offered.items()
              if k in params and params[k].kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                                    inspect.Parameter.KEYWORD_ONLY)}
    if extra:
        check_model_args(spec, list(extra))
        kwargs.update(extra)
    missing = [k for k, p in params.items()
               if k not in kwargs and p.default is inspect.Parameter.empty
               and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD,
                              inspect.Parameter.KEYWORD_ONLY)]
    if missing:
        raise ModelFileError(f"--model {spec!r}: {name}() needs arguments {missing} that "
                             f"distnn cannot give; it passes only {sorted(offered)} (by name)")
    try:
        return fn(**kwargs)
    except Exception as exc:
        raise _failed(f"--model {spec!r}: {name}() failed: {_why(exc)}", exc) from None


def _failed(message: str, exc: BaseException) -> ModelFileError:
    """The error; ``local`` when a module is missing here (each rank reports its own)."""
    from .keras_files import missing_extra
    error = ModelFileError(message)
    error.local = bool(getattr(exc, "local", False) or missing_extra(exc))
    return error


def _why(exc: BaseException) -> str:
    """An exception in one line; a missing Keras-side module names the extra to install."""
    from .keras_files import missing_extra
    return missing_extra(exc) or f"{type(exc).__name__}: {exc}"


def _module_sources(target: str, root: str) -> list[str] | None:
    """The source files of module ``target`` (package.module) and of its packages, found
    as ``_import_module`` would find them but without importing anything; None when one
    is not a plain source file."""
    path, found = [root, *sys.path], []
    for part in target.split("."):
        spec = importlib.machinery.PathFinder.find_spec(part, path)
        if spec is None:
            return None
        if spec.origin is not None:  # None: a namespace package (a folder, no __init__)
            if not spec.origin.endswith(".py"):
                return None
            found.append(spec.origin)
        path = list(spec.submodule_search_locations or [])
    return found or None


@contextlib.contextmanager
def _keras_scope(spec: str, target: str, dtype=np.float32, seed: int = 0):
    """Keras's backend, float type, seed and NNLO's tensorflow.keras alias around a model
    file (``models.keras_files.keras_build``)."""
    from . import keras_files
    if target.endswith(".py"):
        sources = [os.path.abspath(target)]
    else:
        sources = _module_sources(target, os.getcwd())
    # the files' text says whether they need Keras; a module not found: Keras if installed
    needed = any(map(keras_files.mentions_keras, sources)) if sources else None
    try:
        with keras_files.keras_build(dtype, seed, needed=needed):
            yield
    except keras_files.KerasFileError as exc:
        raise _failed(f"--model {spec!r}: {exc}", exc) from None


def _is_torch_module(obj) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.nn.Module)


def load_model_spec(spec: str, *, input_shape, num_classes: int, dtype=np.float32,
                    seed: int = 0, model_args: dict[str, Any] | None = None):
    """Build the model ``spec`` names (see the module doc) for a dataset.

    Args:
        spec: ``FILE.py``, ``FILE.py:NAME`` or ``MODULE:NAME``.
        input_shape, num_classes: of the dataset (offered to the callable, and used to
            build an unbuilt Sequential or to check a torch module).
        dtype: float32 or float64.
        seed: offered to the callable; also seeds torch's generator before the call
            when the file imports torch, and a Sequential's initial weights.
        model_args: more keyword arguments for the callable (``--model_args``; the
            callable must take each, by name or through ``**kwargs``).

    Returns:
        a built distnn ``Sequential``, or the ``torch.nn.Module`` the file made (the run
        builder, ``distnn.run.build.model_from_spec``, wraps it in ``TorchModel``).
    """
    from ..nn import Sequential
    from .keras_files import KerasFileError, is_keras_model, load_json_model
    target, name = split_spec(spec)
    if target.lower().endswith(".onnx"):
        from . import onnx_import
        try:
            return onnx_import.load_onnx_model(target, input_shape=input_shape, dtype=dtype)
        except onnx_import.ModelFileError as exc:
            raise ModelFileError(str(exc)) from None
    if target.endswith(".json"):  # Keras's model.to_json()
        try:
            model = load_json_model(target, dtype=dtype, seed=seed)
        except KerasFileError as exc:
            raise _failed(str(exc), exc) from None
        model.distnn_label = os.path.splitext(os.path.basename(target))[0]
        return model
    offered = {"input_shape": tuple(input_shape), "num_classes": int(num_classes),
               "dtype": np.dtype(dtype), "seed": int(seed)}
    with _keras_scope(spec, target, dtype, seed):
        module = _import(spec, target)
        name, fn = _find(spec, target, module, name)
        torch = sys.modules.get("torch")
        if torch is not None:
            torch.manual_seed(seed)
        if isinstance(fn, type):  # NNLO's ModelBuilder(comm): each rank builds its replica
            offered = {**offered, "comm": None}
        model = _call(spec, name, fn, offered, model_args)
        if not (_is_torch_module(model) or is_keras_model(model)
                or isinstance(model, Sequential)):
            model = _builder_model(spec, name, model, offered)
    label = os.path.splitext(os.path.basename(target))[0] if target.endswith(".py") else target
    if isinstance(model, Sequential):
        if not model.built:
            model.build(tuple(input_shape), rng=seed, dtype=dtype)
        elif model.dtype != np.dtype(dtype):
            raise ModelFileError(f"--model {spec!r}: {name}() returned a {model.dtype} model "
                                 f"but --dtype is {np.dtype(dtype)}; build it with dtype= or "
                                 "return it unbuilt")
        if model.input_shape != tuple(input_shape):
            raise ModelFileError(f"--model {spec!r}: {name}() returned a model for inputs "
                                 f"{model.input_shape}, the dataset's samples are "
                                 f"{tuple(input_shape)}")
        return model
    if _is_torch_module(model):
        model.distnn_label = label  # the name TorchModel reports
        return model
    raise ModelFileError(f"--model {spec!r}: {name}() returned a {type(model).__name__}; "
                         "expected a distnn.nn.Sequential, a torch.nn.Module or a keras.Model")


def _builder_model(spec: str, name: str, builder, offered: dict[str, Any]):
    """The model of a ModelBuilder-like object (NNLO's ``ModelBuilder``): its
    ``build_model()``, given what distnn offers by name."""
    method = getattr(builder, "build_model", None)
    if not callable(method):
        return builder
    return _call(spec, f"{name}().build_model", method, offered)
