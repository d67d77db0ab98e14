"""Training rules: how the model replicas on the ranks cooperate.

``RULES`` maps the word of ``--parallel`` to the class (``ALIASES``: other spellings, e.g.
Theano-MPI's ``bsp`` and ``gosgd``); ``get_rule(name, **kwargs)`` builds one, and
``build_rule(name, options)`` builds one from a run's option values, reading its
constructor's signature. See ``base.Rule`` for the interface the ``Trainer`` calls.
"""
from __future__ import annotations

import inspect
from typing import Any, Mapping

from .base import Rule
from .data import DataParallel
from .downpour import Downpour
from .easgd import EASGD
from .gem import GEM
from .gossip import Gossip
from .localsgd import LocalSGD
from .partial import PartialUpdate

RULES: dict[str, type[Rule]] = {
    cls.name: cls for cls in (DataParallel, LocalSGD, Downpour, EASGD, Gossip, GEM,
                              PartialUpdate)
}
ALIASES = {"bsp": "data", "gosgd": "gossip", "local_sgd": "localsgd",
           "partial_update": "partial"}

__all__ = ["Rule", "DataParallel", "LocalSGD", "Downpour", "EASGD", "Gossip", "GEM", "RULES",
           "ALIASES", "rule_name", "get_rule", "build_rule", "PartialUpdate"]


def rule_name(name: str) -> str:
    """The registry key of ``name`` (case, dashes and aliases accepted)."""
    key = str(name).lower().replace("-", "_")
    key = ALIASES.get(key, key)
    if key not in RULES:
        raise ValueError(f"unknown training rule {name!r}; choose one of {sorted(RULES)} "
                         f"(or an alias: {sorted(ALIASES)})")
    return key


def get_rule(name: str, **options: Any) -> Rule:
    """The rule called ``name`` (``--parallel``), built with ``options``."""
    return RULES[rule_name(name)](**options)


def build_rule(name: str, options: Mapping[str, Any]) -> Rule:
    """The rule called ``name`` with each constructor argument taken from ``options`` (a
    run's option values by name): the option the rule names for it in ``Rule.options``,
    else the option of the argument's own name; arguments with no option keep their
    default."""
    cls = RULES[rule_name(name)]
    kwargs = {}
    for arg in inspect.signature(cls).parameters:
        option = cls.options.get(arg, arg)
        if option in options:
            kwargs[arg] = options[option]
    return cls(**kwargs)
