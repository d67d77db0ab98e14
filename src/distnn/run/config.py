"""The configuration of a run: one frozen dataclass per section (declared in ``sections``
and ``execution``), each field one option of the ``distnn`` command, with its type,
default, help and kind written there, once; ``RunConfig`` holds the sections.

Everything else derives from these fields: the option table (``run.options.OPTIONS``),
the command's parser and ``--help``, the keys of TOML files, and the checks. A field's
kind (``run.kinds``) checks and normalizes its value in ``__post_init__``, so a value is
checked the same way whether it comes from the command line, a TOML file or Python::

    cfg = build_config("train", {"model": "lenet", "num_epochs": 2})
    ModelConfig(model="lenet").dtype        # 'float32'
"""
from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, fields
from typing import Any, Callable

from .execution import OutputConfig, ParallelConfig, PredictConfig
from .kinds import Kind
from .sections import (ALL, EVAL, PRED, TRAIN, ConfigError, DataConfig, ModelConfig,
                       OptimizerConfig, ScheduleConfig, Section, TrainConfig, option)

__all__ = [
    "ConfigError", "TRAIN", "EVAL", "PRED", "ALL", "option", "Section", "ModelConfig",
    "DataConfig", "TrainConfig", "OptimizerConfig", "ScheduleConfig", "ParallelConfig",
    "OutputConfig", "PredictConfig", "RunConfig", "SECTIONS", "load_toml", "option_values",
    "build_config", "rule_error", "Option", "canonical",
]

SECTIONS: dict[str, type[Section]] = {
    "model": ModelConfig, "data": DataConfig, "train": TrainConfig, "optim": OptimizerConfig,
    "sched": ScheduleConfig, "parallel": ParallelConfig, "output": OutputConfig,
    "predict": PredictConfig}


def _option_fields(command: str | None = None):
    """(section name, field) of every option, in the sections' order (that of --help)."""
    for name, cls in SECTIONS.items():
        for f in fields(cls):
            if command is None or command in cls.commands_of(f):
                yield name, f


@dataclass(frozen=True)
class RunConfig:
    """Everything one ``distnn`` command needs, by section."""

    command: str
    model: ModelConfig
    data: DataConfig
    train: TrainConfig
    optim: OptimizerConfig
    sched: ScheduleConfig
    parallel: ParallelConfig
    output: OutputConfig
    predict: PredictConfig
    notes: tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self):
        needs_weights = self.command in (EVAL, PRED) or self.train.evaluate_only
        if needs_weights and not self.model.weights_and_bias_filename:
            what = "--evaluate_only" if self.command == TRAIN else f"distnn {self.command}"
            raise ConfigError(f"--weights_and_bias_filename: {what} needs a weights file, "
                              "got none")
        if self.command == PRED and not self.predict.output:
            raise ConfigError("--output: distnn predict needs an output file (.npy, .npz or "
                              ".csv), got none")
        if self.train.resume and self.model.weights_and_bias_filename:
            raise ConfigError("--resume restores the weights itself; drop "
                              "--weights_and_bias_filename")

    def summary(self, **extra: Any) -> dict[str, Any]:
        """The options that describe this run (the main ones and those not at their
        default; not where its outputs go), JSON-able, then ``extra`` (e.g. ranks): what a
        history file and TensorBoard record, and what ``distnn plot`` labels runs with."""
        out: dict[str, Any] = {}
        for section, f in _option_fields(self.command):
            if section in ("output", "predict") or f.name in NOT_DESCRIBING:
                continue
            value = getattr(getattr(self, section), f.name)
            if value == f.default and f.name not in DESCRIBING:
                continue
            out[f.name] = list(value) if isinstance(value, tuple) else value
        out.update(extra)
        return out

    def items(self) -> list[tuple[str, list[tuple[str, Any]]]]:
        """(section title, [(option, value)]) for the options of this command, for printing."""
        out: dict[str, list] = {}
        for section, f in _option_fields(self.command):
            out.setdefault(SECTIONS[section].title, []).append(
                (f.name, getattr(getattr(self, section), f.name)))
        return list(out.items())


# Options in every run's summary, and options that say where outputs go, not what ran.
DESCRIBING = ("model", "dataset", "parallel", "num_epochs", "batch_size", "optimizer",
              "learning_rate")
NOT_DESCRIBING = ("dataset_path", "dataset_test_path", "history_file", "save_weights",
                  "every_rank_writes", "checkpoint", "checkpoint_freq", "resume", "overwrite",
                  "weights_and_bias_filename", "model_checkpoint_file", "download", "prefetch")


