"""Search spaces: which options a search varies and over what values.

A space is a TOML table whose keys are option names of ``distnn train`` and whose values
say how to draw them::

    [space]
    learning_rate = {log_uniform = [1e-4, 1e-1]}   # float, uniform in log scale
    momentum = {uniform = [0.5, 0.99]}              # float, uniform
    batch_size = {int = [16, 128]}                  # integer in [16, 128]
    warm_up_epochs = {log_int = [1, 16]}            # integer, uniform in log scale
    optimizer = {choice = ["sgd", "adam"]}          # one of the values
    model = ["simplecnn", "lenet"]                  # a bare array is a choice too

``SearchSpace.suggest`` draws one configuration from an optuna trial (define-by-run, so
any optuna sampler works); ``SearchSpace.grid`` lists the values a grid search walks.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping

__all__ = ["Param", "SearchSpace", "DEFAULT_SPACE", "KINDS"]

KINDS = ("uniform", "log_uniform", "int", "log_int", "choice")
_MAX_GRID_INTS = 1000

# Used when no [space] is given: the three settings that matter most for a first search.
DEFAULT_SPACE: dict[str, Any] = {
    "learning_rate": {"log_uniform": [1e-4, 1e-1]},
    "optimizer": {"choice": ["sgd", "adam"]},
    "batch_size": {"choice": [32, 64, 128]},
}

Check = Callable[[str, Any], Any]


def _number(value, integer: bool) -> bool:
    if isinstance(value, bool):
        return False
    return isinstance(value, int) if integer else isinstance(value, (int, float))


@dataclass(frozen=True)
class Param:
    """One searched option.

    Args:
        name: the option name (as ``distnn train`` spells it).
        kind: one of ``KINDS``.
        low, high: bounds (both included) of the range kinds.
        choices: the values of a ``choice``.
    """

    name: str
    kind: str
    low: float | int | None = None
    high: float | int | None = None
    choices: tuple = ()

    def suggest(self, trial) -> Any:
        """This parameter's value for an optuna trial (``trial.suggest_*``)."""
        if self.kind == "choice":
            return trial.suggest_categorical(self.name, list(self.choices))
        if self.kind in ("int", "log_int"):
            return trial.suggest_int(self.name, self.low, self.high, log=self.kind == "log_int")
        return trial.suggest_float(self.name, self.low, self.high,
                                   log=self.kind == "log_uniform")

    def grid_values(self) -> list:
        """The values a grid search tries (choices, or every integer of an int range)."""
        if self.kind == "choice":
            return list(self.choices)
        if self.kind in ("int", "log_int") and self.high - self.low < _MAX_GRID_INTS:
            return list(range(self.low, self.high + 1))
        raise ValueError(f"--sampler grid: parameter {self.name!r} is {self.describe()}, "
                         "which has no finite list of values; give it as {choice=[...]} "
                         f"(or an int range of fewer than {_MAX_GRID_INTS} values)")

    def spec(self) -> dict[str, Any]:
        """The TOML/JSON form, ``{kind: [low, high]}`` or ``{"choice": [...]}``."""
        if self.kind == "choice":
            return {"choice": list(self.choices)}
        return {self.kind: [self.low, self.high]}

    def describe(self) -> str:
        if self.kind == "choice":
            return "choice of " + ", ".join(map(str, self.choices))
        return f"{self.kind} [{self.low:g}, {self.high:g}]"


