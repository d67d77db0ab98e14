"""The option table of a distnn run, derived from the config dataclasses of ``run.config``
(their fields are the options: name, type, default, help, kind, section, commands), for
the ``distnn`` command's parser and ``--help`` and the keys of TOML files. Nothing is
declared here: add an option by adding a field to its section in ``run.config``. Only
distnn's own names and meanings are here; other systems' spellings are the command's
(``distnn.cli.compat``).
"""
from __future__ import annotations

from dataclasses import fields

from .config import ALL, EVAL, PRED, SECTIONS, TRAIN, Option, canonical
from .kinds import CompressionSpec, ModelSpec

__all__ = ["Option", "OPTIONS", "OPTION_BY_NAME", "GROUPS", "canonical", "TRAIN", "EVAL",
           "PRED", "ALL", "ModelSpec", "CompressionSpec"]


# --help's title of each group of options: the sections'.
GROUPS = {name: cls.title for name, cls in SECTIONS.items()}
OPTIONS: list[Option] = [Option.of(f, name) for name, cls in SECTIONS.items()
                         for f in fields(cls)]
OPTION_BY_NAME = {o.name: o for o in OPTIONS}
