"""Training rules: how the model replicas on the ranks cooperate.

``RULES`` maps the word of ``--parallel`` to the class; ``get_rule(name, **options)``
builds one. See ``base.Rule`` for the interface the ``Trainer`` calls.
"""
from __future__ import annotations

from typing import Any

from .base import Rule
from .data import DataParallel

RULES: dict[str, type[Rule]] = {
    DataParallel.name: DataParallel,
}

__all__ = ["Rule", "DataParallel", "RULES", "get_rule"]


def get_rule(name: str, **options: Any) -> Rule:
    """The rule called ``name`` (``--parallel``), built with ``options``."""
    key = str(name).lower()
    if key not in RULES:
        raise ValueError(f"unknown training rule {name!r}; choose one of {sorted(RULES)}")
    return RULES[key](**options)
