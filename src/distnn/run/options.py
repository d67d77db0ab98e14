"""The option table of a distnn run, derived from the config dataclasses of ``run.config``
(their fields are the options: name, type, default, help, kind, section, commands), for
the ``distnn`` command's parser and ``--help`` and the keys of TOML files. Nothing is
declared here: add an option by adding a field to its section in ``run.config``. Only
distnn's own names and meanings are here; other systems' spellings are the command's
(``distnn.cli.compat``).
"""
from __future__ import annotations

from dataclasses import Field, dataclass, fields
from typing import Any

from .config import ALL, EVAL, PRED, SECTIONS, TRAIN
from .kinds import CompressionSpec, Kind, ModelSpec

__all__ = ["Option", "OPTIONS", "OPTION_BY_NAME", "GROUPS", "canonical", "TRAIN", "EVAL",
           "PRED", "ALL", "ModelSpec", "CompressionSpec"]


@dataclass(frozen=True)
class Option:
    """One option: ``--name`` (also ``--name-with-dashes`` and ``aliases``) and config key.
    distnn's own are made from the config fields (``of``); the command declares the other
    systems' options with no counterpart here (``cli.spellings.FOREIGN_OPTIONS``) alike."""

    name: str
    kind: Kind
    default: Any
    help: str
    group: str
    section: str
    commands: tuple[str, ...] = ALL
    aliases: tuple[str, ...] = ()
    short: tuple[str, ...] = ()  # single-dash flags (-r=)

    @classmethod
    def of(cls, f: Field, section: str) -> Option:
        """The option of config field ``f`` of ``section``."""
        m = f.metadata
        return cls(f.name, m["kind"], f.default, m["help"], section, section, m["commands"],
                   m["aliases"])

    def flags(self, aliases: tuple[str, ...] = ()) -> list[str]:
        """``--name``, ``--name-with-dashes``, the aliases (and ``aliases``) alike, ``-short``."""
        out = []
        for n in (self.name, *self.aliases, *aliases):
            for spelling in (n, n.replace("_", "-")):
                if f"--{spelling}" not in out:
                    out.append(f"--{spelling}")
        return out + [f"-{s}" for s in self.short]


# --help's title of each group of options: the sections'.
GROUPS = {name: cls.title for name, cls in SECTIONS.items()}
OPTIONS: list[Option] = [Option.of(f, name) for name, cls in SECTIONS.items()
                         for f in fields(cls)]
OPTION_BY_NAME = {o.name: o for o in OPTIONS}
_ALIAS = {a: o.name for o in OPTIONS for a in o.aliases}


def canonical(key: str) -> str:
    """Option name of a command-line or TOML key (dashes, aliases accepted)."""
    k = key.strip().lstrip("-").replace("-", "_")
    return _ALIAS.get(k, k)
