"""Training rules: how the model replicas on the ranks cooperate.

``RULES`` maps a rule's name to its class (``ALIASES``: other spellings, e.g.
Theano-MPI's ``bsp`` and ``gosgd``); ``get_rule(name, **kwargs)`` builds one, and
``build_rule(name, arguments)`` builds one from typed arguments by name, taking those its
constructor has. See ``base.Rule`` for the interface the ``Trainer`` calls. Rules know
nothing of command-line options: ``distnn.run`` maps its options to these arguments.
``RULES`` is found, not listed: every module of this package is imported and each ``Rule``
subclass with a ``name`` is a rule, except those a run chooses by other options
(``chosen_by_name = False``): ``Pipeline`` (pipeline stages × data parallelism) is chosen
by its stage count (the run's option for it), over the ``data`` rule's exchange.
"""
from __future__ import annotations

import importlib
import inspect
import pkgutil
from typing import Any, Mapping

from .base import Rule, RuleArgumentError, RuleStateError
from .data import DataParallel
from .delayed import DelayedSGD
from .downpour import Downpour
from .easgd import EASGD
from .fedavg import FedAvg
from .gem import GEM
from .gossip import Gossip
from .localsgd import LocalSGD
from .partial import PartialUpdate
from .pipeline import Pipeline


def _discover() -> dict[str, type[Rule]]:
    """Every rule class with a ``name`` in this package's modules: a new rule is one new
    file here (its declarations: the hooks, ``step_messages`` for the cost model)."""
    for info in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{info.name}")
    found, todo = {}, [Rule]
    while todo:
        for cls in todo.pop().__subclasses__():
            todo.append(cls)
            if (cls.name and cls.chosen_by_name
                    and cls.__module__.startswith(f"{__name__}.")):
                if found.get(cls.name, cls) is not cls:
                    raise RuntimeError(f"two training rules are called {cls.name!r}: "
                                       f"{found[cls.name].__qualname__} and {cls.__qualname__}")
                found[cls.name] = cls
    return dict(sorted(found.items()))


RULES: dict[str, type[Rule]] = _discover()
ALIASES = {"bsp": "data", "gosgd": "gossip", "local_sgd": "localsgd",
           "partial_update": "partial", "delayed": "pipeline"}

# Every rule is importable from here by its class name, one added in a file of its own too
# (``from distnn.rules import DiLoCo``).
globals().update({cls.__name__: cls for cls in RULES.values()})

__all__ = ["Rule", "RuleArgumentError", "RuleStateError", "DataParallel", "LocalSGD",
           "Downpour", "EASGD", "Gossip", "GEM", "PartialUpdate", "Pipeline", "DelayedSGD",
           "FedAvg", "RULES", "ALIASES", "rule_name", "get_rule", "build_rule"]
__all__ += sorted({cls.__name__ for cls in RULES.values()} - set(__all__))


def rule_name(name: str) -> str:
    """The registry key of ``name`` (case, dashes and aliases accepted)."""
    key = str(name).lower().replace("-", "_")
    key = ALIASES.get(key, key)
    if key not in RULES:
        raise ValueError(f"unknown training rule {name!r}; choose one of {sorted(RULES)} "
                         f"(or an alias: {sorted(ALIASES)})")
    return key


def get_rule(name: str, **arguments: Any) -> Rule:
    """The rule called ``name``, built with ``arguments``."""
    return RULES[rule_name(name)](**arguments)


def build_rule(name: str, arguments: Mapping[str, Any]) -> Rule:
    """The rule called ``name``, each constructor argument taken from ``arguments`` by its
    name (others there are ignored: they belong to other rules); arguments not there keep
    their default."""
    cls = RULES[rule_name(name)]
    return cls(**{arg: arguments[arg] for arg in inspect.signature(cls).parameters
                  if arg in arguments})
