"""The command's options: the option table (``distnn.run.OPTIONS`` and the foreign ones of
``cli.compat``) as argparse arguments, and their values from the command line and
``--config FILE``, resolved (defaults < file < command line) and translated into distnn's.
"""
from __future__ import annotations

import argparse
from typing import Any, Callable, Sequence

from ..run import ConfigError
from ..run.kinds import Bool, Maybe
from ..run.options import GROUPS, OPTIONS, Option
from . import compat


def aliases_of(name: str) -> tuple[str, ...]:
    """The foreign names of distnn's option ``name`` (extra command-line flags)."""
    return tuple(a for a, n in compat.ALIASES.items() if n == name)


def options(command: str) -> list[Option]:
    """Every option ``command``'s parser takes: distnn's (widened) and the foreign ones."""
    return [compat.option_of(o.name) for o in [*OPTIONS, *compat.FOREIGN_OPTIONS]
            if command in o.commands]


def _argtype(option) -> Callable[[str], Any]:
    def convert(text: str):
        try:
            return option.kind.parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    convert.__name__ = option.name
    return convert


def at_least(kind: type, minimum: int) -> Callable[[str], Any]:
    """An argparse type: ``kind(text)`` (int or float) when it is >= minimum, else an
    error that says what the flag takes and what it got."""
    what = "an integer" if kind is int else "a number"

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not value >= minimum:
            raise argparse.ArgumentTypeError(f"must be {what} >= {minimum}, got {text!r}")
        return value
    return parse


def _default_text(value) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ",".join(map(str, value)) or "''"
    return str(value)


class _Store(argparse._StoreAction):
    """argparse's store that also records the flag as typed (``namespace._spelled``), so
    ``compat.translate`` knows whose spelling the command line uses."""

    def __call__(self, parser, namespace, values, option_string=None):
        super().__call__(parser, namespace, values, option_string)
        if option_string:
            spelled = getattr(namespace, "_spelled", set())
            spelled.add(option_string)
            namespace._spelled = spelled


def add_options(parser: argparse.ArgumentParser, command: str, door: bool = False) -> None:
    """``--config`` (and with ``door``, ``--like``) and the options of ``command`` (distnn's
    and the foreign ones), grouped."""
    parser.add_argument("--config", "-cfg", metavar="FILE", default=argparse.SUPPRESS,
                        help="TOML file of option values (keys are the option names below), "
                             "or a Theano-MPI session file (KEY=VALUE lines: RULE, MODELFILE, "
                             "MODELCLASS, DEVICES...); command-line options override it.")
    if door:
        parser.add_argument(
            "--like", choices=compat.DOORS, default=compat.DISTNN, metavar="SYSTEM",
            help="Whose meanings the command line has: pydtnn reads it as PyDTNN's "
                 "launcher (pydtnn_benchmark) does, its --learning_rate a rate per sample "
                 "(each step applies it / the global batch, PyDTNN's "
                 "effective_learning_rate). The other systems' spellings below mean the "
                 "same with or without --like. Choices: distnn, pydtnn. Default: distnn.")
    titles = {**GROUPS, **compat.GROUPS}
    groups = {}
    for option in options(command):
        if option.group not in groups:
            groups[option.group] = parser.add_argument_group(titles[option.group])
        extra: dict[str, Any] = {}
        if isinstance(option.kind, Bool) or (isinstance(option.kind, Maybe)
                                             and isinstance(option.kind.inner, Bool)):
            extra = {"nargs": "?", "const": True}
        choices = getattr(option.kind, "choices", None)
        choice_text = ""
        if choices is not None and option.name not in ("model",):
            choice_text = f" Choices: {', '.join(choices)}."
        groups[option.group].add_argument(
            *option.flags(aliases_of(option.name)), dest=option.name,
            type=_argtype(option), metavar=option.kind.metavar,
            help=f"{option.help}{compat.HELP.get(option.name, '')}{choice_text} Default: "
                 f"{_default_text(option.default)}.",
            action=_Store, **extra)


def load_config(path: str, notes: list[str] | None = None) -> dict[str, Any]:
    """Option values from ``--config FILE``: a Theano-MPI session file (``KEY=VALUE``
    lines with RULE, MODELFILE, MODELCLASS, DEVICES...; its notes are appended to
    ``notes``) or TOML (keys: option names, the other systems' too)."""
    from ..run import load_toml
    try:
        with open(path, "rb") as f:
            text = f.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        raise ConfigError(f"--config: file {path!r} does not exist") from None
    except OSError as exc:
        raise ConfigError(f"--config: cannot read {path!r}: {exc}") from None
    if not compat.is_session_file(text):
        return load_toml(path, compat.option_of)
    try:
        values, session_notes = compat.session_options(text, path)
    except ValueError as exc:
        raise ConfigError(f"--config: {path!r}: {exc}") from None
    if notes is not None:
        notes += session_notes
    return values


def resolve_values(given: dict[str, Any], file_values: dict[str, Any] | None = None,
                   notes: list[str] | None = None,
                   spelled: frozenset[str] = frozenset(),
                   command: str = "train", like: str = compat.DISTNN) -> dict[str, Any]:
    """Defaults < config file < command line, for every option; then ``compat.translate``
    turns the other systems' options and values into distnn's (its notes are appended to
    ``notes``). ``spelled``: the flags as typed (``--dataset_train_path``); ``like``: the
    door of the command line (``--like pydtnn``: PyDTNN's meanings)."""
    values = {o.name: o.default for o in [*OPTIONS, *compat.FOREIGN_OPTIONS]}
    explicit = set()
    for source in (file_values or {}, given):
        for key, value in source.items():
            values[compat.name_of(key)] = value
            explicit.add(compat.name_of(key))
    try:
        said = compat.translate(values, explicit, spelled, command, like)
    except ValueError as exc:
        error = ConfigError(str(exc))
        error.local = getattr(exc, "local", False)  # e.g. a module missing on this rank
        raise error from None
    if notes is not None:
        notes += said
    return values


def given_options(args: argparse.Namespace, command: str,
                  excluded: Sequence[str] = ()) -> dict[str, Any]:
    """The option values on the command line (distnn's names)."""
    return {o.name: getattr(args, o.name) for o in options(command)
            if o.name not in excluded and hasattr(args, o.name)}


def spelled_flags(args: argparse.Namespace) -> frozenset[str]:
    """The flags of the command line as the user typed them (``--optimizer_beta1``)."""
    return frozenset(getattr(args, "_spelled", ()))


def explicit_options(args: argparse.Namespace) -> frozenset[str]:
    """The option names the user gave, on the command line or in the --config file."""
    names = set(given_options(args, args.command))
    if getattr(args, "config", None):
        try:
            names |= {compat.name_of(k) for k in load_config(args.config)}
        except ConfigError:
            pass
    return frozenset(names)
