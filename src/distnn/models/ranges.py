"""A model file's own search ranges: NNLO's ``get_model.parameter_range``.

NNLO's model files attach scikit-optimize dimensions to their model function::

    from skopt.space import Real, Integer, Categorical
    get_model.parameter_range = [Integer(10, 50, name='nb_filters'),
                                 Real(0.0, 1.0, name='dropout'),
                                 Categorical(['relu', 'tanh'], name='activation')]

and NNLO's ``OptimizationDriver`` searches over them. ``space_table`` turns them into a
``[space]`` table of ``distnn search`` (``distnn.search.space``): ``Integer`` is ``int``
(``log_int`` with ``prior='log-uniform'``), ``Real`` is ``uniform`` (``log_uniform``),
``Categorical`` is ``choice``. The names are arguments of the model function (they go to
it as ``--model_args``), or options of ``distnn train``. The dimensions are read by their
attributes (``low``, ``high``, ``prior``, ``categories``, ``name``), so only the model file
imports scikit-optimize.
"""
from __future__ import annotations

from typing import Any

from .files import ModelFileError, model_callable

ATTRIBUTE = "parameter_range"


def _plain(value: Any) -> Any:
    """A NumPy scalar as the Python value a TOML space would hold."""
    item = getattr(value, "item", None)
    return item() if callable(item) and getattr(value, "shape", None) == () else value


def _entry(spec: str, index: int, dim: Any) -> tuple[str, dict[str, list]]:
    kind = type(dim).__name__
    name = getattr(dim, "name", None)
    if not isinstance(name, str) or not name:
        raise ModelFileError(f"--model {spec!r}: {ATTRIBUTE}[{index}] ({kind}) has no name; "
                             "give each dimension name='ARGUMENT' (an argument of the model "
                             "function)")
    log = "log" in str(getattr(dim, "prior", "uniform"))
    if kind == "Integer":
        low, high = int(_plain(dim.low)), int(_plain(dim.high))
        return name, {"log_int" if log else "int": [low, high]}
    if kind == "Real":
        low, high = float(_plain(dim.low)), float(_plain(dim.high))
        return name, {"log_uniform" if log else "uniform": [low, high]}
    if kind == "Categorical":
        return name, {"choice": [_plain(c) for c in dim.categories]}
    raise ModelFileError(f"--model {spec!r}: {ATTRIBUTE}[{index}] is a {kind}; distnn "
                         "reads scikit-optimize's Integer, Real and Categorical")


def space_table(spec: str) -> dict[str, dict[str, list]] | None:
    """The ``[space]`` table of the model callable's ``parameter_range``, or None when the
    callable has none. Raises ``ModelFileError`` naming the file and the dimension."""
    _, fn = model_callable(spec)
    dims = getattr(fn, ATTRIBUTE, None)
    if dims is None:
        return None
    if isinstance(dims, (str, bytes)) or not hasattr(dims, "__iter__"):
        raise ModelFileError(f"--model {spec!r}: {ATTRIBUTE} must be a list of "
                             f"scikit-optimize dimensions, got {type(dims).__name__}")
    table: dict[str, dict[str, list]] = {}
    for index, dim in enumerate(dims):
        name, entry = _entry(spec, index, dim)
        if name in table:
            raise ModelFileError(f"--model {spec!r}: {ATTRIBUTE} names {name!r} twice")
        table[name] = entry
    if not table:
        raise ModelFileError(f"--model {spec!r}: {ATTRIBUTE} is empty")
    return table