def _parse_param(name: str, entry: Any, where: str, check: Check | None) -> Param:
    what = f"{where}: {name}"
    if isinstance(entry, list):
        entry = {"choice": entry}
    if not isinstance(entry, Mapping) or len(entry) != 1:
        raise ValueError(f"{what} = {entry!r}: give one of {{log_uniform=[low, high]}}, "
                         "{uniform=[low, high]}, {int=[low, high]}, {log_int=[low, high]} or "
                         "{choice=[a, b, ...]}")
    (kind, values), = entry.items()
    if kind not in KINDS:
        raise ValueError(f"{what}: unknown kind {kind!r}; use one of {', '.join(KINDS)}")
    if not isinstance(values, (list, tuple)) or not values:
        raise ValueError(f"{what}: {kind} needs a non-empty array, got {values!r}")

    def checked(value):
        if check is None:
            return value
        try:
            return check(name, value)
        except ValueError as exc:
            raise ValueError(f"{what}: value {value!r} is not valid for --{name}: {exc}") \
                from None

    if kind == "choice":
        choices = tuple(checked(v) for v in values)
        if len(set(map(repr, choices))) != len(choices):
            raise ValueError(f"{what}: choice lists a value twice: {list(values)!r}")
        for v in choices:
            if v is not None and not isinstance(v, (bool, int, float, str)):
                raise ValueError(f"{what}: choices must be numbers, strings or booleans, "
                                 f"got {v!r}")
        return Param(name, kind, choices=choices)
    integer = kind in ("int", "log_int")
    if len(values) != 2 or not all(_number(v, integer) for v in values):
        raise ValueError(f"{what}: {kind} needs [low, high] with two "
                         f"{'integers' if integer else 'numbers'}, got {values!r}")
    low, high = values
    if not (math.isfinite(low) and math.isfinite(high)) or low >= high:
        raise ValueError(f"{what}: {kind} needs finite low < high, got [{low}, {high}]")
    if kind.startswith("log") and low <= 0:
        raise ValueError(f"{what}: {kind} needs low > 0 (a log scale), got [{low}, {high}]")
    low, high = checked(low), checked(high)
    if integer:
        return Param(name, kind, int(low), int(high))
    return Param(name, kind, float(low), float(high))


class SearchSpace:
    """The searched options (see the module docstring for the TOML form).

    Args:
        params: the ``Param`` objects, in the order they are drawn.

    Example:
        space = SearchSpace.from_dict({"learning_rate": {"log_uniform": [1e-4, 1e-1]}})
        params = space.suggest(study.ask())   # {"learning_rate": 0.0031...}
    """

    def __init__(self, params: list[Param] | tuple[Param, ...]):
        if not params:
            raise ValueError("the search space is empty; give at least one parameter")
        names = [p.name for p in params]
        if len(set(names)) != len(names):
            raise ValueError(f"the search space names a parameter twice: {names}")
        self.params = tuple(params)

    @classmethod
    def from_dict(cls, table: Mapping[str, Any], where: str = "[space]",
                  check: Check | None = None) -> "SearchSpace":
        """Parse a ``[space]`` table. ``check(name, value)`` validates (and normalizes) a
        value of option ``name``, raising ValueError for a bad one; ``where`` names the
        file in messages."""
        if not isinstance(table, Mapping):
            raise ValueError(f"{where} must be a table of parameters, got {table!r}")
        if not table:
            raise ValueError(f"{where}: the search space is empty; give at least one "
                             "parameter, e.g. learning_rate = {log_uniform = [1e-4, 1e-1]}")
        return cls([_parse_param(str(k), v, where, check) for k, v in table.items()])

    @property
    def names(self) -> list[str]:
        return [p.name for p in self.params]

    def suggest(self, trial) -> dict[str, Any]:
        """One configuration drawn through an optuna ``Trial``."""
        return {p.name: p.suggest(trial) for p in self.params}

    def grid(self) -> dict[str, list]:
        """{name: values} for ``optuna.samplers.GridSampler``."""
        return {p.name: p.grid_values() for p in self.params}

    def grid_size(self) -> int:
        return math.prod(len(v) for v in self.grid().values())

    def spec(self) -> dict[str, dict[str, Any]]:
        """The space as a JSON/TOML-able dict (what ``from_dict`` reads)."""
        return {p.name: p.spec() for p in self.params}

    def describe(self) -> str:
        return "; ".join(f"{p.name}: {p.describe()}" for p in self.params)

    def __repr__(self) -> str:
        return f"SearchSpace({self.describe()})"
