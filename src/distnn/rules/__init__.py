"""Training rules: how the model replicas on the ranks cooperate.

``RULES`` maps a rule's name to its class (``ALIASES``: other spellings, e.g.
Theano-MPI's ``bsp`` and ``gosgd``); ``get_rule(name, **kwargs)`` builds one, and
``build_rule(name, arguments)`` builds one from typed arguments by name, taking those its
constructor has. See ``base.Rule`` for the interface the ``Trainer`` calls. Rules know
nothing of command-line options: ``distnn.run`` maps its options to these arguments.
``Pipeline`` (pipeline stages × data parallelism) is chosen by its stage count (the run's
option for it), over the ``data`` rule's exchange, not by a name of its own.
"""
from __future__ import annotations

import inspect
from typing import Any, Mapping

from .base import Rule, RuleArgumentError
from .data import DataParallel
from .downpour import Downpour
from .easgd import EASGD
from .gem import GEM
from .gossip import Gossip
from .localsgd import LocalSGD
from .partial import PartialUpdate
from .pipeline import Pipeline

RULES: dict[str, type[Rule]] = {
    cls.name: cls for cls in (DataParallel, LocalSGD, Downpour, EASGD, Gossip, GEM,
                              PartialUpdate)
}
ALIASES = {"bsp": "data", "gosgd": "gossip", "local_sgd": "localsgd",
           "partial_update": "partial"}

__all__ = ["Rule", "RuleArgumentError", "DataParallel", "LocalSGD", "Downpour", "EASGD",
           "Gossip", "GEM", "PartialUpdate", "Pipeline",
           "RULES", "ALIASES", "rule_name", "get_rule",
           "build_rule"]


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