def rule_error(parallel: ParallelConfig, exc: ValueError) -> ConfigError:
    """A training rule's refusal (``exc``) as the command says it: naming the option of the
    constructor argument it names (``exc.argument``), or its ``--rule_args`` pair, else
    ``--parallel``."""
    argument = getattr(exc, "argument", None)
    option = ParallelConfig.option_of(argument)
    if option is not None:
        return ConfigError(f"--{option} {getattr(parallel, option)}: {exc}")
    given = dict(parallel.rule_args)
    if argument in given:
        return ConfigError(f"--rule_args {argument}={given[argument]}: {exc}")
    return ConfigError(f"--parallel {parallel.parallel}: {exc}")


@dataclass(frozen=True)
class Option:
    """One option: ``--name`` (also ``--name-with-dashes`` and ``aliases``) and config key.
    distnn's own are made from the fields above (``of``; their table is
    ``run.options.OPTIONS``); the command declares the other systems' options with no
    counterpart here alike (``cli.spellings.FOREIGN_OPTIONS``)."""

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
    def of(cls, f, section: str) -> Option:
        """The option of config field ``f`` of ``section``."""
        m = f.metadata
        return cls(f.name, m["kind"], f.default, m["help"], section, section,
                   SECTIONS[section].commands_of(f), m["aliases"])

    def flags(self, aliases: tuple[str, ...] = ()) -> list[str]:
        """``--name``, ``--name-with-dashes``, the aliases (and ``aliases``) alike, ``-short``."""
        out = []
        for n in (self.name, *self.aliases, *aliases):
            for spelling in (n, n.replace("_", "-")):
                if f"--{spelling}" not in out:
                    out.append(f"--{spelling}")
        return out + [f"-{s}" for s in self.short]


_ALIAS = {a: f.name for _, f in _option_fields() for a in f.metadata["aliases"]}


def canonical(key: str) -> str:
    """Option name of a command-line or TOML key (dashes, aliases accepted)."""
    k = key.strip().lstrip("-").replace("-", "_")
    return _ALIAS.get(k, k)


def _option(key: str) -> Option | None:
    name = canonical(key)
    for section, f in _option_fields():
        if f.name == name:
            return Option.of(f, section)
    return None


def read_toml(path: str, what: str) -> dict:
    """The TOML file at path as a dict; a ConfigError naming ``what`` (the option that gave
    the file) where it is missing, unreadable or not TOML."""
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"{what}: file {path!r} does not exist") from None
    except OSError as exc:
        raise ConfigError(f"{what}: cannot read {path!r}: {exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{what}: {path!r} is not valid TOML: {exc}") from None


def load_toml(path: str, lookup: Callable[[str], Option | None] = _option, keep=(),
              keys: str = "the command-line option names (see distnn train --help)",
              what: str = "--config") -> dict[str, Any]:
    """Option values from a TOML file: top-level keys, or keys inside one level of tables
    (e.g. ``[optimizer]``; the table names are only for grouping). ``lookup`` gives the
    option of a key (default: distnn's names, dashes or underscores, aliases). Values are
    checked like command-line values. The tables named in ``keep`` (``[space]``) are
    returned as they are, under their name."""
    raw = read_toml(path, what)
    flat: dict[str, Any] = {name: raw.pop(name) for name in keep if name in raw}
    for key, value in raw.items():
        items = value.items() if isinstance(value, dict) else [(key, value)]
        for k, v in items:
            if isinstance(v, dict):
                raise ConfigError(f"{what}: {path!r}: table [{key}.{k}] is nested too deep; "
                                  "use top-level keys or one level of tables")
            option = lookup(k)
            if option is None:
                raise ConfigError(f"{what}: {path!r}: unknown option {k!r}; keys are {keys}")
            if option.name in flat:
                raise ConfigError(f"{what}: {path!r}: option {option.name!r} is set twice")
            try:
                flat[option.name] = option.kind.check(v)
            except ValueError as exc:
                raise ConfigError(f"{what}: {path!r}: {option.name}: {exc}") from None
    return flat


def option_values(given: dict[str, Any]) -> dict[str, Any]:
    """Every option's default, replaced by ``given`` (option names or aliases)."""
    values = {f.name: f.default for _, f in _option_fields()}
    values.update({canonical(k): v for k, v in given.items()})
    return values


def build_config(command: str, values: dict[str, Any], notes=()) -> RunConfig:
    """The validated ``RunConfig`` of ``command`` from option values by name."""
    sections = {}
    for key, cls in SECTIONS.items():
        kwargs = {f.name: values[f.name] for f in fields(cls) if f.name in values}
        sections[key] = cls(**kwargs)
    return RunConfig(command=command, **sections, notes=tuple(notes))
